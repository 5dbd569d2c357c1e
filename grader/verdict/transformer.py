"""Judge the transformer block in tensor parallel, run alone at a backward check: the math and the
diagnoses.

The block, pre-LayerNorm, for X [B, S, d] (d = n heads of head_dim), on p ranks, rank r holding
the heads [r n/p, (r+1) n/p): its columns of W_q, W_k, W_v (W_qkv_r [d, 3d/p]), the same rows of
W_o (W_o_r [d/p, d]), W1's columns and W2's rows (Part 5's MLP), and both LayerNorms whole:

    A_r = attention of rank r's heads on f(LN1(X)) @ W_qkv_r      [B, S, d/p]   (causal, softmax)
    H   = X + g(A_r @ W_o_r)                                      [B, S, d]
    out = H + g(GeLU(f(LN2(H)) @ W1_r) @ W2_r)                    [B, S, d]

f is the identity forward and all-reduces the gradient backward; g all-reduces forward and is the
identity backward. Backward starts from G [B, S, d] (grader.parts.common.output_gradient).

`ranks` computes every rank's values at once, in float64, by autograd over p copies of the block,
one per rank (its own leaves: X, the LayerNorms, its shards), joined only where a collective joins
the ranks: f and g are written as what they do to values and gradients across the copies. A usual
mistake is the same computation with a collective left out or done wrong, or the shards cut
otherwise (`Mistake`), so its values are exactly those the ranks of such a hand-in give; a wrong
result is held against each in turn, and the one it equals is named. The weights are the ones the
ranks were served (grader.rerun.wire.secret.layer: each rank's own shards real, noise elsewhere), so
only a block whose ranks really communicate passes; `seeded` draws them as the handout does, for
the tests of the reference.

A parameter's gradient is a sum over the B x S tokens, so its values reach B S times an output
gradient's, and a rank's float32 sum of them carries errors of that order: every tensor is compared
at the rubric's tolerance relative to its largest value (`_close`: atol times max(1, max |want|)).
"""

import dataclasses
import enum
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grader.parts.common import as_weight, close as _same, output_gradient
from grader.parts.transformer_block import attention as _attention, qkv_shard   # rank r's heads, before W_o
from grader.rerun.wire import secret
from grader.results import CheckOutcome, Status
from grader.verdict.compare import by_rank, output_worst
from grader.verdict.judging import Judging
from grader.verdict.say import Say

PARAMETERS = ("ln1_weight", "ln1_bias", "qkv", "proj", "ln2_weight", "ln2_bias", "w1", "w2")   # the block's order
WHAT = {"ln1_weight": "the first LayerNorm's weight", "ln1_bias": "the first LayerNorm's bias",
        "qkv": "the rank's QKV shard", "proj": "the rank's rows of W_o", "ln2_weight": "the second LayerNorm's weight",
        "ln2_bias": "the second LayerNorm's bias", "w1": "the rank's shard of W1", "w2": "the rank's shard of W2"}


@dataclass
class Layer:
    x: torch.Tensor       # X [B, S, d]
    weights: tuple        # W_qkv [d, 3d], W_o [d, d], W1 [d, h], W2 [h, d]
    g: torch.Tensor       # the output's gradient [B, S, d]
    heads: int            # n
    head_dim: int
    views: list = None    # rank r's weights as it was served them: real in its own shards only (None: all real)


def _layer(check, x, weights, g, views=None) -> Layer:
    views = [tuple(w.double() for w in view) for view in views] if views else None
    return Layer(x.double(), tuple(w.double() for w in weights), g.double(), check.num_heads, check.head_dim, views)


def seeded(check) -> Layer:
    """The block's weights, X and G at `check`, drawn as the handout draws them (init_block_weights,
    block_batch)."""
    d, h, b, s = check.num_heads * check.head_dim, check.hidden_dim, check.global_batch_size, check.seq_len
    torch.manual_seed(check.seed)
    weights = tuple(torch.randn(*shape) / shape[0] ** 0.5 for shape in ((d, 3 * d), (d, d), (d, h), (h, d)))
    torch.manual_seed(check.seed + 1)
    x = torch.randn(b, s, d)
    return _layer(check, x, weights, torch.randn(b, s, d))


def served(check, data) -> Layer:
    """The block as the ranks of a backward check were served it (grader.rerun.wire.secret.layer): the
    real X and weights of `data` (the check's protocol.PartSecret), and G."""
    sizes = dataclasses.asdict(check)
    real = secret.layer(data, sizes)
    views = [secret.layer(data, sizes, r).weights for r in range(check.world_size)]
    return _layer(check, real.x, real.weights, output_gradient(check.seed, *real.x.shape), views)


def close(got, want, tol) -> bool:
    """`got` matches `want` at the tolerance, its atol scaled by want's largest value (at least 1)."""
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    return _same(got, want, type(tol)(rtol=tol.rtol, atol=tol.atol * scale))


class Mistake(enum.Enum):
    NONE = "none"
    HEADS_NOT_DIVIDED = "heads_not_divided"     # every rank cut its d/p columns into all n heads
    QKV_UNGROUPED = "qkv_ungrouped"             # W_qkv cut as it lies, [Q | K | V], not by heads
    ATTN_NO_G = "attn_no_g"                     # the attention's row-parallel output not all-reduced
    ATTN_NO_F = "attn_no_f"                     # the QKV projection without f: dX of its own heads only
    NO_F = "no_f"                               # f's backward never all-reduces (the attention's nor the MLP's)
    G_BACKWARD_REDUCES = "g_backward_reduces"   # g's backward all-reduces too


SAID = {
    Mistake.HEADS_NOT_DIVIDED: ("the heads are not divided over the ranks: each rank cut its d / world_size columns "
                                "of Q, K and V into all num_heads heads; a rank runs num_heads / world_size heads "
                                "of head_dim features each"),
    Mistake.QKV_UNGROUPED: ("W_qkv's columns were split over the ranks as they lie, [W_q | W_k | W_v], so a rank's "
                            "block is not its heads' Q, K and V: regroup the columns rank by rank (each rank's "
                            "heads' columns of W_q, then of W_k, then of W_v) before the column-parallel layer"),
    Mistake.ATTN_NO_G: ("the attention's output projection (row-parallel, W_o split by rows) was not reduced: each "
                        "rank kept its own heads' partial sum A_r W_o_r; g (ReduceParallel) must all-reduce it"),
    Mistake.ATTN_NO_F: ("each rank's gradient of X through the attention is only its own heads' share: f "
                        "(BroadcastParallel) must come before the QKV projection, to all-reduce that gradient "
                        "in backward"),
    Mistake.NO_F: ("each rank's gradient of X is only its own shards' share, in the attention and in the MLP: f "
                   "(BroadcastParallel) must all-reduce the gradient of its input in backward"),
    Mistake.G_BACKWARD_REDUCES: ("every gradient behind g is world_size times the single-device block's: g "
                                 "(ReduceParallel) must all-reduce in forward only, its backward is the identity"),
}
ORDER = (Mistake.ATTN_NO_G, Mistake.HEADS_NOT_DIVIDED, Mistake.QKV_UNGROUPED, Mistake.G_BACKWARD_REDUCES,
         Mistake.NO_F, Mistake.ATTN_NO_F)   # at one rank each is the right block: tried at p > 1 only


def _g(parts: list, mistake: Mistake, skip: bool = False) -> list:
    """g over the ranks' partial sums: every rank holds their sum; its gradient passes unchanged
    (summed over the ranks, where g's backward all-reduces too). `skip`: no g at all."""
    if skip:
        return parts
    total = sum(parts)
    if mistake is Mistake.G_BACKWARD_REDUCES:
        return [total for _ in parts]
    return [t + (total.detach() - t.detach()) for t in parts]


def _f(inputs: list, skip: bool) -> list:
    """f over the ranks' copies of one input: the same values; each copy's gradient the sum of all
    ranks' (none of the others' where `skip`)."""
    if skip:
        return inputs
    total = sum(inputs)
    return [t.detach() + (total - total.detach()) for t in inputs]


def _shards(layer: Layer, p: int, mistake: Mistake) -> list:
    """[(W_qkv_r, W_o_r, W1_r, W2_r)] for r = 0..p-1, as the ranks cut them (a shard cut otherwise
    than the block's holds what the rank was served there: its own noise, where it is not its own)."""
    qkv, wo, w1, w2 = layer.weights
    if mistake is Mistake.QKV_UNGROUPED:
        qkvs = [(layer.views[r][0] if layer.views else qkv).chunk(p, dim=1)[r] for r in range(p)]
    else:
        qkvs = [qkv_shard(qkv, p, r) for r in range(p)]
    return list(zip(qkvs, wo.chunk(p, dim=0), w1.chunk(p, dim=1), w2.chunk(p, dim=0)))


def block(x: list, params: list, heads: int, head_dim: int, mistake: Mistake = Mistake.NONE) -> list:
    """The block on every rank's copy of its input x [B, S, d] (one per rank), with rank r's
    parameters params[r] (PARAMETERS' order) and `heads` heads of head_dim features on each:
    every rank's output, joined to the others only where f and g join the ranks."""
    p, d = len(x), x[0].shape[-1]
    n1w, n1b, qkv, wo, n2w, n2b, w1, w2 = zip(*params)
    no_f = mistake is Mistake.NO_F
    normed = _f([F.layer_norm(x[r], (d,), n1w[r], n1b[r]) for r in range(p)], no_f or mistake is Mistake.ATTN_NO_F)
    attn = _g([_attention(normed[r], qkv[r], heads, head_dim) @ wo[r] for r in range(p)], mistake,
              skip=mistake is Mistake.ATTN_NO_G)
    h = [x[r] + attn[r] for r in range(p)]
    normed = _f([F.layer_norm(h[r], (d,), n2w[r], n2b[r]) for r in range(p)], no_f)
    mlp = _g([F.gelu(normed[r] @ w1[r]) @ w2[r] for r in range(p)], mistake)
    return [h[r] + mlp[r] for r in range(p)]


def ranks(layer: Layer, p: int, mistake: Mistake = Mistake.NONE) -> list:
    """What every rank of p gives, with `mistake` in the block: [{"output", "input_grad", and
    "<name>_grad" for each of PARAMETERS}], rank by rank."""
    d = layer.x.shape[-1]
    heads = layer.heads if mistake is Mistake.HEADS_NOT_DIVIDED else layer.heads // p
    ones, zeros = torch.ones(d, dtype=layer.x.dtype), torch.zeros(d, dtype=layer.x.dtype)
    leaves = [[t.clone().requires_grad_(True) for t in (layer.x, ones, zeros, *shard[:2], ones, zeros, *shard[2:])]
              for shard in _shards(layer, p, mistake)]
    out = block([leaf[0] for leaf in leaves], [leaf[1:] for leaf in leaves], heads, layer.head_dim, mistake)
    torch.autograd.backward(out, [layer.g] * p)
    said = []
    for r in range(p):
        found = {"output": out[r].detach(), "input_grad": leaves[r][0].grad}
        found.update({f"{name}_grad": leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
                      for name, leaf in zip(PARAMETERS, leaves[r][1:])})
        said.append(found)
    return said


def _possible(layer: Layer, p: int) -> tuple:
    """The usual mistakes that run at all, and differ from the block, at p ranks."""
    if p <= 1:
        return ()
    return tuple(m for m in ORDER if m is not Mistake.HEADS_NOT_DIVIDED or layer.head_dim % p == 0)


def _named(r, rank: int, layer: Layer, p: int, tol, names: tuple) -> str:
    """The usual mistake whose values rank `rank`'s equal in every tensor of `names`, or ""."""
    for mistake in _possible(layer, p):
        want = ranks(layer, p, mistake)[rank]
        if all(r.extra.get(n) is not None and close(r.extra[n], want[n], tol) for n in names if n != "output") \
                and ("output" not in names or close(r.weight, want["output"], tol)):
            return SAID[mistake]
    return ""


def _problem(r, rank: int, want: dict, layer: Layer, p: int, tol, say: Say) -> str:
    """What is wrong with rank `rank`'s values (`r`, its RankResult) against `want`, or ""."""
    out = r.weight
    if out.shape != want["output"].shape:
        return "the block's output has the wrong shape" + ("" if say.hidden else f" {list(out.shape)}")
    if not close(out, want["output"], tol):
        return _named(r, rank, layer, p, tol, ("output",)) or \
            "the block's output differs from the single-device block's, X + Attn(LN1(X)) and then + MLP(LN2(.))"
    grads = [f"{name}_grad" for name in PARAMETERS]
    if any(r.extra.get(n) is None for n in grads):
        return ("the gradients of the block's parameters did not come back: ParallelTransformerBlock's parameters "
                "must be, in this order, ln1's weight and bias, the attention's QKV shard and W_o's rows, ln2's "
                "weight and bias, and the MLP's two shards")
    wrong = [n for n in (*grads, "input_grad") if not as_weight(r.extra[n], want[n], tol, close)]
    if not wrong:
        return ""
    named = _named(r, rank, layer, p, tol, (*grads, "input_grad"))
    if named:
        return named
    first = wrong[0]
    what = "X" if first == "input_grad" else WHAT[first.removesuffix("_grad")]
    return f"the gradient of {what} on {say.rank(rank, 'a rank')} differs from the single-device block's"


def judge(run, layer: Layer, part: str, check, tol, say: Say = None, passed=()) -> CheckOutcome:
    """The outcome of the block alone at a backward check: every rank's output and gradients."""
    say, p = say or Say(check), check.world_size
    want = ranks(layer, p) if run.status == Status.PASSED else []
    return by_rank(run, check, say, lambda rank, r: _problem(r, rank, want[rank], layer, p, tol, say),
                   wrong="the block is wrong", worst=output_worst(want),
                   right="the block's output and gradients match the single-device block's on every rank")


# The part's record names it (grader.parts.transformer_block: `judging`).
BLOCK_JUDGING = Judging(expected=lambda check, lr, data, part: served(check, data), judge=judge)
