"""Part 7 (optional), a transformer block in tensor parallel: the attention's heads split over the
ranks, Part 5's MLP, LayerNorm replicated.

A course turns it on by giving it points in its rubric, with Part 5 on too (`needs`): the block is
built of Part 5's ColumnParallelLinear, RowParallelLinear and MegatronMLP. Its checks read the
rubric's num_heads, head_dim and seq_len (its own sizes), and Part 5's hidden_dim.

At a backward check the block `ParallelTransformerBlock(W_qkv, W_o, W1, W2, world_size, rank)` runs
alone (`forward_and_backward`) on X [B, S, d] (d = num_heads * head_dim), handed weights real only
in its own shards (LAYER: its heads' columns of W_q, W_k and W_v, the same rows of W_o, its shards
of W1 and W2), its backward started from G [B, S, d]. The output, the gradient of X and the
gradient of every parameter of the rank (both LayerNorms', its shards') are judged, and the usual
mistakes named, by grader.verdict.transformer: the heads not divided over the ranks, W_qkv's
columns not regrouped by head, the attention's row-parallel output not reduced (no g), the QKV
projection without f. Dropout is 0 at every check, so the values are deterministic.

At a step check a tiny transformer takes one SGD step: `transformer_single_step(tokens, targets,
embedding, blocks, head, world_size, rank)` (Part 6's vocabulary-parallel embedding, the check's
num_layers blocks, a final LayerNorm, the LM head split by vocabulary columns and Part 6's loss;
`needs` Part 6 too), handed every weight real only in its own shards (MODEL,
grader.rerun.wire.model_data). The rank sends back its loss and its updated shards, flattened in the
order of STEP_SHAPES (`stepped`): never more than the model's weights, the logits [B S, V] never.
grader.verdict.transformer_step takes the single-device model's step and names the usual mistakes.
"""

from grader.parts import BACKWARD, STEP, B, Moves, Part, megatron_mlp, vocab_parallel
from grader.parts.common import HIDDEN_DIM, LAYER, MODEL, alone_should, run_alone

# The block's parameters in the order it registers them, as the rank sends their gradients back.
import math

PARAMETERS = ("ln1_weight", "ln1_bias", "qkv", "proj", "ln2_weight", "ln2_bias", "w1", "w2")
TOKENS = (B, "seq_len", "num_heads", "head_dim")   # B x S x d: an activation of the block
DEFAULTS = {"num_heads": 4, "head_dim": 8, "seq_len": 8, "hidden_dim": HIDDEN_DIM, "num_layers": 2,
            "vocab_size": vocab_parallel.VOCAB_SIZE}   # the rubric's: a mapping without them


def size(check: dict, key: str) -> int:
    """One of the block's sizes of a job's check mapping (the rubric's default where it has none)."""
    return int(check.get(key) or DEFAULTS[key])


def width(check: dict) -> int:
    """The block's width d = num_heads * head_dim."""
    return size(check, "num_heads") * size(check, "head_dim")


def forward_and_backward(module, call, check: dict, data) -> dict:
    """The hand-in's block run alone on every rank on `data` (a grader.rerun.wire.secret.PartData: x
    [B, S, d], and the weights real in the rank's own shards), backward started from G [B, S, d]:

        output          the block's output, [B, S, d] on every rank
        input_grad      the gradient of X, [B, S, d] on every rank
        <name>_grad     the gradient of each of its parameters (PARAMETERS), in the order the block
                        registers them: the LayerNorms' [d], the rank's QKV shard [d, 3d / p] (its
                        heads' Q, K, V columns), W_o's rows [d / p, d], W1's columns [d, h / p], W2's
                        rows [h / p, d]
    """
    tensors, block = run_alone(module, "ParallelTransformerBlock", data.weights, data.x, check, width(check))
    params = list(block.parameters()) if block is not None else []
    if len(params) == len(PARAMETERS) and all(p.grad is not None for p in params):
        tensors.update({f"{name}_grad": p.grad.detach().clone() for name, p in zip(PARAMETERS, params)})
    return tensors


STEP_FUNCTION = "transformer_single_step"


def step_shapes(check: dict, p: int) -> list:
    """The shapes of rank r's parameters of the tiny transformer, in the order it returns them:
    E_r [V/p, d], each block's eight (PARAMETERS), the final LayerNorm's weight and bias [d], W_r [d, V/p]."""
    d, h, v = width(check), size(check, "hidden_dim"), size(check, "vocab_size")
    block = [(d,), (d,), (d, 3 * d // p), (d // p, d), (d,), (d,), (d, h // p), (h // p, d)]
    return [(v // p, d)] + block * size(check, "num_layers") + [(d,), (d,), (d, v // p)]


def stepped(module, call, check: dict, data) -> dict:
    """The hand-in's step on every rank, on `data` (grader.rerun.wire.model_data: tokens, targets, and
    the weights real in the rank's own shards): {"weight": its updated parameters flattened one
    after another in the order of step_shapes, "loss": [1]}."""
    import torch
    import torch.distributed as dist
    function = getattr(module, STEP_FUNCTION, None)
    if not callable(function):
        raise TypeError(f"assignment4.py has no function {STEP_FUNCTION}()")
    p = dist.get_world_size()
    value = function(data.tokens, data.targets, data.embedding, data.blocks, data.head, p, dist.get_rank())
    if not isinstance(value, (tuple, list)) or len(value) != 2 or not isinstance(value[0], torch.Tensor) or \
            not isinstance(value[1], (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in value[1]):
        raise TypeError(f"{STEP_FUNCTION} returned {type(value).__name__}, not (loss, the list of the rank's "
                        f"updated parameters)")
    loss, params = value
    params = _as_shards(params, step_shapes(check, p), _given(data, check, p, dist.get_rank()))
    if params is None:
        raise TypeError(f"{STEP_FUNCTION} returned parameters that are not the rank's shards: E's rows, each "
                        f"block's eight parameters, the final LayerNorm's weight and bias, the head's columns")
    return {"weight": torch.cat([t.detach().reshape(-1).double() for t in params]),
            "loss": loss.detach().reshape(-1).double()}


def qkv_shard(qkv, p: int, r: int):
    """Rank r's shard of W_qkv [d, 3d] = [W_q | W_k | W_v]: its heads' columns of each, side by side
    [Q_r | K_r | V_r], [d, 3d / p]."""
    import torch
    d = qkv.shape[1] // 3
    cols = d // p
    return torch.cat([qkv[:, j * d + r * cols:j * d + (r + 1) * cols] for j in range(3)], dim=1)


def _given(data, check: dict, p: int, r: int) -> list:
    """Rank r's shards of the weights it was handed, in the order of step_shapes (None for the
    LayerNorms'): E's rows, each block's QKV columns of its heads [Q_r | K_r | V_r], W_o's rows,
    W1's columns and W2's rows, the head's columns."""
    d, share, vocab = width(check) // p, size(check, "hidden_dim") // p, size(check, "vocab_size") // p
    given = [data.embedding[r * vocab:(r + 1) * vocab]]
    for qkv, wo, w1, w2 in data.blocks:
        given += [None, None, qkv_shard(qkv, p, r), wo[r * d:(r + 1) * d], None, None,
                  w1[:, r * share:(r + 1) * share], w2[r * share:(r + 1) * share]]
    return given + [None, None, data.head[:, r * vocab:(r + 1) * vocab]]


def _as_shards(params: list, shapes: list, given: list):
    """The returned parameters as the skeleton holds them, or None where they are not the rank's
    shards. A layer built on nn.Linear holds its weight [out, in], the skeleton's transposed: such a
    parameter is taken transposed. A square one's shape cannot tell: it is taken the way that lies
    nearer the shard it was handed (one step moves a weight little; the values are judged after)."""
    if len(params) != len(shapes):
        return None
    out = []
    for t, shape, start in zip(params, shapes, given):
        if tuple(t.shape) == shape and not (t.dim() == 2 and shape[0] == shape[1] and start is not None):
            out.append(t)
        elif t.dim() == 2 and tuple(t.shape) == shape[::-1] and shape[0] != shape[1]:
            out.append(t.T)
        elif t.dim() == 2 and tuple(t.shape) == shape:   # square
            t = t.detach().float()
            out.append(t.T if (t.T - start).norm() < (t - start).norm() else t)
        else:
            return None
    return out


def attention(x, qkv, heads: int, head_dim: int):
    """`heads` causal heads of head_dim features on x [B, S, d] with a QKV shard [d, 3 heads head_dim]
    ([Q_r | K_r | V_r]): [B, S, heads head_dim], before W_o."""
    import torch
    b, s, _ = x.shape
    q, k, v = (x @ qkv).reshape(b, s, 3, heads, -1).permute(2, 0, 3, 1, 4)
    future = torch.ones(s, s, dtype=torch.bool).triu(1)
    weights = (q @ k.transpose(-2, -1) / head_dim ** 0.5).masked_fill(future, float("-inf")).softmax(dim=-1)
    return (weights @ v).transpose(1, 2).reshape(b, s, -1)


def taps(x, weights: tuple, p: int, heads: int, head_dim: int) -> tuple:
    """The block on x [B, S, d] (a tensor autograd tracks) with weights (W_qkv, W_o, W1, W2) whole,
    its LayerNorms fresh, as one device computes it, with each rank's part of it apart: (the output,
    {"n1", "h", "n2": LN1(x), H, LN2(H); "in1", "in2": each rank's copy of LN1(x) and LN2(H), whose
    gradient is its share of what f all-reduces; "attn", "mlp": each rank's partial output, what g
    all-reduces}). Each keeps its gradient once the output's backward has run."""
    import torch.nn.functional as F
    qkv, wo, w1, w2 = weights
    d, rows, cols = x.shape[-1], wo.shape[0] // p, w1.shape[1] // p
    n1 = F.layer_norm(x, (d,))
    in1 = [n1.clone() for _ in range(p)]
    attn = [attention(in1[r], qkv_shard(qkv, p, r), heads // p, head_dim) @ wo[r * rows:(r + 1) * rows]
            for r in range(p)]
    h = x + sum(attn)
    n2 = F.layer_norm(h, (d,))
    in2 = [n2.clone() for _ in range(p)]
    mlp = [F.gelu(in2[r] @ w1[:, r * cols:(r + 1) * cols]) @ w2[r * cols:(r + 1) * cols] for r in range(p)]
    for t in (n1, h, n2, *in1, *in2):
        t.retain_grad()
    return h + sum(mlp), {"n1": n1, "h": h, "n2": n2, "in1": in1, "in2": in2, "attn": attn, "mlp": mlp}


def ways(t) -> tuple:
    """An activation's right forms, [B, S, d] or sequence-first [S, B, d] (Megatron-LM's layout)."""
    t = t.detach()
    return t, t.transpose(0, 1)


def f_share(before, grad) -> tuple:
    """The forms of a rank's share `grad` of the gradient of LN(before) that f all-reduces: f after
    the LayerNorm (the reference's), or before it (the share carried back through it)."""
    import torch
    import torch.nn.functional as F
    leaf = before.detach().clone().requires_grad_(True)
    back = torch.autograd.grad(F.layer_norm(leaf, (leaf.shape[-1],)), leaf, grad.reshape(leaf.shape))[0]
    return ways(grad.reshape(leaf.shape)) + ways(back)


def _each(tapped: list, rank: int) -> tuple:
    """Per block (a list: every block's call carried), what rank `rank`'s g and f carry: the
    attention's partial outputs, the MLP's, its share of the gradient of the MLP's input, of the
    attention's."""
    return ([ways(t["attn"][rank]) for _, t in tapped], [ways(t["mlp"][rank]) for _, t in tapped],
            [f_share(t["h"], t["in2"][rank].grad) for _, t in tapped],
            [f_share(x, t["in1"][rank].grad) for x, t in tapped])


def carried_backward(exp, check, rank: int) -> list:
    """What rank `rank`'s all-reduces carry at a backward check (exp: grader.verdict.transformer's
    Layer), the block's backward started from G: its partial outputs (g), its shares of the
    gradients of the normalized inputs (f), in the order of the part's moves."""
    x = exp.x.clone().requires_grad_(True)
    out, t = taps(x, exp.weights, check.world_size, exp.heads, exp.head_dim)
    out.backward(exp.g)
    return [found[0] for found in _each([(x, t)], rank)]


def carried_step(exp, check, rank: int) -> list:
    """...and at a step (exp: grader.verdict.transformer_step's Model): its masked lookups (g), each
    block's four, its share of the gradient of the head's input (f), and Part 6's loss_forms."""
    import torch
    import torch.nn.functional as F
    p, d = check.world_size, exp.embedding.shape[1]
    k = exp.embedding.shape[0] // p
    mine = vocab_parallel.lookups(exp.tokens, exp.embedding, p)
    x, tapped = sum(mine).requires_grad_(True), []
    for layer in exp.blocks:
        out, t = taps(x, layer.weights, p, layer.heads, layer.head_dim)
        tapped.append((x, t))
        x = out
    normed = F.layer_norm(x, (d,)).reshape(-1, d)
    copies = [normed.clone() for _ in range(p)]
    copies[rank].retain_grad()
    z = [copies[r] @ exp.head[:, r * k:(r + 1) * k] for r in range(p)]
    F.cross_entropy(torch.cat(z, dim=1), exp.targets.reshape(-1)).backward()
    head = f_share(x, copies[rank].grad)
    return [ways(mine[rank]), *_each(tapped, rank), head,
            *vocab_parallel.loss_forms([t.detach() for t in z], exp.targets.reshape(-1), rank)]


def room(check: dict, kind: str) -> int:
    """The most values one of its tensors holds: X [B, S, d], W_qkv [d, 3d], W1 [d, h]; at a step,
    every parameter of the model at one rank, flattened."""
    if kind == STEP:
        return sum(math.prod(shape) for shape in step_shapes(check, 1))
    d, b, s, h = width(check), int(check.get(B) or 0), size(check, "seq_len"), size(check, "hidden_dim")
    return max(b * s * d, 3 * d * d, d * h)


def should(check: dict, kind: str, hidden: bool) -> str:
    """What it should return, said in a refusal (no size at a hidden check)."""
    if kind == STEP:
        return "the loss and the rank's updated parameters" + ("" if hidden else f", at most {room(check, kind)} values")
    return alone_should(room(check, kind), hidden)


PART = Part(
    "transformer_block", "Part 7 (optional): a transformer block in tensor parallel", "TransformerBlock",
    "transformer_block_forward_backward",
    ("ParallelSelfAttention", "ParallelTransformerBlock", "transformer_block_forward_backward", STEP_FUNCTION),
    layouts={STEP: MODEL, BACKWARD: LAYER}, runs={STEP: stepped, BACKWARD: forward_and_backward},
    judging={STEP: "grader.verdict.transformer_step:STEP_JUDGING",
             BACKWARD: "grader.verdict.transformer:BLOCK_JUDGING"},
    room=room, should=should, kinds=(STEP, BACKWARD), optional=True,
    splits=(("num_heads", "world_size", "the attention's heads over the ranks"),
            ("hidden_dim", "world_size", "the MLP's hidden width over the ranks"),
            ("vocab_size", "world_size", "the vocabulary over the ranks")),
    needs=(megatron_mlp.PART.id, vocab_parallel.PART.id), parallel=True, layer="ParallelTransformerBlock",
    own_sizes=("num_heads", "head_dim", "seq_len", "num_layers"),   # and Part 5's hidden_dim, Part 6's vocab_size
    moves=(Moves(STEP, "all_reduce", "the embedding's partial lookups in g's forward", TOKENS),
           Moves(STEP, "all_reduce", "each block's attention outputs in g's forward", ("num_layers", *TOKENS)),
           Moves(STEP, "all_reduce", "each block's MLP outputs in g's forward", ("num_layers", *TOKENS)),
           Moves(STEP, "all_reduce", "the gradient of each block's MLP input in f's backward", ("num_layers", *TOKENS)),
           Moves(STEP, "all_reduce", "the gradient of each block's attention input in f's backward",
                 ("num_layers", *TOKENS)),
           Moves(STEP, "all_reduce", "the gradient of the head's input in f's backward", TOKENS),
           Moves(STEP, "all_reduce", "each token's sum of exponentials", (B, "seq_len")),
           Moves(STEP, "all_reduce", "each token's target logit, from the rank that holds it", (B, "seq_len")),
           Moves(BACKWARD, "all_reduce", "the attention's partial outputs in g's forward", TOKENS),
           Moves(BACKWARD, "all_reduce", "the MLP's partial outputs in g's forward", TOKENS),
           Moves(BACKWARD, "all_reduce", "the gradient of the MLP's input in f's backward", TOKENS),
           Moves(BACKWARD, "all_reduce", "the gradient of the attention's input in f's backward", TOKENS)),
    carried={STEP: carried_step, BACKWARD: carried_backward},
    lab={"lab/gpt_parallel.py": "the attention's heads split over the ranks, between f and g",
         "lab/transformer.py": "runs lab/gpt_parallel.py's blocks, so it goes where that goes"})
