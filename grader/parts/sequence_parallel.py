"""Part 8 (optional), sequence parallelism on Part 7's block: LayerNorm and the residuals on the
rank's slice of the sequence, an all-gather along the sequence before each column-parallel linear
and a reduce-scatter after each row-parallel one, where Part 7 has f and g.

A course turns it on by giving it points in its rubric, with Part 7 on too (`needs`): the block is
built of Part 7's ParallelTransformerBlock (its shards and LayerNorms). It reads Part 7's sizes.

At a backward check `SequenceParallelBlock(W_qkv, W_o, W1, W2, world_size, rank)` runs alone
(`forward_and_backward`) on rank r's slice X_r = X[:, r S/p:(r+1) S/p] [B, S/p, d] of X [B, S, d],
handed the weights real only in its own shards (LAYER, as Part 7), its backward started from the
same slice of G [B, S, d]. The rank's slice of the output, its slice of dX and the gradients of
its parameters (the LayerNorms' summed over the ranks: whole on every rank) are judged, and the
usual mistakes named, by grader.verdict.sequence. Its collectives (`moves`): four all-gathers and
four reduce-scatters of a slice [B, S/p, d] per rank (two each way in forward, their conjugates in
backward), and the LayerNorms' gradients all-reduced, [d] each: no all-reduce of more (`at_most`),
so an all-reduce in place of a reduce-scatter fails, right values and all.
"""

from grader.parts import BACKWARD, B, Moves, Part, transformer_block
from grader.parts.common import LAYER, alone_should
from grader.parts.transformer_block import PARAMETERS, room as block_room

SLICE = (B, "seq_len/world_size", "num_heads", "head_dim")   # B x S/p x d: the rank's slice of an activation
WIDTH = ("num_heads", "head_dim")                             # d: a LayerNorm's weight or bias


def forward_and_backward(module, call, check: dict, data) -> dict:
    """The hand-in's block run alone on every rank on its slice of `data`'s X (a
    grader.rerun.wire.secret.PartData: x [B, S, d], the weights real in the rank's own shards), backward
    started from the same slice of G [B, S, d] (grader.parts.common.output_gradient):

        output          the rank's slice of the block's output, [B, S/p, d]
        input_grad      the gradient of X_r, [B, S/p, d]
        <name>_grad     the gradient of each parameter (transformer_block.PARAMETERS), as Part 7's
    """
    import torch
    import torch.distributed as dist
    from grader.parts.common import output_gradient
    block_class = getattr(module, "SequenceParallelBlock", None)
    if not isinstance(block_class, type):
        raise TypeError("assignment4.py has no class SequenceParallelBlock")
    p, r = dist.get_world_size(), dist.get_rank()
    local = data.x.shape[1] // p
    mine = slice(r * local, (r + 1) * local)
    x = data.x[:, mine].detach().clone().requires_grad_(True)
    grad_output = output_gradient(check["seed"], *data.x.shape)[:, mine]
    block = block_class(*data.weights, p, r)
    out = block(x)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"SequenceParallelBlock returned {type(out).__name__}, not a tensor")
    tensors = {"output": out.detach().clone()}
    if out.shape != x.shape or not out.requires_grad:
        return tensors   # the shape is the diagnosis
    out.backward(grad_output.to(out.dtype))
    if x.grad is not None:
        tensors["input_grad"] = x.grad.detach().clone()
    params = list(block.parameters())
    if len(params) == len(PARAMETERS) and all(q.grad is not None for q in params):
        tensors.update({f"{name}_grad": q.grad.detach().clone() for name, q in zip(PARAMETERS, params)})
    return tensors


def carried(exp, check, rank: int) -> list:
    """What rank `rank`'s collectives carry (exp: grader.verdict.transformer's Layer), the block's
    backward started from G: Part 7's block (transformer_block.taps) on the whole sequence, each
    value the rank's own. Its all-gathers its slice [B, S/p, d] (or sequence-first, [S/p, B, d]) of
    LN1(X), of LN2(H), of the gradient of H, of G; its reduce-scatters its partial outputs and its
    shares of the gradients of the gathered LN1(X) and LN2(H), [B, S, d] sequence-first (or as
    chunks of the sequence, [p, B, S/p, d]); its all-reduces its tokens' share of the gradients of
    the LayerNorms' weights and biases, [d] each (weight 1, bias 0: LN(x) is the normalized x)."""
    p = check.world_size
    x = exp.x.clone().requires_grad_(True)
    out, t = transformer_block.taps(x, exp.weights, p, exp.heads, exp.head_dim)
    out.backward(exp.g)
    b, s, d = exp.x.shape
    mine = slice(rank * s // p, (rank + 1) * s // p)

    def sliced(a):
        return transformer_block.ways(a[:, mine])

    def whole(a):
        a = a.detach()
        return a.transpose(0, 1), a.reshape(b, p, s // p, d).transpose(0, 1)

    ln = [(n.grad * n)[:, mine].sum((0, 1)).detach() if weight else n.grad[:, mine].sum((0, 1))
          for n in (t["n1"], t["n2"]) for weight in (True, False)]
    return [sliced(t["n1"]), sliced(t["n2"]), sliced(t["h"].grad), sliced(exp.g),
            whole(t["attn"][rank]), whole(t["mlp"][rank]), whole(t["in1"][rank].grad), whole(t["in2"][rank].grad),
            *ln]


def room(check: dict, kind: str) -> int:
    """The most values one of its tensors holds: Part 7's (its slices are smaller)."""
    return block_room(check, kind)


def should(check: dict, kind: str, hidden: bool) -> str:
    """What it should return, said in a refusal (no size at a hidden check)."""
    return alone_should(room(check, kind), hidden)


PART = Part(
    "sequence_parallel", "Part 8 (optional): sequence parallelism on the transformer block", "SequenceParallel",
    "sequence_parallel_forward_backward",
    ("sequence_first", "gather_sequence", "reduce_scatter_sequence", "GatherSequence", "ReduceScatterSequence",
     "SequenceParallelBlock", "sequence_parallel_forward_backward", "check_sequence_parallel"),
    layouts={BACKWARD: LAYER}, runs={BACKWARD: forward_and_backward},
    judging={BACKWARD: "grader.verdict.sequence:SEQUENCE_JUDGING"},
    room=room, should=should, kinds=(BACKWARD,), optional=True,
    splits=(("seq_len", "world_size", "the sequence over the ranks"),),
    needs=(transformer_block.PART.id,), parallel=True, layer="SequenceParallelBlock",
    moves=(Moves(BACKWARD, "all_gather", "the attention's normalized input before its QKV projection", SLICE),
           Moves(BACKWARD, "all_gather", "the MLP's normalized input before W1", SLICE),
           Moves(BACKWARD, "all_gather", "the gradient of the attention's output in backward", SLICE),
           Moves(BACKWARD, "all_gather", "the gradient of the MLP's output in backward", SLICE),
           Moves(BACKWARD, "reduce_scatter", "the attention's partial outputs after W_o", SLICE),
           Moves(BACKWARD, "reduce_scatter", "the MLP's partial outputs after W2", SLICE),
           Moves(BACKWARD, "reduce_scatter", "the gradient of the attention's normalized input in backward", SLICE),
           Moves(BACKWARD, "reduce_scatter", "the gradient of the MLP's normalized input in backward", SLICE),
           *(Moves(BACKWARD, "all_reduce", f"the gradient of {what}", WIDTH)
             for what in ("LN1's weight", "LN1's bias", "LN2's weight", "LN2's bias"))),
    carried={BACKWARD: carried}, at_most=("all_reduce",),
    lab={"lab/mappings.py": "GatherFromSequenceParallelRegion and ReduceScatterToSequenceParallelRegion",
         "lab/transformer.py": "runs the block with sequence parallelism on gloo ranks"})
