"""Part 3, data parallel: each rank steps on its own slice of the batch, the gradients all-reduced.

Rank r of p is handed real rows only in its own slice [r*B/p, (r+1)*B/p) of X and Y, its own
noise elsewhere (ROWS), so the whole batch on one rank, or an all-reduce of nothing, gives a wrong
weight. Its usual mistakes, each told by the weight it makes on the data every rank was handed:

    the gradients summed, not averaged (or averaged twice): a factor of world_size
    a number written where world_size belongs: right only where they agree (`fixed`)
    every rank on one rank's slice; the slice of LOCAL_RANK on several nodes; no all-reduce;
    one rank's batch broadcast or scattered; rows taken strided (rank::world_size);
    the whole batch on every rank; dist.reduce where all_reduce belongs (`run_mistake`)
"""

from grader.parts import STEP, Moves, Part
from grader.parts.common import ROWS, close, layout_matters, local_ranks, one_weight, weight_room, weight_should


def factors(check, say) -> list:
    """Updates k times the reference's that a mistake of the average explains."""
    ws = check.world_size
    if ws <= 1:
        return []
    over = "the ranks" if say.hidden else f"the {ws} ranks"
    return [(float(ws), f"the gradients were summed over {over}, not averaged "
                        f"(the update is {say.eq(ws, 'world_size')} times too large)"),
            (1.0 / ws, f"the gradient was averaged twice (divided by {say.eq(ws, 'world_size')} once too often)")]


def _slices(got, exp, check, rank, tol, say, weights, passed, rows):
    """Rows taken by the local rank, or by one rank on every rank."""
    ws = check.world_size
    if layout_matters(check, passed):
        mine = local_ranks(check)
        if close(got, exp.mean_step(lambda r: rows[mine[r]], ws), tol):
            return (f"every rank used the slice of the batch of its LOCAL_RANK: in this check's layout of "
                    f"{say.num(check.nodes, 'several')} nodes the local ranks repeat on every node, so ranks "
                    f"of different nodes took the same rows; pick the slice with the global rank "
                    f"(dist.get_rank(), RANK), not the local one")
    same = weights is not None and len(weights) > 1 and all(close(w, got, tol) for w in weights.values())
    moved = _moved_batch(got, exp, ws, tol, say, rows) if same else None
    if moved:
        return moved
    for k in range(ws) if same else ():
        if close(got, exp.mean_step(lambda r: rows[k], ws), tol):
            whose = "the first rank's" if k == 0 else "the last rank's" if k == ws - 1 else "one rank's"
            whose = whose if say.hidden else f"rank {k}'s"
            return (f"on every rank the update is the gradient of {whose} slice of the batch alone: the ranks "
                    f"took the same rows (each rank's slice starts at rank * local_batch_size)")
    return None


def _moved_batch(got, exp, ws, tol, say, rows):
    """Slices of one rank's batch, broadcast or scattered from it, or rows taken strided (the weight
    every rank ended with alike: rank k's alone on its whole batch is the first's, on rank k)."""
    for k in range(ws):
        if close(got, exp.mean_step(lambda r: rows[r], ws, batch_of=lambda r: k), tol):
            whose = f"rank {k}'s" if not say.hidden else "the first rank's" if k == 0 else "one rank's"
            return (f"every rank took its slice of {whose} batch (the batch broadcast, or its slices scattered, "
                    f"from that rank): a re-run hands each rank its own rows through create_batch, and another "
                    f"rank's batch does not hold them; create the batch on every rank with the same seed, as "
                    f"the skeleton does, and keep your own slice")
    if close(got, exp.mean_step(lambda r: slice(r, None, ws), ws), tol):
        return ("the ranks took every world_size-th row (rank, rank + world_size, ...): the batch is split in "
                "contiguous slices, rows [rank * local_batch_size, (rank + 1) * local_batch_size), and a "
                "re-run hands each rank real rows in its own slice only")
    return None


def mistakes(got, exp, check, rank, tol, say, weights, passed):
    """The slices the ranks took, and whether they all-reduced (a sentence), or None."""
    ws = check.world_size
    if ws <= 1:
        return None
    local = check.global_batch_size // ws
    rows = [slice(r * local, (r + 1) * local) for r in range(ws)]
    found = _slices(got, exp, check, rank, tol, say, weights, passed, rows)
    if found:
        return found
    for scale in (1.0, 1.0 / ws):
        if close(got, exp.step(rows[rank], scale, rank), tol):
            return (f"{say.rank(rank, 'a rank')} stepped on its own slice of the batch only: the gradients were "
                    f"not all-reduced across the ranks")
    whole = "every rank's gradient was that of the whole batch it was handed, not of its own slice: a rank's " \
            "data is the rows of its own slice alone (from rank * local_batch_size), the other rows are not its own"
    for scale in (1.0, 1.0 / ws):
        if close(got, exp.step(slice(None), scale, rank), tol):
            return f"{whole}, and the ranks never all-reduced the gradients of their slices"
    if close(got, exp.mean_step(lambda r: slice(None), ws), tol):
        return f"{whole}; the gradients were all-reduced, but of the wrong rows"
    return None


def run_mistake(run, failing: list, say):
    """dist.reduce where all_reduce belongs: its destination right, every other rank on its own slice."""
    right = [r for r in run.ranks if r not in failing]
    ops = {c.get("op") for r in run.ranks.values() for c in r.comm}
    if "reduce" not in ops or "all_reduce" in ops or len(right) != 1:
        return None
    return (f"only {say.rank(right[0], 'one rank')} ends with the right weight: the gradients went through "
            f"dist.reduce, which leaves the sum on its destination alone; the other ranks stepped on what they had. "
            f"dist.all_reduce leaves the sum on every rank")


def carried(exp, check, rank: int) -> list:
    """What rank `rank`'s all-reduce carries: the gradient of its own rows (grader.verdict.carried)."""
    local = check.global_batch_size // check.world_size
    return [exp.gradient(slice(rank * local, (rank + 1) * local), rank)]


PART = Part(
    "data_parallel", "Part 3: data parallel", "DataParallel", "data_parallel_single_step",
    ("data_parallel_single_step",),
    layouts={STEP: ROWS}, runs={STEP: one_weight}, judging={STEP: "grader.verdict.compare:STEP_JUDGING"},
    room=weight_room, should=weight_should,
    splits=(("global_batch_size", "world_size", "the batch over the ranks"),), parallel=True,
    moves=(Moves(STEP, "all_reduce", "the weight's gradient", ("input_dim", "output_dim")),), carried={STEP: carried},
    fixed=("world_size", "the summed gradient"), factors=factors, mistakes=mistakes, run_mistake=run_mistake,
    aliases=("data", "dp"), alias_rank=2,
    lab={"lab/data_parallel.py": "the all-reduce of every gradient, then its division by the world size"})
