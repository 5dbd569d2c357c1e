"""Judge sequence parallelism on the transformer block (Part 8), run alone at a backward check: the
math and the diagnoses.

Rank r of p holds X_r = X[:, r S/p:(r+1) S/p] [B, S/p, d], Part 7's shards (grader.verdict.transformer)
and both LayerNorms whole. With AG the all-gather along the sequence (every rank's slice, rank 0's
first) and RS the reduce-scatter along it (rank r's slice of the sum over the ranks):

    H_r   = X_r + RS(A_r(AG(LN1(X_r))) @ W_o_r)         A_r: rank r's heads, causal   [B, S/p, d]
    out_r = H_r + RS(GeLU(AG(LN2(H_r)) @ W1_r) @ W2_r)                                [B, S/p, d]

AG's backward is a reduce-scatter and RS's an all-gather; the LayerNorms' parameters pass f (their
gradients, each rank's tokens' share, summed over the ranks). So out_r and dX_r are rank r's slices
of the single-device block's, and every other gradient is Part 7's. Backward starts from rank r's
slice of G [B, S, d].

`ranks` computes every rank's values at once, in float64, by autograd over p copies of the block,
joined only where a collective joins them (AG: every copy takes the same concatenation of all the
slices, so the gradient of a slice is the sum of every copy's; RS: copy r takes its slice of the sum).
A usual mistake is the same computation with a collective left out or done wrong (`Mistake`); a
wrong result is held against each in turn, and the one it equals is named. An all-reduce in place
of a reduce-scatter gives the right values: grader.verdict.comm names it from the ranks' calls.
"""

import enum

import torch
import torch.nn.functional as F

from grader.parts.common import as_weight
from grader.results import CheckOutcome, Status
from grader.verdict import transformer
from grader.verdict.compare import by_rank, output_worst
from grader.verdict.judging import Judging
from grader.verdict.say import Say
from grader.verdict.transformer import PARAMETERS, WHAT, Layer, close, seeded, served

__all__ = ["Mistake", "ranks", "judge", "seeded", "served", "SEQUENCE_JUDGING"]


class Mistake(enum.Enum):
    NONE = "none"
    NO_GATHER = "no_gather"                 # no all-gather before the QKV projection (g after W_o instead)
    GATHER_WRONG_DIM = "gather_wrong_dim"   # the gathered [S, B, d] reshaped to [B, S, d], not transposed
    LN_NOT_REDUCED = "ln_not_reduced"       # the LayerNorms' weights' gradients not all-reduced


SAID = {
    Mistake.NO_GATHER: ("each rank attends only its own slice of the sequence: the all-gather along the sequence "
                        "(GatherSequence) must come before the QKV projection, so that every rank's heads see "
                        "every token, and the reduce-scatter (ReduceScatterSequence) after W_o"),
    Mistake.GATHER_WRONG_DIM: ("the all-gathered slices were put back along the wrong dimension: the all-gather "
                               "joins along dimension 0, so it gathers [seq, bsz, d], sequence-first, which must be "
                               "transposed back to [bsz, seq, d], not reshaped to it (that mixes tokens and sequences)"),
    Mistake.LN_NOT_REDUCED: ("the LayerNorms' weight gradients are each rank's own tokens' share only: every rank "
                             "holds the whole LayerNorm but applies it to its slice of the sequence, so the "
                             "gradients of its weight must be all-reduced over the ranks (f on the weight)"),
}
ORDER = (Mistake.NO_GATHER, Mistake.GATHER_WRONG_DIM, Mistake.LN_NOT_REDUCED)   # each the block at one rank


def _gather(parts: list, mistake: Mistake) -> list:
    """AG over the ranks' slices [B, S/p, d]: every rank the same [B, S, d] (its values in a wrong
    order where the sequence-first [S, B, d] was reshaped, not transposed; at one rank there is
    nothing to gather)."""
    joined = torch.cat(parts, dim=1)
    if mistake is Mistake.GATHER_WRONG_DIM and len(parts) > 1:
        joined = joined.transpose(0, 1).reshape(joined.shape)
    return [joined for _ in parts]


def _scatter(parts: list) -> list:
    """RS over the ranks' partial sums [B, S, d]: rank r rows r S/p .. of their sum, [B, S/p, d]."""
    total, p = sum(parts), len(parts)
    s = total.shape[1] // p
    return [total[:, r * s:(r + 1) * s] for r in range(p)]


def _norm(xs: list, weights: tuple, biases: tuple, mistake: Mistake) -> list:
    """Each rank's LayerNorm of its own tokens, its weight and bias passed through f (not the weight
    where that is the mistake)."""
    d = xs[0].shape[-1]
    w = transformer._f(list(weights), mistake is Mistake.LN_NOT_REDUCED)
    b = transformer._f(list(biases), False)
    return [F.layer_norm(x, (d,), w[r], b[r]) for r, x in enumerate(xs)]


def ranks(layer: Layer, p: int, mistake: Mistake = Mistake.NONE) -> list:
    """What every rank of p gives, with `mistake` in the block: [{"output" and "input_grad", its
    slices, and "<name>_grad" for each of PARAMETERS}], rank by rank."""
    d, s = layer.x.shape[-1], layer.x.shape[1] // p
    heads = layer.heads // p
    ones, zeros = torch.ones(d, dtype=layer.x.dtype), torch.zeros(d, dtype=layer.x.dtype)
    mine = [slice(r * s, (r + 1) * s) for r in range(p)]
    leaves = [[t.clone().requires_grad_(True) for t in (layer.x[:, mine[r]], ones, zeros, *shard[:2], ones, zeros,
                                                           *shard[2:])]
              for r, shard in enumerate(transformer._shards(layer, p, transformer.Mistake.NONE))]
    x, n1w, n1b, qkv, wo, n2w, n2b, w1, w2 = zip(*leaves)
    normed = _norm(x, n1w, n1b, mistake)
    if mistake is Mistake.NO_GATHER:   # its own tokens only, and g (an all-reduce) where RS belongs
        attn = transformer._g([transformer._attention(normed[r], qkv[r], heads, layer.head_dim) @ wo[r]
                               for r in range(p)], transformer.Mistake.NONE)
    else:
        full = _gather(normed, mistake)
        attn = _scatter([transformer._attention(full[r], qkv[r], heads, layer.head_dim) @ wo[r] for r in range(p)])
    h = [x[r] + attn[r] for r in range(p)]
    full = _gather(_norm(h, n2w, n2b, mistake), mistake)
    mlp = _scatter([F.gelu(full[r] @ w1[r]) @ w2[r] for r in range(p)])
    out = [h[r] + mlp[r] for r in range(p)]
    torch.autograd.backward(out, [layer.g[:, mine[r]] for r in range(p)])
    said = []
    for r in range(p):
        found = {"output": out[r].detach(), "input_grad": leaves[r][0].grad}
        found.update({f"{name}_grad": leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
                      for name, leaf in zip(PARAMETERS, leaves[r][1:])})
        said.append(found)
    return said


def _named(r, rank: int, layer: Layer, p: int, tol, names: tuple) -> str:
    """The usual mistake whose values rank `rank`'s equal in every tensor of `names`, or ""."""
    for mistake in ORDER if p > 1 else ():
        want = ranks(layer, p, mistake)[rank]
        if all(r.extra.get(n) is not None and close(r.extra[n], want[n], tol) for n in names if n != "output") \
                and ("output" not in names or close(r.weight, want["output"], tol)):
            return SAID[mistake]
    return ""


def _problem(r, rank: int, want: dict, layer: Layer, p: int, tol, say: Say) -> str:
    """What is wrong with rank `rank`'s values (`r`, its RankResult) against `want`, or ""."""
    out = r.weight
    if out.shape != want["output"].shape:
        return ("the block's output has the wrong shape" + ("" if say.hidden else f" {list(out.shape)}") +
                ": a rank returns its own slice of the sequence, [bsz, seq / p, d]")
    if not close(out, want["output"], tol):
        return _named(r, rank, layer, p, tol, ("output",)) or \
            "the rank's slice of the block's output differs from the single-device block's"
    grads = [f"{name}_grad" for name in PARAMETERS]
    if any(r.extra.get(n) is None for n in grads):
        return ("the gradients of the block's parameters did not come back: SequenceParallelBlock's parameters "
                "must be its ParallelTransformerBlock's, in that block's order")
    wrong = [n for n in (*grads, "input_grad") if not as_weight(r.extra[n], want[n], tol, close)]
    if not wrong:
        return ""
    named = _named(r, rank, layer, p, tol, (*grads, "input_grad"))
    if named:
        return named
    what = "X's slice" if wrong[0] == "input_grad" else WHAT[wrong[0].removesuffix("_grad")]
    return f"the gradient of {what} on {say.rank(rank, 'a rank')} differs from the single-device block's"


def judge(run, layer: Layer, part: str, check, tol, say: Say = None, passed=()) -> CheckOutcome:
    """The outcome of the block alone at a backward check: every rank's slices and gradients."""
    say, p = say or Say(check), check.world_size
    want = ranks(layer, p) if run.status == Status.PASSED else []
    return by_rank(run, check, say, lambda rank, r: _problem(r, rank, want[rank], layer, p, tol, say),
                   wrong="sequence parallelism is wrong", worst=output_worst(want),
                   right="every rank's slices and gradients match the single-device block's")


# The part's record names it (grader.parts.sequence_parallel: `judging`).
SEQUENCE_JUDGING = Judging(expected=lambda check, lr, data, part: served(check, data), judge=judge)
