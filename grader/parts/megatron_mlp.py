"""Part 5 (optional), Megatron's MLP block: W1 split by columns, W2 by rows, f and g around them.

A course turns it on by giving it points in its rubric. Its function returns two full weights,
W1 [input_dim, hidden_dim] and W2 [hidden_dim, input_dim] (`two_weights`); its checks read the
rubric's hidden_dim, which no other part reads (`own_sizes`).

At a step check every rank is handed the real X and Y [B, d] and a seed of its own as the part's
`seed` (SHARDS): init_mlp_weights(seed) draws a full W1 and W2 whose rank-r shards are the real
ones, so a step taken whole on one rank is wrong. At a backward check the block
`MegatronMLP(W1, W2, world_size, rank)` runs alone (`forward_and_backward`), handed W1 and W2 real
in its own shards only (BLOCK). Both are judged, and their usual mistakes named, by
grader.verdict.megatron.
"""

from grader.parts import BACKWARD, HIDDEN_SHARE, STEP, B, Moves, Part
from grader.parts.common import BLOCK, SHARDS, alone_should, dims, run_alone


def returned_weights(value) -> tuple:
    """(W1, W2) from what megatron_mlp_single_step returned: a pair of floating-point tensors."""
    import torch
    if not isinstance(value, (tuple, list)) or len(value) != 2 or \
            not all(isinstance(v, torch.Tensor) for v in value):
        raise TypeError(f"megatron_mlp_single_step returned {type(value).__name__}, not a pair of tensors "
                        f"(updated_w1, updated_w2)")
    if not all(v.is_floating_point() for v in value):
        raise TypeError("megatron_mlp_single_step returned tensors that are not floating-point")
    return value[0], value[1]


def two_weights(module, call, check: dict, data) -> dict:
    """The step: {"weight": W1 [d, h], "w2": W2 [h, d]}."""
    w1, w2 = returned_weights(call())
    return {"weight": w1, "w2": w2}


def forward_and_backward(module, call, check: dict, data) -> dict:
    """The hand-in's block run alone on every rank, on `data` (a grader.rerun.wire.secret.PartData: x, and
    w1, w2 real in the rank's own shards), backward started from G of the output [B, input_dim]:

        output      the block's output, [B, input_dim] on every rank (GeLU(X W1) W2)
        input_grad  the gradient of X, [B, input_dim] on every rank (f all-reduces it)
        w1_grad     the gradient of the rank's W1 shard, [input_dim, hidden_dim / p]
        w2_grad     the gradient of the rank's W2 shard, [hidden_dim / p, input_dim]

    The shards are the block's parameters in the order it registers them (fc1's, then fc2's)."""
    tensors, block = run_alone(module, "MegatronMLP", (data.w1, data.w2), data.x, check, check["input_dim"])
    params = list(block.parameters()) if block is not None else []
    if len(params) == 2 and all(p.grad is not None for p in params):
        tensors["w1_grad"], tensors["w2_grad"] = (p.grad.detach().clone() for p in params)
    return tensors


def room(check: dict, kind: str) -> int:
    """The most values one of its tensors holds: W1 [d, h]; the block alone adds [B, d] tensors."""
    d_in, _, h, b = dims(check)
    return max(d_in * h, b * d_in if kind == BACKWARD else 0)


def should(check: dict, kind: str, hidden: bool) -> str:
    """What it should return, said in a refusal (no size at a hidden check)."""
    if kind == BACKWARD:
        return alone_should(room(check, kind), hidden)
    d_in, _, h, _ = dims(check)
    return "the weights W1 and W2" + ("" if hidden else f", {d_in} x {h} and {h} x {d_in}")


def _leaves(block, p: int) -> tuple:
    """X and every rank's shards of W1 (columns) and W2 (rows) of `block`, each a leaf of its own."""
    import torch
    w1s, w2s = torch.chunk(block.w1, p, dim=1), torch.chunk(block.w2, p, dim=0)
    return (block.x.clone().requires_grad_(True), [w.clone().requires_grad_(True) for w in w1s],
            [w.clone().requires_grad_(True) for w in w2s])


def carried_step(block, check, rank: int) -> list:
    """What rank `rank`'s collectives carry at a step (block: grader.verdict.megatron's Block): its
    partial output GeLU(X W1_r) W2_r, which g all-reduces, and its updated shards of W1 and W2."""
    import torch
    import torch.nn.functional as F
    x, w1s, w2s = _leaves(block, check.world_size)
    partials = [F.gelu(x @ w1) @ w2 for w1, w2 in zip(w1s, w2s)]
    loss = ((sum(partials) - block.y) ** 2).mean()
    g1, g2 = torch.autograd.grad(loss, [w1s[rank], w2s[rank]])
    return [partials[rank].detach(), (w1s[rank] - block.lr * g1).detach(), (w2s[rank] - block.lr * g2).detach()]


def carried_backward(block, check, rank: int) -> list:
    """...and at a backward check: its partial output, and its path's share of the gradient of X,
    which f all-reduces (backward started from G)."""
    import torch
    import torch.nn.functional as F
    x, w1s, w2s = _leaves(block, check.world_size)
    partial = F.gelu(x @ w1s[rank]) @ w2s[rank]
    return [partial.detach(), torch.autograd.grad(partial, x, block.g)[0]]


PART = Part(
    "megatron_mlp", "Part 5 (optional): Megatron's MLP block", "MegatronMLP", "megatron_mlp_single_step",
    ("ReduceParallel", "ColumnParallelLinear", "RowParallelLinear", "MegatronMLP", "megatron_mlp_single_step"),
    layouts={STEP: SHARDS, BACKWARD: BLOCK}, runs={STEP: two_weights, BACKWARD: forward_and_backward},
    judging={STEP: "grader.verdict.megatron:STEP_JUDGING", BACKWARD: "grader.verdict.megatron:BACKWARD_JUDGING"},
    room=room, should=should, kinds=(STEP, BACKWARD), optional=True,
    splits=(("hidden_dim", "world_size", "the hidden width over the ranks"),), parallel=True,
    layer="MegatronMLP", own_sizes=("hidden_dim",),
    moves=(Moves(STEP, "all_reduce", "the partial outputs in g's forward", (B, "input_dim")),
           Moves(STEP, "all_gather", "W1's updated columns", ("input_dim", HIDDEN_SHARE)),
           Moves(STEP, "all_gather", "W2's updated rows", (HIDDEN_SHARE, "input_dim")),
           Moves(BACKWARD, "all_reduce", "the partial outputs in g's forward", (B, "input_dim")),
           Moves(BACKWARD, "all_reduce", "the gradient of X in BroadcastParallel's backward", (B, "input_dim"))),
    carried={STEP: carried_step, BACKWARD: carried_backward},
    lab={"lab/tensor_parallel.py": "g (all-reduce forward, identity backward) as an autograd Function, and "
                                   "Megatron's columns-then-rows pair",
         "lab/mappings.py": "g (all-reduce forward, identity backward) as an autograd Function",
         "lab/vocab_parallel.py": "g after the embedding split by vocabulary rows",
         "lab/gpt_parallel.py": "Megatron's columns-then-rows pair in the MLP and the attention"})
