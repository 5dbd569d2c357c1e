"""Judge Part 5, Megatron's MLP block, at step and backward checks: the math and the diagnoses.

The block, for X [B, d], W1 [d, h], W2 [h, d] split over p ranks (W1 by columns, W2 by rows):

    H_r = X @ W1_r                 [B, h / p]   (f: identity forward; all-reduce of dX backward)
    Z_r = GeLU(H_r) @ W2_r         [B, d]       rank r's partial sum
    Z   = sum_r Z_r                [B, d]       (g: all-reduce forward; identity backward)
    L   = 1/(B d) sum (Z - Y)^2    the MSE loss; one SGD step: W <- W - lr dL/dW on every shard

Everything here is a pure function of (W1, W2, X, Y or G, lr, p), in float64 in the grader's own
process, from the secret data the ranks were served (grader.rerun.wire.secret): `stepped` at a step
check (each rank's seed draws its own full W1 and W2, real in its own shards only), `served` at a
backward check (each rank's own shards real, noise elsewhere), so only a block whose ranks really
all-reduce and gather passes either; a step taken whole on one rank, from its own full copy, is
named as such. (`seeded` draws the block as the handout does, for the tests of the reference.)
No collective a rank reports passes anything (grader.verdict.comm fails the block's right values
without g's and f's all-reduces and the gathers). Each usual mistake is a `Mistake`,
the block computed the way that mistake computes it; a wrong result is held against each in turn,
and the one it equals is named. Gradients come from autograd on the float64 block, the mistake's
graph and all: rank r's loss is the one its own output gives, and it steps its own shards only.
"""

import enum
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from grader.parts.common import as_weight, close, output_gradient
from grader.rerun.wire import secret
from grader.results import CheckOutcome, Status
from grader.verdict.compare import by_rank, collectives, unfinished, weight_digest
from grader.verdict.judging import Judging
from grader.verdict.say import Say


@dataclass
class Block:
    w1: torch.Tensor      # W1 [d, h]
    w2: torch.Tensor      # W2 [h, d]
    x: torch.Tensor       # X [B, d]
    y: torch.Tensor       # the targets [B, d] (a step check)
    g: torch.Tensor       # the output's gradient [B, d] (a backward check)
    lr: float
    copies: dict = field(default_factory=dict)   # rank -> (W1, W2): the full weights its own seed drew


def seeded(check, lr: float) -> Block:
    """The block's weights, batch and output gradient at `check`, drawn as the handout draws them
    (init_mlp_weights, create_batch(B, d, d, seed)) and as the rank draws G (grader.parts.common)."""
    d, h, b = check.input_dim, check.hidden_dim, check.global_batch_size
    gen = torch.Generator().manual_seed(check.seed)
    w1 = torch.randn(d, h, generator=gen) / d ** 0.5
    w2 = torch.randn(h, d, generator=gen) / h ** 0.5
    gen = torch.Generator().manual_seed(check.seed)   # create_batch seeds again before drawing
    x = torch.randn(b, d, generator=gen)
    y = torch.randn(b, d, generator=gen)
    g = output_gradient(check.seed, b, d)
    return Block(*(t.double() for t in (w1, w2, x, y, g)), lr=lr)


def served(check, lr: float, data) -> Block:
    """The block of a backward check as the ranks were served it (grader.rerun.wire.secret.block): the
    real X, W1 and W2 of `data` (the check's protocol.PartSecret), and G."""
    b, d, h = check.global_batch_size, check.input_dim, check.hidden_dim
    x, w1, w2 = secret.block(data, b, d, h)
    g = output_gradient(check.seed, b, d)
    return Block(*(t.double() for t in (w1, w2, x, torch.zeros(b, d), g)), lr=lr)


def stepped(check, lr: float, data) -> Block:
    """The block of a step check as its ranks were served it (grader.rerun.wire.secret.mlp_step): the
    real X, Y, W1 and W2 of `data` (the check's protocol.PartSecret), and each rank's own copy."""
    b, d, h = check.global_batch_size, check.input_dim, check.hidden_dim
    x, y, w1, w2 = secret.mlp_step(data, b, d, h)
    copies = {r: tuple(w.double() for w in secret.mlp_weights(seed, d, h)) for r, seed in enumerate(data.blocks)}
    return Block(*(t.double() for t in (w1, w2, x, y, torch.zeros(b, d))), lr=lr, copies=copies)


class Mistake(enum.Enum):
    NONE = "none"
    NO_G = "no_g"                           # each rank's partial sum Z_r used as the output
    NO_F = "no_f"                           # dX: only rank r's own path (its columns of W1)
    GELU_AFTER_REDUCE = "gelu_after_reduce"         # GeLU(sum_r H_r W2_r): moved after g
    GELU_AFTER_REDUCE_TOO = "gelu_after_reduce_too"  # GeLU(sum_r GeLU(H_r) W2_r): again after g
    GELU_ON_PARTIALS = "gelu_on_partials"           # sum_r GeLU(H_r W2_r): on each partial sum
    GELU_ON_PARTIALS_TOO = "gelu_on_partials_too"   # sum_r GeLU(GeLU(H_r) W2_r)
    G_BACKWARD_REDUCES = "g_backward_reduces"       # g's backward all-reduces: p x every gradient behind it


SAID = {
    Mistake.NO_G: ("each rank used its own partial sum GeLU(X W1_r) W2_r as the block's output: g "
                   "(ReduceParallel) must all-reduce the row-parallel layer's output in forward"),
    Mistake.NO_F: ("each rank's gradient of X is only its own columns' share: f (BroadcastParallel, "
                   "copy to the model-parallel region) must all-reduce the gradient of X in backward"),
    Mistake.GELU_AFTER_REDUCE: ("GeLU is applied after the all-reduce, GeLU(X W1 W2): it belongs between "
                                "the layers, on each rank's columns X W1_r"),
    Mistake.GELU_AFTER_REDUCE_TOO: ("GeLU is applied again after the all-reduce: the block is "
                                    "GeLU(X W1) W2, with nothing after g"),
    Mistake.GELU_ON_PARTIALS: ("GeLU is applied to each rank's partial sum X W1_r W2_r before g: it is not "
                               "linear, so a sum of GeLUs is not the GeLU of the sum; it belongs on X W1_r"),
    Mistake.GELU_ON_PARTIALS_TOO: ("an activation is applied to each rank's partial sum before g as well: "
                                   "the row-parallel layer must hand its partial sums to g untouched"),
    Mistake.G_BACKWARD_REDUCES: ("every gradient behind g (of W1's and W2's shards, and of X) is world_size times "
                                 "the single-device block's: g (ReduceParallel) must all-reduce in forward only; "
                                 "its backward is the identity, as every rank already holds the output's whole "
                                 "gradient"),
}
STEP_MISTAKES = (Mistake.NO_G, Mistake.GELU_AFTER_REDUCE, Mistake.GELU_AFTER_REDUCE_TOO,
                 Mistake.GELU_ON_PARTIALS, Mistake.GELU_ON_PARTIALS_TOO, Mistake.G_BACKWARD_REDUCES)
SEVERAL_RANKS = (Mistake.NO_G, Mistake.G_BACKWARD_REDUCES)   # at one rank, the same block as the right one


def shards(w1, w2, p: int) -> tuple:
    """([W1_r] by columns, [W2_r] by rows), r = 0..p-1."""
    return list(torch.chunk(w1, p, dim=1)), list(torch.chunk(w2, p, dim=0))


def outputs(x, w1s, w2s, mistake: Mistake = Mistake.NONE, rank: int = 0) -> torch.Tensor:
    """The output rank `rank` computes (and backpropagates from) when the block has `mistake`."""
    gelu_hidden = mistake not in (Mistake.GELU_AFTER_REDUCE, Mistake.GELU_ON_PARTIALS)
    partials = []
    for r, (w1, w2) in enumerate(zip(w1s, w2s)):
        xr = x if mistake is not Mistake.NO_F or r == rank else x.detach()   # no f: one path to X
        hidden = xr @ w1
        partial = (F.gelu(hidden) if gelu_hidden else hidden) @ w2
        if mistake in (Mistake.GELU_ON_PARTIALS, Mistake.GELU_ON_PARTIALS_TOO):
            partial = F.gelu(partial)
        partials.append(partial)
    if mistake is Mistake.NO_G:
        return partials[rank]
    total = torch.stack(partials).sum(0)
    if mistake in (Mistake.GELU_AFTER_REDUCE, Mistake.GELU_AFTER_REDUCE_TOO):
        total = F.gelu(total)
    if mistake is Mistake.G_BACKWARD_REDUCES:   # the same value; its gradient summed over p ranks
        total = len(w1s) * total - (len(w1s) - 1) * total.detach()
    return total


def _leaves(b: Block, p: int) -> tuple:
    w1s, w2s = shards(b.w1, b.w2, p)
    return (b.x.clone().requires_grad_(True), [w.clone().requires_grad_(True) for w in w1s],
            [w.clone().requires_grad_(True) for w in w2s])


def step(b: Block, p: int, mistake: Mistake = Mistake.NONE) -> tuple:
    """(W1', W2'), the full weights gathered after rank r stepped its own shards on the loss of its
    own output, with `mistake` in the block."""
    x, w1s, w2s = _leaves(b, p)
    new1, new2 = [], []
    for r in range(p):
        out = outputs(x, w1s, w2s, mistake, r)
        loss = ((out - b.y) ** 2).mean()
        g1, g2 = torch.autograd.grad(loss, [w1s[r], w2s[r]], allow_unused=True)
        new1.append(w1s[r].detach() - b.lr * (g1 if g1 is not None else 0))
        new2.append(w2s[r].detach() - b.lr * (g2 if g2 is not None else 0))
    return torch.cat(new1, dim=1), torch.cat(new2, dim=0)


def backward(b: Block, p: int, rank: int, mistake: Mistake = Mistake.NONE) -> dict:
    """What rank `rank` of the block alone gives at a backward check, with `mistake` in it: output,
    input_grad, w1_grad [d, h / p], w2_grad [h / p, d] (backward starts from G)."""
    x, w1s, w2s = _leaves(b, p)
    out = outputs(x, w1s, w2s, mistake, rank)
    grads = torch.autograd.grad(out, [x, w1s[rank], w2s[rank]], b.g, allow_unused=True)
    zero = [torch.zeros_like(t) for t in (x, w1s[rank], w2s[rank])]
    gx, g1, g2 = (g if g is not None else z for g, z in zip(grads, zero))
    return {"output": out.detach(), "input_grad": gx, "w1_grad": g1, "w2_grad": g2}


# --- a step check ---------------------------------------------------------------------------------

def _whole_step(w1, w2, b: Block, p: int, tol, rank: int, say: Say) -> str:
    """The weights are the single-device step of one rank's own full copy of W1 and W2: "" if not."""
    for k in sorted(b.copies, key=lambda k: k != rank):   # its own copy first
        alone = step(replace(b, w1=b.copies[k][0], w2=b.copies[k][1]), 1)
        if close(w1, alone[0], tol) and close(w2, alone[1], tol):
            whose = "its own" if k == rank else f"{say.rank(k, 'another rank')}'s"
            return (f"the weights are the single-device MLP's step on {whose} full W1 and W2, taken whole on "
                    f"one rank: at grading a rank's seed draws weights that are real in its own shards only "
                    f"(W1's columns, W2's rows), so every rank must step its shards in MegatronMLP, g must "
                    f"sum the ranks' partial outputs, and the updated shards must be gathered")
    return ""


def _step_diagnosis(w1, w2, b: Block, p: int, tol, expected: tuple, rank: int = 0, say: Say = None) -> str:
    d, h = b.w1.shape
    if p > 1 and w2.shape == (h // p, p * d) and w1.shape == b.w1.shape:
        rows = torch.cat(torch.split(w2, d, dim=1), dim=0)
        if close(rows, expected[1], tol):
            return ("W2's updated shards were put side by side as columns (torch.cat(..., dim=1), as Part 4 "
                    "gathers W): a row-parallel layer's shards are blocks of W2's rows; concatenate along dim 0")
    if w1.shape != b.w1.shape or w2.shape != b.w2.shape:
        return ("the returned weights have the wrong shapes: (W1, W2) must be [input_dim, hidden_dim] and "
                "[hidden_dim, input_dim]")
    if close(w1, b.w1, tol) and close(w2, b.w2, tol):
        return "neither weight changed: no step was taken (optimizer.step() after loss.backward()?)"
    if p > 1 and b.copies:
        whole = _whole_step(w1, w2, b, p, tol, rank, say or Say())
        if whole:
            return whole
    for mistake in STEP_MISTAKES:
        if p == 1 and mistake in SEVERAL_RANKS:
            continue
        want1, want2 = step(b, p, mistake)
        if close(w1, want1, tol) and close(w2, want2, tol):
            return SAID[mistake]
    if close(w1, expected[0], tol):
        return "W1 is right but W2 is not: check RowParallelLinear (its rows of W2) and how W2's shards are gathered"
    if close(w2, expected[1], tol):
        return "W2 is right but W1 is not: check ColumnParallelLinear (its columns of W1) and how W1's shards are gathered"
    return "both weights differ from the single-device MLP's step, and from every usual mistake's"


def _opened(run, check, say: Say) -> CheckOutcome:
    """The outcome of a run that did not finish; else a passed one for the judge to fill in."""
    if run.status != Status.PASSED:
        return unfinished(run, check, say)
    return CheckOutcome(check=check.name, hidden=check.hidden, world_size=check.world_size, status=Status.PASSED,
                        message="", collectives=collectives(run.ranks))


def judge_step(run, b: Block, part: str, check, tol, say: Say = None, passed=()) -> CheckOutcome:
    """The outcome of Part 5 at a step check: both gathered weights on every rank."""
    say = say or Say(check)
    outcome = _opened(run, check, say)
    if outcome.status != Status.PASSED:
        return outcome
    p = check.world_size
    want = step(b, p)
    worst, failing = 0.0, []
    for rank, r in sorted(run.ranks.items()):
        w1, w2 = r.weight, r.extra.get("w2")
        if w2 is None or w1.shape != want[0].shape or w2.shape != want[1].shape \
                or not (torch.isfinite(w1).all() and torch.isfinite(w2).all()):
            worst = float("inf")
            failing.append(rank)
            continue
        worst = max(worst, float((w1 - want[0]).abs().max()), float((w2 - want[1]).abs().max()))
        if not (close(w1, want[0], tol) and close(w2, want[1], tol)):
            failing.append(rank)
    outcome.max_abs_diff, outcome.failing_ranks = worst, failing
    if failing:
        first = run.ranks[failing[0]]
        w2 = first.extra.get("w2")
        outcome.status = Status.FAILED
        outcome.diagnosis = ("returned no W2: megatron_mlp_single_step returns (updated_w1, updated_w2)"
                             if w2 is None else _step_diagnosis(first.weight, w2, b, p, tol, want, failing[0], say))
        outcome.weight_digest = weight_digest(run.ranks)
        outcome.message = f"wrong weights on {say.ranks(failing, len(run.ranks))}: {outcome.diagnosis}"
    else:
        outcome.message = ("matches the single-device MLP's step on every rank" if check.hidden or p == 1
                           else f"matches the single-device MLP's step on all {p} ranks")
    return outcome


# --- a backward check -----------------------------------------------------------------------------

def _backward_problem(r, rank: int, b: Block, p: int, tol, say: Say) -> str:
    want = backward(b, p, rank)
    out = r.weight
    if out.shape != want["output"].shape:
        return "the block's output has the wrong shape" + ("" if say.hidden else f" {list(out.shape)}")
    if not close(out, want["output"], tol):
        for mistake in STEP_MISTAKES:
            if (p > 1 or mistake is not Mistake.NO_G) and close(out, backward(b, p, rank, mistake)["output"], tol):
                return SAID[mistake]
        return "the block's output differs from GeLU(X W1) W2, the single-device block's"
    reduced = backward(b, p, rank, Mistake.G_BACKWARD_REDUCES) if p > 1 else {}
    if reduced and all(r.extra.get(n) is not None and close(r.extra[n], reduced[n], tol)
                       for n in ("w1_grad", "w2_grad", "input_grad")):
        return SAID[Mistake.G_BACKWARD_REDUCES]
    for name, what in (("w1_grad", "W1's shard"), ("w2_grad", "W2's shard")):
        got = r.extra.get(name)
        if got is None:
            return (f"the gradient of {what} did not come back: MegatronMLP's parameters must be its two "
                    f"shards, fc1's then fc2's")
        if not as_weight(got, want[name], tol):
            return (f"the gradient of {what} on {say.rank(rank, 'a rank')} differs from the single-device "
                    f"block's share: check which {'columns' if name == 'w1_grad' else 'rows'} the rank holds")
    got = r.extra.get("input_grad")
    if got is None:
        return "X got no gradient: the block cut X off the autograd graph (a detach() or a copy without grad?)"
    if close(got, want["input_grad"], tol):
        return ""
    if p > 1 and close(got, backward(b, p, rank, Mistake.NO_F)["input_grad"], tol):
        return SAID[Mistake.NO_F]
    if p > 1 and close(got, p * want["input_grad"], tol):
        return (f"the gradient of X is {say.eq(p, 'world_size')} times the single-device block's: g's "
                f"backward must be the identity, not an all-reduce")
    return "the gradient of X differs from the single-device block's"


def judge_backward(run, b: Block, part: str, check, tol, say: Say = None, passed=()) -> CheckOutcome:
    """The outcome of Part 5's block alone at a backward check."""
    say, p = say or Say(check), check.world_size
    return by_rank(run, check, say, lambda rank, r: _backward_problem(r, rank, b, p, tol, say),
                   wrong="the block is wrong",
                   right="the block's output and gradients match the single-device block's on every rank")


# Part 5's record names these (grader.parts.megatron_mlp: `judging`).
STEP_JUDGING = Judging(expected=lambda check, lr, data, part: stepped(check, lr, data), judge=judge_step)
BACKWARD_JUDGING = Judging(expected=lambda check, lr, data, part: served(check, lr, data), judge=judge_backward)
