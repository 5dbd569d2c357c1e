"""Part 4, full column-parallel tensor parallelism: W split by columns, its output and update gathered.

At a step check rank r of p is handed the real X and real targets only in its own columns
[r*O/p, (r+1)*O/p) of Y, its own noise elsewhere (COLUMNS): the gradient of rank r's columns of W
needs only those, so the column-parallel step is right, and the full weight needs every rank's
updated columns. At a backward check the layer `FullColumnParallelLinear(W0, world_size, rank)`
runs alone (`forward_and_backward`), handed a W0 real in its own columns only (WEIGHT), judged by
grader.verdict.backward. Its usual mistakes at a step, each told by the weight it makes:

    each rank's loss the mean over its own columns: a factor of world_size
    the shards gathered in the wrong order, one shard everywhere, joined by rows, interleaved;
    the gather's backward handing every rank one rank's columns; no gather at all; the shard of
    LOCAL_RANK on several nodes
"""

from grader.parts import BACKWARD, STEP, B, Moves, OUT_SHARE, Part
from grader.parts.common import (COLUMNS, WEIGHT, close, layout_matters, local_ranks, one_weight, run_alone,
                                 shard_gradient, weight_room, weight_should)


def forward_and_backward(module, call, check: dict, data) -> dict:
    """The hand-in's layer run alone on every rank on `data` (a grader.rerun.wire.secret.PartData: x, w0),
    backward started from G (grader.parts.common.output_gradient):

        output       the layer's output, [B, output_dim] on every rank (X @ W0)
        input_grad   the gradient of X, [B, input_dim] on every rank (G @ W0^T)
        weight_grad  the gradient of the rank's own columns of W0, [input_dim, output_dim / p]
                     (X^T G_rank): of the parameters that hold them (grader.parts.common.shard_gradient)
    """
    import torch.distributed as dist
    tensors, layer = run_alone(module, "FullColumnParallelLinear", (data.w0.clone(),), data.x, check,
                               check["output_dim"])
    if layer is not None:
        cols, rank = data.w0.shape[1] // dist.get_world_size(), dist.get_rank()
        grad = shard_gradient(layer, data.w0[:, rank * cols:(rank + 1) * cols])
        if grad is not None:
            tensors["weight_grad"] = grad
    return tensors


def factors(check, say) -> list:
    """An update world_size times too large: each rank's loss the mean over its own columns."""
    ws = check.world_size
    if ws <= 1:
        return []
    return [(float(ws), f"the update is {say.eq(ws, 'world_size')} times too large: each rank's loss was "
                        f"the mean over its own columns only, not over all of output_dim (gather the "
                        f"output before the loss)")]


def column_step(exp, rank: int, holds: int, output: int, targets: int, cols: int, batch=None):
    """The shard rank `rank` updates when it starts from W0's columns block `holds` and its gradient
    is that of X W0_output against block `targets` of the targets as rank `rank` (or rank `batch`,
    whose batch it was broadcast) was handed them."""
    x, y = exp.data(rank if batch is None else batch)
    b, o = x.shape[0], y.shape[1]
    w = exp.w0[:, holds * cols:(holds + 1) * cols]
    out = x @ exp.w0[:, output * cols:(output + 1) * cols]
    grad = 2.0 / (b * o) * x.T @ (out - y[:, targets * cols:(targets + 1) * cols])
    return w - exp.lr * grad


def tp_step(exp, check, holds):
    """The gathered weight when rank r starts from the columns of shard holds[r] (and its output is
    compared with the targets of its own columns r)."""
    import torch
    cols = check.output_dim // check.world_size
    return torch.cat([column_step(exp, r, h, h, r, cols) for r, h in enumerate(holds)], dim=1)


def _gathered(got, want, shards, p, cols, tol):
    """How the shards were put together, where each block of columns is some rank's right shard."""
    import torch
    found = [next((j for j in range(p) if close(got[:, i * cols:(i + 1) * cols], shards[j], tol)), None)
             for i in range(p)]
    if None not in found and found != list(range(p)):
        if len(set(found)) == p:
            return "every shard is right but they were put together in the wrong order"
        if len(set(found)) == 1:
            k = found[0]
            whose = "the last rank's" if k == p - 1 else "the first rank's" if k == 0 else "one rank's"
            return (f"every block of columns is the same shard, {whose}: the all-gather wrote every rank's "
                    f"shard into one tensor (a list made as [tensor] * world_size holds world_size "
                    f"references to one tensor, so the last write stays); make a new tensor per rank")
        return "some shards appear more than once and others not at all"
    if close(got, torch.cat(shards, dim=0).reshape(want.shape), tol):
        return ("the shards were joined along dimension 0 (the rows) and then reshaped: each rank's shard "
                "holds columns of W, so concatenate along dimension 1 (torch.cat(shards, dim=1))")
    if close(got, torch.stack(shards, dim=-1).reshape(want.shape), tol):
        return ("the shards were stacked along a new last dimension and reshaped, which interleaves their "
                "columns: concatenate along dimension 1 (torch.cat(shards, dim=1))")
    return None


def mistakes(got, exp, check, rank, tol, say, weights, passed):
    """How the shards were held, stepped and gathered (a sentence), or None."""
    import torch
    p, want = check.world_size, exp.w1
    if p <= 1:
        return None
    cols = check.output_dim // p
    shards = [want[:, j * cols:(j + 1) * cols] for j in range(p)]
    if layout_matters(check, passed) and close(got, tp_step(exp, check, local_ranks(check)), tol):
        return (f"every rank held the columns of its LOCAL_RANK: in this check's layout of "
                f"{say.num(check.nodes, 'several')} nodes the local ranks repeat on every node, so ranks of "
                f"different nodes held the same shard; pick the shard with the global rank (dist.get_rank()), "
                f"not the local one")
    found = _gathered(got, want, shards, p, cols, tol)
    if found:
        return found
    for k in range(p):
        if close(got, torch.cat([column_step(exp, r, r, k, k, cols) for r in range(p)], dim=1), tol):
            whose = f"rank {k}'s" if not say.hidden else "the first rank's" if k == 0 else "one rank's"
            return (f"every rank's shard took the step of {whose} columns: the gather's backward "
                    f"(GatherParallel) must hand each rank its own columns of the output's gradient")
    # Every rank alike (rank k alone on its own batch ends as this, on rank k only)
    same = weights is not None and len(weights) > 1 and all(close(w, got, tol) for w in weights.values())
    for k in range(p) if same else ():
        if close(got, torch.cat([column_step(exp, r, r, r, r, cols, batch=k) for r in range(p)], dim=1), tol):
            whose = f"rank {k}'s" if not say.hidden else "the first rank's" if k == 0 else "one rank's"
            return (f"every rank stepped on {whose} batch (broadcast from that rank): a re-run hands each rank "
                    f"the targets of its own columns through create_batch, and another rank's batch does not "
                    f"hold them; create the batch on every rank with the same seed, as the skeleton does")
    if close(got, exp.step(rank=rank), tol):
        return (f"on {say.rank(rank, 'a rank')} only its own columns are right: each rank took the whole step "
                f"alone, and a rank's data holds the targets of its own columns only; the other columns must "
                f"come from the ranks that hold them (all-gather the updated shards)")
    right = [r for r in range(p) if close(got[:, r * cols:(r + 1) * cols], shards[r], tol)]
    if len(right) == 1:
        r = right[0]
        where = f" (columns {r * cols} to {(r + 1) * cols - 1})" if not say.hidden else ""
        return f"right on {say.rank(r, 'one rank')}'s shard only{where}; the other columns are wrong"
    return None


def carried_step(exp, check, rank: int) -> list:
    """What rank `rank`'s all-gathers carry at a step: its output columns X W0_r, its updated shard."""
    cols = check.output_dim // check.world_size
    x, _ = exp.data(rank)
    return [x @ exp.w0[:, rank * cols:(rank + 1) * cols], column_step(exp, rank, rank, rank, rank, cols)]


def carried_backward(exp, check, rank: int) -> list:
    """...and at a backward check (exp: grader.verdict.backward's): its output columns X W0_r, and
    what f all-reduces, its share G_r W0_r^T of the gradient of X."""
    w_r, g_r = exp.shares(check.world_size)[rank]
    return [exp.x @ w_r, g_r @ w_r.T]


PART = Part(
    "tensor_parallel", "Part 4: full column-parallel tensor parallel", "FullColumnParallel",
    "full_column_parallel_single_step", ("FullColumnParallelLinear", "full_column_parallel_single_step"),
    layouts={STEP: COLUMNS, BACKWARD: WEIGHT}, runs={STEP: one_weight, BACKWARD: forward_and_backward},
    judging={STEP: "grader.verdict.compare:STEP_JUDGING", BACKWARD: "grader.verdict.backward:BACKWARD_JUDGING"},
    room=weight_room, should=weight_should, kinds=(STEP, BACKWARD),
    splits=(("output_dim", "world_size", "W's columns over the ranks"),), parallel=True,
    layer="FullColumnParallelLinear",
    moves=(Moves(STEP, "all_gather", "the layer's output columns in GatherParallel", (B, OUT_SHARE)),
           Moves(STEP, "all_gather", "the updated weight's columns", ("input_dim", OUT_SHARE)),
           Moves(BACKWARD, "all_gather", "the layer's output columns in GatherParallel", (B, OUT_SHARE)),
           Moves(BACKWARD, "all_reduce", "the gradient of X in BroadcastParallel's backward", (B, "input_dim"))),
    carried={STEP: carried_step, BACKWARD: carried_backward},
    factors=factors, mistakes=mistakes, aliases=("tensor", "column", "tp", "modelparallel"), alias_rank=1,
    lab={"lab/tensor_parallel.py": "f (copy to the parallel region) and the gather, applied around a "
                                   "column-parallel layer",
         "lab/mappings.py": "f (copy to the parallel region) as an autograd Function",
         "lab/vocab_parallel.py": "f before a layer split by columns (the LM head's vocabulary)",
         "lab/gpt_parallel.py": "f before every column-parallel layer of a transformer",
         "lab/transformer.py": "runs lab/gpt_parallel.py's model, so it goes where that goes"})
