"""Judge a re-run part against the reference: weights, communication, and what a difference means.

The reference weight is one SGD step on the MSE loss in closed form, in float64, computed here
in the grader's own process from the check's configuration (seeded exactly as the handout seeds
it; tests prove it equals what the reference solution returns):

    W1 = W0 - lr * dL/dW,   dL/dW = 2/(B*O) * X^T (X W0 - Y)

When a weight differs, `diagnose` tests the usual mistakes in turn, each by computing the weight
that mistake would produce and comparing.
"""

import hashlib
from dataclasses import dataclass

import torch

from grader.results import CheckOutcome, Status

# The communication each part must show at world sizes above 1, per rank.
GATHERS = ("all_gather", "all_gather_into_tensor", "_all_gather_base")
REDUCE_SCATTERS = ("reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base")


@dataclass
class Expected:
    w0: torch.Tensor   # [input_dim, output_dim]
    x: torch.Tensor    # [B, input_dim]
    y: torch.Tensor    # [B, output_dim]
    lr: float
    w1: torch.Tensor   # the reference's updated weight

    def step(self, rows=slice(None), scale=1.0) -> torch.Tensor:
        """W0 - scale * lr * (gradient of the mean loss over `rows` of the batch)."""
        x, y = self.x[rows], self.y[rows]
        grad = 2.0 / (x.shape[0] * y.shape[1]) * x.T @ (x @ self.w0 - y)
        return self.w0 - scale * self.lr * grad


def expected(check, lr: float) -> Expected:
    g = torch.Generator().manual_seed(check.seed)
    w0 = torch.randn(check.input_dim, check.output_dim, generator=g).double()
    g = torch.Generator().manual_seed(check.seed)  # create_batch seeds again before drawing
    x = torch.randn(check.global_batch_size, check.input_dim, generator=g).double()
    y = torch.randn(check.global_batch_size, check.output_dim, generator=g).double()
    e = Expected(w0=w0, x=x, y=y, lr=lr, w1=None)
    e.w1 = e.step()
    return e


def _close(a, b, tol) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=tol.rtol, atol=tol.atol))


def diagnose(got: torch.Tensor, exp: Expected, part: str, check, rank: int, tol) -> str:
    """What `got` looks like next to the reference: one sentence, or a plain difference."""
    want = exp.w1
    if got.shape != want.shape:
        if got.shape == want.T.shape:
            return f"wrong shape: {list(got.shape)}, the transpose of [input_dim, output_dim] = {list(want.shape)}"
        if got.dim() == 2 and got.shape[0] == want.shape[0] and want.shape[1] % max(got.shape[1], 1) == 0:
            return (f"wrong shape: {list(got.shape)}, one rank's shard of the columns; the full weight "
                    f"{list(want.shape)} must be gathered from every rank")
        return f"wrong shape: {list(got.shape)}, expected {list(want.shape)}"
    if not torch.isfinite(got).all():
        return "the weight contains NaN or inf"
    if _close(got, exp.w0, tol):
        return "the weight did not change: no optimizer step was taken (or the gradient was zero)"
    update, ref = got - exp.w0, want - exp.w0
    k = float((update * ref).sum() / (ref * ref).sum())
    if float((update - k * ref).norm() / ref.norm()) < 1e-3:
        b, o = check.global_batch_size, check.output_dim
        ws, steps = check.world_size, check.accumulation_steps
        known = [(-1.0, "the step has the wrong sign: the weight moved up the gradient"),
                 (float(b * o), "the loss is a sum, not a mean (reduction='sum'): the update is B*O times too large"),
                 (float(o), "the loss is summed over the outputs: the update is output_dim times too large"),
                 (float(b), "the loss is summed over the batch: the update is batch-size times too large")]
        if part == "data_parallel" and ws > 1:
            known += [(float(ws), f"the gradients were summed over the {ws} ranks, not averaged "
                                  f"(the update is world_size = {ws} times too large)"),
                      (1.0 / ws, f"the gradient was averaged twice (divided by world_size = {ws} once too often)")]
        if part == "grad_accumulation" and steps > 1:
            known += [(float(steps), f"the micro-batch losses were not divided by accumulation_steps = {steps}: "
                                     f"the update is {steps} times too large"),
                      (1.0 / steps, f"the loss was divided by accumulation_steps = {steps} once too often")]
        for factor, message in known:
            if abs(k - factor) <= 1e-3 * max(1.0, abs(factor)):
                return message
        return f"the update points the right way but is {k:.4g} times the reference's"
    if part == "data_parallel" and check.world_size > 1:
        local = check.global_batch_size // check.world_size
        for scale in (1.0, 1.0 / check.world_size):
            if _close(got, exp.step(slice(rank * local, (rank + 1) * local), scale), tol):
                return (f"rank {rank} stepped on its own slice of the batch only: the gradients were "
                        f"not all-reduced across the ranks")
    if part == "grad_accumulation" and check.accumulation_steps > 1:
        micro = check.global_batch_size // check.accumulation_steps
        for i in (check.accumulation_steps - 1, 0):
            for scale in (1.0, 1.0 / check.accumulation_steps):
                if _close(got, exp.step(slice(i * micro, (i + 1) * micro), scale), tol):
                    which = "last" if i else "first"
                    return (f"only the {which} micro-batch's gradient made it into the step "
                            f"(zero_grad() inside the loop, or the gradient overwritten)")
    if part == "tensor_parallel" and check.world_size > 1:
        cols = check.output_dim // check.world_size
        right = [r for r in range(check.world_size)
                 if _close(got[:, r * cols:(r + 1) * cols], want[:, r * cols:(r + 1) * cols], tol)]
        blocks = [got[:, i * cols:(i + 1) * cols] for i in range(check.world_size)]
        if all(any(_close(b, want[:, j * cols:(j + 1) * cols], tol) for j in range(check.world_size)) for b in blocks):
            return "every shard is right but they were put together in the wrong order"
        if len(right) == 1:
            r = right[0]
            return (f"right on rank {r}'s shard only (columns {r * cols} to {(r + 1) * cols - 1}); "
                    f"the other columns are wrong")
    diff = (got - want).abs()
    return f"differs from the reference by up to {diff.max():.3e} (mean {diff.mean():.3e})"


def collectives(ranks: dict) -> dict:
    counts = {}
    for run in ranks.values():
        for call in run.comm:
            op = str(call.get("op"))
            counts[op] = counts.get(op, 0) + 1
    return counts


def comm_check(part: str, check, ranks: dict) -> tuple:
    """(ok, message): did every rank communicate as the part requires? Only asked above one rank."""
    if any(r.answer_key_calls for r in ranks.values()):
        return False, ("calls utils.expected_weight, the closed-form answer the script checks "
                       "against: a part must compute the step itself")
    if check.world_size == 1 or part not in ("data_parallel", "tensor_parallel"):
        return True, ""
    numel = check.input_dim * check.output_dim
    for rank, run in sorted(ranks.items()):
        ops = [c.get("op") for c in run.comm]
        if part == "data_parallel":
            reduced = sum(int(c.get("numel") or 0) for c in run.comm if c.get("op") == "all_reduce")
            scattered = any(op in REDUCE_SCATTERS for op in ops) and any(op in GATHERS for op in ops)
            if reduced < numel and not scattered:
                seen = ", ".join(sorted(set(ops))) or "no collective at all"
                return False, (f"rank {rank} never all-reduced the gradients (collectives called: {seen}); "
                               f"the right weight without it means every rank computed the whole batch")
        if part == "tensor_parallel" and not any(op in GATHERS for op in ops):
            seen = ", ".join(sorted(set(ops))) or "no collective at all"
            return False, (f"rank {rank} never called an all-gather (collectives called: {seen}); "
                           f"column-parallel layers gather the output and the weight shards")
    return True, ""


WEIGHT_DECIMALS = 6   # weight_digest rounds to this: the same wrong answer summed in another order still agrees


def weight_digest(ranks: dict) -> str:
    """sha256 over every rank's returned weight, in rank order: rank, shape, and values in float64
    rounded to WEIGHT_DECIMALS decimals. Equal digests at a check: the same wrong weight."""
    digest = hashlib.sha256()
    for rank, r in sorted(ranks.items()):
        w = r.weight.detach().to("cpu", torch.float64)
        rounded = torch.round(w, decimals=WEIGHT_DECIMALS) + 0.0   # -0.0 and 0.0 alike
        digest.update(f"{rank}:{list(w.shape)}:".encode() + rounded.contiguous().numpy().tobytes())
    return digest.hexdigest()


def judge(run, exp: Expected, part: str, check, tol) -> CheckOutcome:
    """The outcome of one part at one check, from its PartRun."""
    outcome = CheckOutcome(check=check.name, hidden=check.hidden, world_size=check.world_size,
                           status=run.status, message="", collectives=collectives(run.ranks))
    if run.status != Status.PASSED:
        errored = sorted((r for r in run.ranks.values() if r.exception and r.status != "ok"),
                         key=lambda r: (r.status != "crashed", r.rank))
        outcome.error = errored[0].exception if errored else run.detail
        outcome.traceback = errored[0].traceback if errored else run.output
        outcome.failing_ranks = sorted(r.rank for r in run.ranks.values() if r.status != "ok")
        outcome.message = {
            Status.NOT_IMPLEMENTED: "not implemented yet (a TODO still raises NotImplementedError)",
            Status.TIMEOUT: "timed out",
            Status.OOM: "ran out of memory",
            Status.INFRA_ERROR: "could not be run: the grader's machinery failed (not your code)",
        }.get(run.status, "crashed")
        if run.detail:
            outcome.message += f": {run.detail}"
        elif outcome.error and run.status == Status.CRASHED:
            outcome.message += f": {outcome.error}"
        return outcome
    worst, failing = 0.0, []
    for rank, r in sorted(run.ranks.items()):
        got = r.weight
        if got.shape != exp.w1.shape or not torch.isfinite(got).all():
            worst = float("inf")
            failing.append(rank)
            continue
        worst = max(worst, float((got - exp.w1).abs().max()))
        if not _close(got, exp.w1, tol):
            failing.append(rank)
    outcome.max_abs_diff = worst
    outcome.failing_ranks = failing
    outcome.comm_ok, outcome.comm_message = comm_check(part, check, run.ranks)
    if failing:
        first = failing[0]
        outcome.status = Status.FAILED
        outcome.diagnosis = diagnose(run.ranks[first].weight, exp, part, check, first, tol)
        outcome.weight_digest = weight_digest(run.ranks)
        where = "every rank" if len(failing) == len(run.ranks) else \
            f"rank{'s' if len(failing) > 1 else ''} {', '.join(map(str, failing))}"
        outcome.message = f"wrong weight on {where}: {outcome.diagnosis}"
    elif not outcome.comm_ok:
        outcome.status = Status.FAILED
        outcome.message = f"right weight, but {outcome.comm_message}"
    else:
        outcome.status = Status.PASSED
        outcome.message = ("matches the reference on every rank" if check.hidden or len(run.ranks) == 1
                           else f"matches the reference on all {len(run.ranks)} ranks")
    return outcome
