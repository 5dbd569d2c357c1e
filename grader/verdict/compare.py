"""Judge a re-run part against the reference: weights, and what a difference means.

The reference weight is one SGD step on the MSE loss in closed form, in float64, computed here
in the grader's own process from the data the part ran on (grader.rerun.wire.secret: drawn by the
world's leader, served to each rank as its own view, its seeds reported back to the grader) and
the initial weight seeded exactly as the handout seeds it:

    W1 = W0 - lr * dL/dW,   dL/dW = 2/(B*O) * X^T (X W0 - Y)

Nothing a rank says about itself passes a check: only the weight, which is right only when the
ranks exchanged their data, since no rank alone holds the data a right weight needs (Parts 3 and
4). The collectives a rank reports can fail a right weight, where the part's are missing
(grader.verdict.comm: data exchanged another way is not the part's algorithm).

When a weight differs, grader.verdict.diagnose tests the usual mistakes in turn, each by computing
the weight that mistake would produce on the data each rank was handed, and comparing. Messages are
said through grader.verdict.say, so a hidden check's numbers never reach them. (A backward check
is grader.verdict.backward's.)
"""

import hashlib
from dataclasses import dataclass, field

import torch

from grader.parts import BY_ID, STEP
from grader.parts.common import close as _close
from grader.rerun.wire import secret
from grader.results import CheckOutcome, Status
from grader.verdict.diagnose import diagnose
from grader.verdict.judging import Judging
from grader.verdict.say import Say

__all__ = ["Expected", "expected", "diagnose", "collectives", "weight_digest", "judge", "unfinished", "STEP_JUDGING"]


@dataclass
class Expected:
    w0: torch.Tensor   # [input_dim, output_dim]
    x: torch.Tensor    # [B, input_dim], the real batch
    y: torch.Tensor    # [B, output_dim]
    lr: float
    w1: torch.Tensor   # the reference's updated weight
    views: dict = field(default_factory=dict)   # rank -> (x, y) as that rank was handed them, where
                                                # they differ from the real batch (Parts 3 and 4)

    def data(self, rank=None) -> tuple:
        """(x, y) as rank `rank` was handed them (None: the real batch)."""
        return self.views.get(rank, (self.x, self.y))

    def gradient(self, rows=slice(None), rank=None) -> torch.Tensor:
        """The gradient of the mean loss over `rows` of the batch rank `rank` was handed."""
        x, y = self.data(rank)
        x, y = x[rows], y[rows]
        return 2.0 / (x.shape[0] * y.shape[1]) * x.T @ (x @ self.w0 - y)

    def step(self, rows=slice(None), scale=1.0, rank=None) -> torch.Tensor:
        """W0 - scale * lr * (gradient of the mean loss over `rows` of rank `rank`'s batch)."""
        return self.w0 - scale * self.lr * self.gradient(rows, rank)

    def mean_step(self, rows_of, world_size: int, batch_of=None) -> torch.Tensor:
        """The data-parallel step when rank r takes rows_of(r) of the batch it was handed (or of the
        batch rank batch_of(r) was handed: one rank's, broadcast) and the gradients are averaged
        over the ranks."""
        whose = batch_of or (lambda r: r)
        return self.w0 - self.lr * sum(self.gradient(rows_of(r), whose(r)) for r in range(world_size)) / world_size


def expected(check, lr: float, data=None, part: str = None) -> Expected:
    """The reference of `part` at step check `check`, on `data` (the protocol.PartSecret the part ran
    on, drawn by the part's layout; None: the handout's seeded batch, as utils.create_batch draws it)."""
    g = torch.Generator().manual_seed(check.seed)
    w0 = torch.randn(check.input_dim, check.output_dim, generator=g).double()
    sizes = (check.global_batch_size, check.input_dim, check.output_dim)
    views = {}
    if data is None:
        g = torch.Generator().manual_seed(check.seed)  # create_batch seeds again before drawing
        x = torch.randn(check.global_batch_size, check.input_dim, generator=g).double()
        y = torch.randn(check.global_batch_size, check.output_dim, generator=g).double()
    else:
        layout = secret.layout(part, STEP)
        real = secret.tensors(data, layout, *sizes)
        x, y = real.x.double(), real.y.double()
        if layout != secret.WHOLE:
            for r in range(check.world_size):
                mine = secret.tensors(secret.view(data, r), layout, *sizes, rank=r)
                views[r] = (mine.x.double(), mine.y.double())
    e = Expected(w0=w0, x=x, y=y, lr=lr, w1=None, views=views)
    e.w1 = e.step()
    return e


def collectives(ranks: dict) -> dict:
    counts = {}
    for run in ranks.values():
        for call in run.comm:
            op = str(call.get("op"))
            counts[op] = counts.get(op, 0) + 1
    return counts


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


def _todo(error: str) -> str:
    """The TODO a NotImplementedError names: "TODO in single_step: inputs, targets = ... (1 line)"."""
    text = error.split("NotImplementedError", 1)[-1].lstrip(": ").strip()
    return text[:200] if text else "a TODO still raises NotImplementedError"


def unfinished(run, check, say: Say) -> CheckOutcome:
    """The outcome of a part that did not return on every rank: not implemented, crashed, timed out ..."""
    outcome = CheckOutcome(check=check.name, hidden=check.hidden, world_size=check.world_size,
                           status=run.status, message="", collectives=collectives(run.ranks))
    errored = sorted((r for r in run.ranks.values() if r.exception and r.status != "ok"),
                     key=lambda r: (r.status != "crashed", r.rank))
    outcome.error = errored[0].exception if errored else run.detail
    outcome.traceback = errored[0].traceback if errored else run.output
    outcome.failing_ranks = sorted(r.rank for r in run.ranks.values() if r.status != "ok")
    if run.status == Status.NOT_IMPLEMENTED:
        outcome.message = f"not implemented yet: {_todo(outcome.error)}"
        return outcome
    outcome.message = {
        Status.TIMEOUT: "timed out",
        Status.OOM: "ran out of memory",
        Status.INFRA_ERROR: "could not be run: the grader's machinery failed (not your code)",
    }.get(run.status, "crashed")
    if run.detail:
        outcome.message += f": {say.text(run.detail)}"
    elif outcome.error and run.status == Status.CRASHED:
        outcome.message += f": {say.text(outcome.error)}"
    return outcome


def by_rank(run, check, say: Say, problem, *, wrong: str, right: str, worst=None) -> CheckOutcome:
    """The outcome of a check judged rank by rank, as Parts 5-8 judge theirs: `problem(rank, r)` says
    what is wrong with one rank's results ("" when nothing); the first failing rank's is the
    diagnosis. `worst(rank, r)`, where given, is a rank's largest difference (None: not comparable).
    The message: "{wrong} on {those ranks}: {diagnosis}", or `right` when every rank passed."""
    if run.status != Status.PASSED:
        return unfinished(run, check, say)
    outcome = CheckOutcome(check=check.name, hidden=check.hidden, world_size=check.world_size,
                           status=Status.PASSED, message="", collectives=collectives(run.ranks))
    found = {rank: text for rank, r in sorted(run.ranks.items()) if (text := problem(rank, r))}
    outcome.failing_ranks = sorted(found)
    if worst is not None:
        diffs = [worst(rank, r) for rank, r in run.ranks.items()]
        outcome.max_abs_diff = max((d for d in diffs if d is not None), default=float("inf"))
    if found:
        outcome.status, outcome.diagnosis = Status.FAILED, found[min(found)]
        outcome.message = f"{wrong} on {say.ranks(sorted(found), len(run.ranks))}: {outcome.diagnosis}"
    else:
        outcome.message = right
    return outcome


def output_worst(want: list):
    """by_rank's `worst` for a block run alone: the largest difference of a rank's output (what it
    returns first) from want[rank]["output"]; None where the shapes differ."""
    def worst(rank, r):
        expected = want[rank]["output"]
        return float((r.weight - expected).abs().max()) if r.weight.shape == expected.shape else None
    return worst


def judge(run, exp: Expected, part: str, check, tol, say: Say = None, passed=()) -> CheckOutcome:
    """The outcome of one part at one check, from its PartRun. `passed`: the checks this part passed
    already (grader.verdict.diagnose); `say`: how this check's numbers are said."""
    say = say or Say(check)
    if run.status != Status.PASSED:
        return unfinished(run, check, say)
    outcome = CheckOutcome(check=check.name, hidden=check.hidden, world_size=check.world_size,
                           status=run.status, message="", collectives=collectives(run.ranks))
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
    if failing:
        first = failing[0]
        weights = {rank: r.weight for rank, r in run.ranks.items()}
        outcome.status = Status.FAILED
        # A mistake that only every rank's weights together show (the part's), then the first's weight.
        outcome.diagnosis = BY_ID[part].run_mistake(run, failing, say) or \
            diagnose(run.ranks[first].weight, exp, part, check, first, tol, say, passed, weights)
        outcome.weight_digest = weight_digest(run.ranks)
        outcome.message = f"wrong weight on {say.ranks(failing, len(run.ranks))}: {outcome.diagnosis}"
    else:
        outcome.status = Status.PASSED
        outcome.message = ("matches the reference on every rank" if check.hidden or len(run.ranks) == 1
                           else f"matches the reference on all {len(run.ranks)} ranks")
    return outcome


STEP_JUDGING = Judging(expected=expected, judge=judge)   # a step that returns one weight (grader.parts)
