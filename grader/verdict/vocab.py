"""Judge Part 6, the vocabulary split over the ranks, at backward checks: the math and the diagnoses.

For tokens t, targets y [B], an embedding E [V, d] and a head W [d, V], p ranks, rank r holding the
ids [r k, (r + 1) k), k = V / p (E's rows E_r [k, d], W's columns W_r [d, k]):

    x   = sum_r mask_r(t) E_r[t - r k]          [B, d]   the masked lookups, all-reduced (g)
    z_r = x W_r + shift                         [B, k]   rank r's columns of the logits (f before)
    m   = max over every rank's columns of z    [B]      all-reduce(MAX)
    S   = sum_r sum_j exp(z_r - m)              [B]      all-reduce(SUM)
    y_i = z_i,y_i - m_i from its owner          [B]      all-reduce(SUM)
    L   = sum over the n non-padding i of (log S_i - y_i), over n
    dL/dz_r = (exp(z_r - m) / S - onehot_r(y)) / n, 0 on padding rows; dL/dE_r: the rows of
    dL/dx = sum_r dL/dz_r W_r^T (f's all-reduce) of the tokens rank r holds

Everything here is a pure function of the data the ranks were served (grader.rerun.wire.secret.vocab,
each rank's own rows and columns real, noise elsewhere), in float64 in the grader's own process:
`simulate` computes what every rank returns, explicitly, with or without one usual mistake (a
`Mistake`), so that a wrong result is held against each in turn and the one it equals is named.
Without a mistake it is torch's cross_entropy on the full logits (tests/test_vocab_parallel.py).
"""

import dataclasses
import enum
from dataclasses import dataclass

import torch

from grader.parts.common import close
from grader.rerun.wire import secret
from grader.results import CheckOutcome, Status
from grader.verdict.compare import by_rank
from grader.verdict.judging import Judging
from grader.verdict.say import Say


@dataclass
class Data:
    tokens: torch.Tensor      # [B] int64
    targets: torch.Tensor     # [B] int64, secret.IGNORE_INDEX where padding
    embedding: torch.Tensor   # E [V, d] float64
    head: torch.Tensor        # W [d, V] float64
    shift: float = 0.0        # added to every logit


def served(check, data) -> Data:
    """The check's data as the ranks were served it: the real tokens, targets, E and W of `data`
    (the check's protocol.PartSecret), and the check's logit shift."""
    real = secret.vocab(data, dataclasses.asdict(check))
    return Data(real.tokens, real.targets, real.embedding, real.head, float(check.vocab_logit_shift))


class Mistake(enum.Enum):
    NONE = "none"
    LOCAL_MAX = "local_max"                 # each rank subtracts the max of its own columns only
    NO_MAX = "no_max"                       # no max subtracted: exp overflows for logits near 1e4
    MASK_OFF_BY_SLICE = "mask_off_by_slice"  # rank r takes the targets of rank r + 1's slice
    EMBED_UNMASKED = "embed_unmasked"       # other ranks' tokens keep row 0 of the rank's shard
    EMBED_NOT_REDUCED = "embed_not_reduced"  # each rank's own masked lookup used as the embedding
    PADDING_COUNTED = "padding_counted"     # padding's losses summed, the mean over every target
    ONE_HOT_EVERY_RANK = "one_hot_every_rank"  # the one-hot subtracted on ranks that do not hold it
    NO_F = "no_f"                           # the gradient of x: only the rank's own columns' share


SAID = {
    Mistake.LOCAL_MAX: ("each rank subtracts the max of its own columns only: the max must be all-reduced "
                        "(ReduceOp.MAX) so that every rank shifts each token's logits by the same number, "
                        "else the ranks' sums of exponentials do not add up"),
    Mistake.NO_MAX: ("the loss is not finite: exp of logits near 1e4 overflows; subtract each token's max "
                     "over every rank's columns (all-reduced with ReduceOp.MAX) before exp"),
    Mistake.MASK_OFF_BY_SLICE: ("the targets' mask is off by one slice: rank r holds the ids "
                                "[r * V / world_size, (r + 1) * V / world_size), and takes the target's logit "
                                "(and subtracts its one-hot) only for targets in that range"),
    Mistake.EMBED_UNMASKED: ("the embedding's rows of tokens held by other ranks are not zeroed: after the "
                             "lookup at a clamped index, multiply by the mask so that each token comes from "
                             "its owner alone"),
    Mistake.EMBED_NOT_REDUCED: ("the embedding's output is not all-reduced: each rank looked up only its own "
                                "tokens; g must sum the ranks' masked lookups in forward"),
    Mistake.PADDING_COUNTED: ("the loss counts the padding targets (ignore_index): skip them, and divide by "
                              "the number of targets that are not ignore_index"),
    Mistake.ONE_HOT_EVERY_RANK: ("the logits' gradient subtracts the one-hot on every rank: only the rank that "
                                 "holds the target subtracts 1, at the target's own column"),
    Mistake.NO_F: ("the embedding's gradient is only the rank's own columns' share: f (BroadcastParallel) "
                   "must all-reduce the gradient of the embedding's output before the head"),
}
MISTAKES = tuple(m for m in Mistake if m is not Mistake.NONE)


def _embedding(d: Data, p: int, mistake: Mistake) -> tuple:
    """(each rank's x [B, d], each rank's mask of the tokens it holds, their rows in its shard)."""
    k = d.embedding.shape[0] // p
    owned = [(d.tokens >= r * k) & (d.tokens < (r + 1) * k) for r in range(p)]
    local = [torch.where(owned[r], d.tokens - r * k, torch.zeros_like(d.tokens)) for r in range(p)]
    keep = [torch.ones_like(o) if mistake is Mistake.EMBED_UNMASKED else o for o in owned]
    shares = [d.embedding[r * k:(r + 1) * k][local[r]] * keep[r].unsqueeze(-1).double() for r in range(p)]
    total = torch.stack(shares).sum(0)
    return [shares[r] if mistake is Mistake.EMBED_NOT_REDUCED else total for r in range(p)], keep, local


def _shifted(z: list, mistake: Mistake) -> list:
    """Each rank's logits less the max it subtracts."""
    if mistake is Mistake.NO_MAX:
        return z
    if mistake is Mistake.LOCAL_MAX:
        return [zr - zr.max(-1).values.unsqueeze(-1) for zr in z]
    m = torch.stack([zr.max(-1).values for zr in z]).max(0).values.unsqueeze(-1)
    return [zr - m for zr in z]


def simulate(d: Data, p: int, mistake: Mistake = Mistake.NONE) -> list:
    """What each rank r of p returns with `mistake`: [{loss [1], logits_grad [B, V/p], embedding_grad
    [V/p, d]}], in float64 (see the module docstring for the math)."""
    v, k, b = d.embedding.shape[0], d.embedding.shape[0] // p, d.tokens.shape[0]
    xs, keep, rows_of = _embedding(d, p, mistake)
    ws = [d.head[:, r * k:(r + 1) * k] for r in range(p)]
    shifted = _shifted([xs[r] @ ws[r] + d.shift for r in range(p)], mistake)
    start = [(r + (mistake is Mistake.MASK_OFF_BY_SLICE)) * k for r in range(p)]
    owned = [(d.targets >= s) & (d.targets < s + k) & (s < v) for s in start]
    local = [torch.where(owned[r], d.targets - start[r], torch.zeros_like(d.targets)) for r in range(p)]
    picked = sum(torch.where(owned[r], shifted[r].gather(-1, local[r].unsqueeze(-1)).squeeze(-1),
                             torch.zeros(b, dtype=torch.float64)) for r in range(p))
    exps = [s.exp() for s in shifted]
    sums = sum(e.sum(-1) for e in exps)
    valid = torch.ones_like(owned[0]) if mistake is Mistake.PADDING_COUNTED else d.targets != secret.IGNORE_INDEX
    count = valid.sum().clamp(min=1)
    loss = torch.where(valid, sums.log() - picked, torch.zeros(b, dtype=torch.float64)).sum() / count
    grads = []
    for r in range(p):
        g = exps[r] / sums.unsqueeze(-1)
        one_hot = torch.ones(b, dtype=torch.float64) if mistake is Mistake.ONE_HOT_EVERY_RANK else owned[r].double()
        g[torch.arange(b), local[r]] -= one_hot
        grads.append(g * valid.unsqueeze(-1).double() / count)
    dx = sum(grads[r] @ ws[r].T for r in range(p))
    out = []
    for r in range(p):
        gx = grads[r] @ ws[r].T if mistake is Mistake.NO_F else dx
        de = torch.zeros(k, d.embedding.shape[1], dtype=torch.float64)
        de.index_add_(0, rows_of[r], gx * keep[r].unsqueeze(-1).double())
        out.append({"loss": loss.reshape(1), "logits_grad": grads[r], "embedding_grad": de})
    return out


NAMES = {"logits_grad": "the gradient of the rank's logits", "embedding_grad": "the gradient of the rank's embedding rows"}
HINTS = {"logits_grad": "(softmax - one-hot) / the number of non-padding targets, on the rank's own columns",
         "embedding_grad": "the rows of the tokens it holds, of the gradient f all-reduces"}


def _got(r) -> dict:
    """What a rank returned: {loss, logits_grad, embedding_grad}, a missing one None."""
    return {"loss": r.weight, **{n: r.extra.get(n) for n in NAMES}}


def _equals(got: dict, want: dict, tol) -> bool:
    return all(got[n] is not None and close(got[n].double(), want[n], tol) for n in want)


def _problem(got: dict, rank: int, d: Data, p: int, want: dict, tol, say: Say) -> str:
    """What is wrong with rank `rank`'s results, "" when nothing."""
    loss = got["loss"]
    if loss.numel() != 1:
        return "the loss is not a single number: vocab_parallel_loss returns the mean loss first"
    if not bool(torch.isfinite(loss).all()):
        return SAID[Mistake.NO_MAX]
    if _equals(got, want, tol):
        return ""
    for mistake in MISTAKES:
        if _equals(got, simulate(d, p, mistake)[rank], tol):
            return SAID[mistake]
    if not close(loss.double(), want["loss"], tol):
        return "the loss differs from torch's cross_entropy on the full logits"
    for name, what in NAMES.items():
        if got[name] is None:
            return f"{what} did not come back (no gradient reached it: retain_grad on the logits, a Parameter for E_r?)"
        if tuple(got[name].shape) != tuple(want[name].shape):
            return f"{what} has the wrong shape" + ("" if say.hidden else f" {list(got[name].shape)}")
        if not close(got[name].double(), want[name], tol):
            return f"{what} on {say.rank(rank, 'a rank')} differs from the full logits' share: {HINTS[name]}"
    return "the results differ from torch's cross_entropy on the full logits"


def judge(run, d: Data, part: str, check, tol, say: Say = None, passed=()) -> CheckOutcome:
    """The outcome of Part 6 at a backward check: every rank's loss and gradients."""
    say, p = say or Say(check), check.world_size
    want = simulate(d, p) if run.status == Status.PASSED else []
    return by_rank(run, check, say, lambda rank, r: _problem(_got(r), rank, d, p, want[rank], tol, say),
                   wrong="wrong", right="the loss and both gradients match torch's cross_entropy on the full "
                                        "logits on every rank")


# Part 6's record names this (grader.parts.vocab_parallel: `judging`).
JUDGING = Judging(expected=lambda check, lr, data, part: served(check, data), judge=judge)
