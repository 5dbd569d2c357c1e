"""Judge the tiny transformer's step in tensor parallel (Part 7's step checks): the single-device
model's step, in float64, and the diagnoses.

The model, for tokens and targets [B, S] (V ids), E [V, d], L blocks, a final LayerNorm and the LM
head W [d, V], on p ranks, rank r holding E's rows and W's columns of its ids [r V/p, (r+1) V/p)
and each block's shards (grader.verdict.transformer):

    x_r  = E_r[t] where t is its own, else 0;  x = g(x_r)                 [B, S, d]
    x    = block_L(... block_1(x))                                        every rank alike
    z_r  = f(LN(x)) @ W_r                                                 [B S, V/p], never gathered
    loss = mean over the B S tokens of log sum_j exp(z_j) - z_target     Part 6's loss of every z_r
    every parameter P of the rank:  P <- P - lr dloss/dP                  one SGD step

`ranks` computes every rank's values at once, by autograd over p copies of the model, one per rank,
joined only where a collective joins the ranks (transformer._f, _g: the vocabulary's g is Part 6's,
whose backward is the identity); each rank's loss sees the other ranks' logits as constants, so
the gradient of z_r is its own columns of softmax(z) - onehot. At one rank it is the single-device
model's step. A usual mistake is the same computation with a collective left out or the shards cut
otherwise (the block's mistakes, and the step's own: no f before the head); a wrong result is held
against each in turn and the one it equals is named. Logits gathered give the right values: the
ranks' all-gathers are what names that one (`_gathered`).
"""

import dataclasses
import enum
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grader.results import CheckOutcome, Status
from grader.rerun.wire import model_data
from grader.verdict import transformer
from grader.verdict.comm import moved
from grader.verdict.compare import by_rank
from grader.verdict.judging import Judging
from grader.verdict.say import Say
from grader.verdict.transformer import Layer, Mistake as Block, PARAMETERS, WHAT

NAMES = ("embedding", *(f"block_{n}" for n in PARAMETERS), "norm_weight", "norm_bias", "head")


@dataclass
class Model:
    tokens: torch.Tensor     # [B, S] int64
    targets: torch.Tensor    # [B, S] int64
    embedding: torch.Tensor  # E [V, d]
    blocks: list             # transformer.Layer per block: its weights, and each rank's view of them
    head: torch.Tensor       # W [d, V]
    lr: float


class Mistake(enum.Enum):
    NONE = "none"
    HEAD_NO_F = "head_no_f"   # the head's input without f: its gradient only the rank's own columns' share


SAID = {Mistake.HEAD_NO_F: ("the gradient of the head's input is only the rank's own vocabulary columns' share: f "
                            "(BroadcastParallel) must come before the LM head, to all-reduce that gradient in "
                            "backward"),
        "gathered": ("the head's logits were gathered over the ranks (all-gather): the values are right, but the "
                     "logits [B S, V] must never be gathered; vocab_parallel_cross_entropy takes each rank's "
                     "columns [B S, V / p]")}
ORDER = (Mistake.HEAD_NO_F, Block.ATTN_NO_G, Block.HEADS_NOT_DIVIDED, Block.QKV_UNGROUPED, Block.G_BACKWARD_REDUCES,
         Block.NO_F, Block.ATTN_NO_F)   # at one rank each is the right step: tried at p > 1 only


def served(check, lr: float, data) -> Model:
    """The model as the ranks of a step check were served it (grader.rerun.wire.model_data), in float64."""
    sizes = dataclasses.asdict(check)
    real = model_data.model(data, sizes)
    views = [model_data.model(data, sizes, r).blocks for r in range(check.world_size)]
    blocks = [Layer(None, tuple(w.double() for w in weights), None, check.num_heads, check.head_dim,
                    [tuple(w.double() for w in view[i]) for view in views])
              for i, weights in enumerate(real.blocks)]
    return Model(real.tokens, real.targets, real.embedding.double(), blocks, real.head.double(), lr)


def _leaves(m: Model, p: int, mistake) -> list:
    """Every rank's parameters, as leaves, in the order it returns them (model_data's shards)."""
    d, v = m.embedding.shape[1], m.embedding.shape[0] // p
    ones, zeros = torch.ones(d, dtype=m.head.dtype), torch.zeros(d, dtype=m.head.dtype)
    shards = [transformer._shards(b, p, mistake if isinstance(mistake, Block) else Block.NONE) for b in m.blocks]
    per_rank = []
    for r in range(p):
        blocks = [t for layer in shards for t in (ones, zeros, *layer[r][:2], ones, zeros, *layer[r][2:])]
        tensors = (m.embedding[r * v:(r + 1) * v], *blocks, ones, zeros, m.head[:, r * v:(r + 1) * v])
        per_rank.append([t.clone().requires_grad_(True) for t in tensors])
    return per_rank


def ranks(m: Model, p: int, mistake=Mistake.NONE) -> list:
    """What every rank of p gives after the step, with `mistake` (a Mistake, or the block's
    transformer.Mistake) in it: [{"loss": [1], "params": [the updated parameters, in NAMES' order
    per block]}], rank by rank."""
    leaves = _leaves(m, p, mistake)
    v, d = m.embedding.shape[0] // p, m.embedding.shape[1]
    block = mistake if isinstance(mistake, Block) else Block.NONE
    heads = m.blocks[0].heads if block is Block.HEADS_NOT_DIVIDED else m.blocks[0].heads // p
    owned = [(m.tokens >= r * v) & (m.tokens < (r + 1) * v) for r in range(p)]
    x = transformer._g([leaves[r][0][torch.where(owned[r], m.tokens - r * v, 0)] * owned[r].unsqueeze(-1)
                        for r in range(p)], Block.NONE)
    for i in range(len(m.blocks)):
        x = transformer.block(x, [leaves[r][1 + 8 * i:9 + 8 * i] for r in range(p)], heads, m.blocks[0].head_dim, block)
    normed = [F.layer_norm(x[r], (d,), leaves[r][-3], leaves[r][-2]).reshape(-1, d) for r in range(p)]
    normed = transformer._f(normed, mistake is Mistake.HEAD_NO_F or block is Block.NO_F)
    logits = [normed[r] @ leaves[r][-1] for r in range(p)]
    losses = [F.cross_entropy(torch.cat([z if k == r else z.detach() for k, z in enumerate(logits)], dim=1),
                              m.targets.reshape(-1)) for r in range(p)]
    sum(losses).backward()
    return [{"loss": losses[r].detach().reshape(1),
             "params": [(t - m.lr * (t.grad if t.grad is not None else 0)).detach() for t in leaves[r]]}
            for r in range(p)]


def close(got, want, tol) -> bool:
    """`got` matches `want` at the tolerance, its atol scaled by want's largest value (at least 1)."""
    return transformer.close(got, want, tol)


def _flat(params: list) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in params])


def _gathered(r, check) -> bool:
    """Rank `r` all-gathered at least its own columns of the logits, [B S, V / p], beyond what it
    reduce-scattered (a g written as a reduce-scatter and an all-gather, a ring's all-reduce,
    gathers what it scattered: no logits)."""
    share = check.global_batch_size * check.seq_len * check.vocab_size // check.world_size
    p = check.world_size
    return moved(r.comm, "all_gather", p)[1] - moved(r.comm, "reduce_scatter", p)[1] >= share


def _named(r, rank: int, m: Model, p: int, tol, cache: dict) -> str:
    """The usual mistake whose updated parameters rank `rank`'s equal, or ""."""
    for mistake in ORDER if p > 1 else ():
        if mistake is Block.HEADS_NOT_DIVIDED and m.blocks[0].head_dim % p:
            continue
        if mistake not in cache:
            cache[mistake] = ranks(m, p, mistake)
        if close(r.weight, _flat(cache[mistake][rank]["params"]), tol):
            return SAID[mistake] if mistake in SAID else transformer.SAID[mistake]
    return ""


def _what(index: int, blocks: int) -> str:
    """The parameter at `index` of a rank's list, for people."""
    if 1 <= index <= 8 * blocks:
        return f"{WHAT[PARAMETERS[(index - 1) % 8]]} in block {(index - 1) // 8 + 1}"
    return {0: "the rank's rows of E", 8 * blocks + 1: "the final LayerNorm's weight",
            8 * blocks + 2: "the final LayerNorm's bias"}.get(index, "the rank's columns of the head")


def _problem(r, rank: int, want: dict, m: Model, p: int, tol, say: Say, cache: dict) -> str:
    """What is wrong with rank `rank`'s loss and updated parameters (`r`, its RankResult), or ""."""
    flat = _flat(want["params"])
    if r.weight.shape != flat.shape:
        return "the updated parameters have the wrong number of values" + ("" if say.hidden else f" {r.weight.numel()}")
    loss = r.extra.get("loss")
    if close(r.weight, flat, tol) and loss is not None and close(loss.reshape(-1), want["loss"], tol):
        return ""
    named = _named(r, rank, m, p, tol, cache)
    if named:
        return named
    if loss is None or not close(loss.reshape(-1), want["loss"], tol):
        return "the loss differs from the single-device model's (the mean cross-entropy of its logits)"
    start = 0
    for index, t in enumerate(want["params"]):
        if not close(r.weight[start:start + t.numel()], t.reshape(-1), tol):
            break
        start += t.numel()
    return (f"the updated {_what(index, len(m.blocks))} on {say.rank(rank, 'a rank')} differs from the "
            f"single-device model's step")


def judge(run, m: Model, part: str, check, tol, say: Say = None, passed=()) -> CheckOutcome:
    """The outcome of the tiny transformer's step at a step check: every rank's loss and parameters;
    when every rank's values are right, a rank that gathered what it should not is wrong still."""
    say, p, cache = say or Say(check), check.world_size, {}
    want = ranks(m, p) if run.status == Status.PASSED else []

    def worst(rank, r):
        flat = _flat(want[rank]["params"])
        return float((r.weight - flat).abs().max()) if r.weight.shape == flat.shape else None

    def gathered(rank, r):
        return SAID["gathered"] if _gathered(r, check) else ""
    said = dict(wrong="the step is wrong", worst=worst,
                right="the loss and the updated parameters match the single-device model's step on every rank")
    outcome = by_rank(run, check, say, lambda rank, r: _problem(r, rank, want[rank], m, p, tol, say, cache), **said)
    if outcome.status == Status.PASSED and p > 1:
        outcome = by_rank(run, check, say, gathered, **said)
    return outcome


# The part's record names it (grader.parts.transformer_block: `judging`).
STEP_JUDGING = Judging(expected=lambda check, lr, data, part: served(check, lr, data), judge=judge)
