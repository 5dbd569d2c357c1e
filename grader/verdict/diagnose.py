"""What a wrong weight looks like: each usual mistake's weight, computed and compared in turn.

Each mistake's weight is computed on the data every rank was handed (compare.Expected's views:
in Part 3 a rank holds the real rows of its own slice only, in Part 4 the real targets of its own
columns only), so a mistake that uses data a rank does not own is told by its weight.

`diagnose` returns one sentence that states what the weight is (the transpose, one rank's shard,
the step of one micro-batch, an update k times the reference's) and, where the weight leaves no
doubt, the line of code that makes it. Numbers go through grader.verdict.say, so a hidden
check's values are never said. `passed` are the checks this part already passed: a number that
was right there and is wrong here (a 4 written where world_size belongs) is told apart from a
mistake that would have failed there too.
"""

import torch

from grader.verdict.say import Say


def close(a, b, tol) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=tol.rtol, atol=tol.atol))


def local_ranks(check) -> list:
    """Each rank's LOCAL_RANK in the check's layout of `nodes` nodes."""
    per_node = check.world_size // max(check.nodes, 1)
    return [r % per_node for r in range(check.world_size)]


def layout_matters(check, passed) -> bool:
    """The check lays its world out on several nodes, and the part passed on one node at its world size."""
    return check.nodes > 1 and any(p.nodes == 1 and p.world_size == check.world_size for p in passed)


def tp_step(exp, check, holds) -> torch.Tensor:
    """Part 4's gathered weight when rank r starts from the columns of shard holds[r] (and its output
    is compared with the targets of its own columns r)."""
    cols = check.output_dim // check.world_size
    return torch.cat([column_step(exp, r, h, h, r, cols) for r, h in enumerate(holds)], dim=1)


def column_step(exp, rank: int, holds: int, output: int, targets: int, cols: int) -> torch.Tensor:
    """The shard rank `rank` updates when it starts from W0's columns block `holds` and its gradient
    is that of X W0_output against block `targets` of the targets as rank `rank` was handed them."""
    x, y = exp.data(rank)
    b, o = x.shape[0], y.shape[1]
    w = exp.w0[:, holds * cols:(holds + 1) * cols]
    out = x @ exp.w0[:, output * cols:(output + 1) * cols]
    grad = 2.0 / (b * o) * x.T @ (out - y[:, targets * cols:(targets + 1) * cols])
    return w - exp.lr * grad


def _shape(got, want, say) -> str:
    shown = "" if say.hidden else f" {list(got.shape)},"
    if got.shape == want.T.shape:
        return f"wrong shape:{shown} the transpose of [input_dim, output_dim]"
    if got.dim() == 2 and got.shape[0] == want.shape[0] and want.shape[1] % max(got.shape[1], 1) == 0:
        return (f"wrong shape:{shown} one rank's shard of the columns; the full weight [input_dim, output_dim] "
                f"must be gathered from every rank")
    return f"wrong shape:{shown} expected [input_dim, output_dim]" + ("" if say.hidden else f" = {list(want.shape)}")


def _fixed_number(k, part, check, say, passed):
    """An update k times the reference's that a number written into the code explains."""
    key, name = {"data_parallel": ("world_size", "world_size"),
                 "grad_accumulation": ("accumulation_steps", "accumulation_steps")}.get(part, (None, None))
    if key is None:
        return None
    here = getattr(check, key)
    for p in passed:
        c = getattr(p, key)
        if c > 1 and c != here and abs(k - here / c) <= 1e-3 * max(1.0, here / c):
            # The checks passed so far with that number, as examples: later checks may pass too
            # (the list under the message says which), so the sentence never says "only there".
            alike = [q for q in passed if getattr(q, key) == c]
            public = [f"'{q.name}'" for q in alike if not q.hidden]
            hidden = len(alike) - len(public)
            shown = f"{c}" if public else "a fixed number"
            where = public + ([f"{hidden} hidden check{'s' if hidden > 1 else ''}"] if hidden else [])
            where[0] = (f"check{'s' if len(public) > 1 else ''} " if public else "") + where[0]
            what = "the summed gradient" if part == "data_parallel" else "each micro-batch loss"
            here_is = "" if say.hidden else f" ({here} at this check)"
            return (f"{what} was divided by {shown} written into the code, not by {name}{here_is}; "
                    f"it is right where {name} is {c if public else 'that number'}, as at {_and(where)}")
    return None


def _and(items: list) -> str:
    """"a", "a and b", "a, b and c"."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _factor(k, part, check, say, passed) -> str:
    fixed = _fixed_number(k, part, check, say, passed)
    if fixed:
        return fixed
    b, o = check.global_batch_size, check.output_dim
    ws, steps = check.world_size, check.accumulation_steps
    known = [(-1.0, "the step has the wrong sign: the weight moved up the gradient"),
             (float(b * o), "the loss is a sum, not a mean (reduction='sum'): the update is B*O times too large"),
             (float(o), "the loss is summed over the outputs: the update is output_dim times too large"),
             (float(b), "the loss is summed over the batch: the update is batch-size times too large")]
    if part == "data_parallel" and ws > 1:
        over = "the ranks" if say.hidden else f"the {ws} ranks"
        known += [(float(ws), f"the gradients were summed over {over}, not averaged "
                              f"(the update is {say.eq(ws, 'world_size')} times too large)"),
                  (1.0 / ws, f"the gradient was averaged twice (divided by {say.eq(ws, 'world_size')} once too often)")]
    if part == "grad_accumulation" and steps > 1:
        known += [(float(steps), f"the micro-batch losses were not divided by {say.eq(steps, 'accumulation_steps')}: "
                                 f"the update is {say.num(steps, 'accumulation_steps')} times too large"),
                  (1.0 / steps, f"the loss was divided by {say.eq(steps, 'accumulation_steps')} once too often")]
    if part == "tensor_parallel" and ws > 1:
        known += [(float(ws), f"the update is {say.eq(ws, 'world_size')} times too large: each rank's loss was "
                              f"the mean over its own columns only, not over all of output_dim (gather the "
                              f"output before the loss)")]
    for factor, message in known:
        if abs(k - factor) <= 1e-3 * max(1.0, abs(factor)):
            return message
    if say.hidden:
        return "the update points the right way but is the wrong length (a constant factor off the reference's)"
    return f"the update points the right way but is {k:.4g} times the reference's"


def _data_parallel(got, exp, check, rank, tol, say, weights, passed):
    ws = check.world_size
    local = check.global_batch_size // ws
    rows = [slice(r * local, (r + 1) * local) for r in range(ws)]
    if layout_matters(check, passed):
        mine = local_ranks(check)
        if close(got, exp.mean_step(lambda r: rows[mine[r]], ws), tol):
            return (f"every rank used the slice of the batch of its LOCAL_RANK: in this check's layout of "
                    f"{say.num(check.nodes, 'several')} nodes the local ranks repeat on every node, so ranks "
                    f"of different nodes took the same rows; pick the slice with the global rank "
                    f"(dist.get_rank(), RANK), not the local one")
    same = weights is not None and len(weights) > 1 and all(close(w, got, tol) for w in weights.values())
    for k in range(ws) if same else ():
        if close(got, exp.mean_step(lambda r: rows[k], ws), tol):
            whose = "the first rank's" if k == 0 else "the last rank's" if k == ws - 1 else "one rank's"
            whose = whose if say.hidden else f"rank {k}'s"
            return (f"on every rank the update is the gradient of {whose} slice of the batch alone: the ranks "
                    f"took the same rows (each rank's slice starts at rank * local_batch_size)")
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


def _accumulation(got, exp, check, tol, say):
    steps = check.accumulation_steps
    micro = check.global_batch_size // steps
    rows = [slice(i * micro, (i + 1) * micro) for i in range(steps)]
    for i in (0, steps - 1) + tuple(range(1, steps - 1)):
        if close(got, exp.step(rows[i]), tol):
            which = "first" if i == 0 else "last" if i == steps - 1 else "same"
            return (f"every accumulation step used the {which} micro-batch: the rows taken do not move with "
                    f"the loop index (micro-batch i starts at row i * micro_batch_size)")
    if close(got, exp.step(rows[-1], 1.0 / steps), tol):
        return ("only the last micro-batch's gradient made it into the step: each backward() replaced the "
                "gradient instead of adding to it (zero_grad() inside the loop?)")
    if close(got, exp.step(rows[0], 1.0 / steps), tol):
        return ("only the first micro-batch's gradient made it into the step: the later micro-batches "
                "never reached backward() (a break or return inside the loop?)")
    return None


def _tensor_parallel(got, exp, check, rank, tol, say, passed):
    p, want = check.world_size, exp.w1
    cols = check.output_dim // p
    shards = [want[:, j * cols:(j + 1) * cols] for j in range(p)]
    if layout_matters(check, passed) and close(got, tp_step(exp, check, local_ranks(check)), tol):
        return (f"every rank held the columns of its LOCAL_RANK: in this check's layout of "
                f"{say.num(check.nodes, 'several')} nodes the local ranks repeat on every node, so ranks of "
                f"different nodes held the same shard; pick the shard with the global rank (dist.get_rank()), "
                f"not the local one")
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
    for k in range(p):
        if close(got, torch.cat([column_step(exp, r, r, k, k, cols) for r in range(p)], dim=1), tol):
            whose = f"rank {k}'s" if not say.hidden else "the first rank's" if k == 0 else "one rank's"
            return (f"every rank's shard took the step of {whose} columns: the gather's backward "
                    f"(GatherParallel) must hand each rank its own columns of the output's gradient")
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


def diagnose(got, exp, part: str, check, rank: int, tol, say: Say = None, passed=(), weights=None) -> str:
    """What `got` (rank `rank`'s weight; `weights`: every rank's) looks like next to the reference
    (`exp`): one sentence, or a plain difference."""
    say = say or Say(check)
    want = exp.w1
    if got.shape != want.shape:
        return _shape(got, want, say)
    if not torch.isfinite(got).all():
        return "the weight contains NaN or inf"
    if close(got, exp.w0, tol):
        return "the weight did not change: no optimizer step was taken (or the gradient was zero)"
    update, ref = got - exp.w0, want - exp.w0
    k = float((update * ref).sum() / (ref * ref).sum())
    # The residual is measured against the update itself: against the reference's, a large k (B*O
    # at a big batch) would scale the reference's float32 rounding past the threshold.
    if float((update - k * ref).norm() / update.norm().clamp_min(1e-30)) < 1e-3:
        return _factor(k, part, check, say, passed)
    found = None
    if part == "data_parallel" and check.world_size > 1:
        found = _data_parallel(got, exp, check, rank, tol, say, weights, passed)
    if part == "grad_accumulation" and check.accumulation_steps > 1:
        found = _accumulation(got, exp, check, tol, say)
    if part == "tensor_parallel" and check.world_size > 1:
        found = _tensor_parallel(got, exp, check, rank, tol, say, passed)
    if found:
        return found
    if say.hidden:
        return "differs from the reference by more than the tolerance"
    diff = (got - want).abs()
    return f"differs from the reference by up to {diff.max():.3e} (mean {diff.mean():.3e})"
