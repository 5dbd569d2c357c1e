"""Score one hand-in by the rubric: re-run points per check, log points as corroborated evidence.

Per part:
- re-run points: the part's `rerun` points, split over the checks by weight, for each check the
  re-run passed (a weight no rank can get right without the part's parallel work, and for a
  parallel part, its collectives called: what a rank says of them can only fail it), but a parallel part's one-rank checks, which count only
  once it passed a check of more ranks (grader.worth, which also rounds: once, to the rubric's
  score_decimals; each check's outcome carries the points it earned);
- log points: the part's `log` points when the .log shows it matching on every rank of a run the
  rubric counts (world size, and where the course asks for them, nodes and a Slurm job), written
  by the code handed in (in a log of several runs, the lines of that code's run alone), and the grader's re-run at the first public check agrees (a log is
  evidence, never the verdict).
Penalties for missing or modified files come off the total, which never goes below zero.
"""

from grader import worth
from grader.evidence.runs import rule_of, rule_problems
from grader.parts import PARTS
from grader.rerun.machine import explain
from grader.results import LogPart, PartResult, Status

FAILURE_ORDER = (Status.INFRA_ERROR, Status.CRASHED, Status.TIMEOUT, Status.OOM, Status.FAILED,
                 Status.NOT_IMPLEMENTED)


def log_validity(log, code_sha256: str, rubric) -> tuple:
    """(usable, flags, notes) of a parsed .log as evidence for the code handed in."""
    if log is None:
        return False, [], ["no log of a run in the hand-in: no points for log evidence"]
    flags, notes = [], []
    usable = True
    if log.fingerprints and code_sha256 not in log.fingerprints:
        flags.append("stale_log")
        notes.append("the .log was written by different code than the assignment4.py handed in "
                     f"(the log's code sha256 {log.fingerprints[0][:12]}..., the file's {code_sha256[:12]}...): "
                     "hand in the log of a run of this very file")
        usable = False
    elif len(log.fingerprints) > 1 and getattr(log, "claims_of", "") != code_sha256:
        flags.append("log_claims_untied")   # read without this code's sha256: every run's lines in the parts
        notes.append("the .log holds runs of several versions of the code and its parts were not read from the "
                     "run of this assignment4.py alone: no points for log evidence")
        usable = False
    for code, problem in rule_problems(log, rule_of(rubric)):
        flags.append(code)
        notes.append(f"{problem}: no points for log evidence")
        usable = False
    for flag in log.flags:
        flags.append(f"log_{flag.code}")
        if flag.code != "world_size_too_small":   # said above, as the rubric's rule
            notes.append(f"log: {flag.message}")
    return usable, flags, notes


def _failure(outcomes: list, failing: list) -> tuple:
    """(status, message) of a part that failed some of its checks."""
    status = next((s for s in FAILURE_ORDER if any(o.status == s for o in failing)), failing[0].status)
    if all(o.status == Status.NOT_IMPLEMENTED for o in outcomes):
        return status, outcomes[0].message   # "not implemented yet: TODO in ...", the TODO that is left
    first = failing[0]
    where = f"hidden check '{first.check}'" if first.hidden else f"check '{first.check}'"
    message = f"{where}: {first.message}"
    if len(failing) > 1:
        others = len(failing) - 1   # said apart from the message, which may end in a list of checks of its own
        message += f"; {others} more of the {len(outcomes)} checks fail{'s' if others == 1 else ''} too"
    return status, message


def score_part(part, outcomes: list, rubric, evidence, log_usable: bool) -> PartResult:
    """The PartResult of one part from its CheckOutcomes (in the order of the rubric's checks)."""
    points = rubric.parts[part.id]
    earned = worth.earned(rubric, part.id, outcomes)
    for o in outcomes:
        o.points, o.max_points = (round(v, 6) for v in earned[o.check])
    rerun = worth.rounded(rubric, sum(got for got, _ in earned.values()))
    failing = [o for o in outcomes if o.status != Status.PASSED]
    if not failing:
        status, message = Status.PASSED, f"passed all {len(outcomes)} checks"
    else:
        status, message = _failure(outcomes, failing)
        if worth.unearned(rubric, part.id, {o.check for o in outcomes if o.status == Status.PASSED}):
            message += ("; what it passed at one rank earns nothing until it passes a check of more ranks "
                        "(one rank needs none of the part's communication)")
    log_part = None
    log_points = 0.0
    if evidence is not None:
        public = next((o for o in outcomes if not o.hidden), None)
        corroborated = public is not None and public.status == Status.PASSED
        counts = evidence.passed and log_usable and corroborated
        log_points = points.log if counts else 0.0
        log_message = evidence.message
        if evidence.passed and not log_usable:
            log_message += " (not counted: see the notes on the .log)"
        elif evidence.passed and not corroborated:
            log_message += " (not counted: the grader's re-run of this code does not reproduce it)"
        log_part = LogPart(passed=evidence.passed, points=log_points, message=log_message,
                           excerpt=list(evidence.excerpt)[:8])
    return PartResult(part=part.id, status=status, score=worth.rounded(rubric, rerun + log_points),
                      max_score=points.rerun + points.log, rerun_points=rerun,
                      log_points=log_points, message=message, rerun_max=points.rerun, log_max=points.log,
                      checks=outcomes, log=log_part)


def score_handin(result, outcomes_by_part: dict, rubric, log, log_usable: bool) -> None:
    """Fill `result` (a HandinResult) with the parts' results, the penalties and the total."""
    graded = [part for part in PARTS if part.id in rubric.parts]
    for part in graded:
        evidence = log.parts.get(part.id) if log is not None else None
        result.parts[part.id] = score_part(part, outcomes_by_part[part.id], rubric, evidence, log_usable)
        public = next((o for o in outcomes_by_part[part.id] if not o.hidden), None)
        if evidence is not None and evidence.passed and (public is None or public.status != Status.PASSED):
            if "log_not_reproduced" not in result.flags:   # the re-run the log is held against disagrees
                result.flags.append("log_not_reproduced")
    result.max_score = rubric.max_score
    broken = next((p for p in result.parts.values() if p.status == Status.INFRA_ERROR), None)
    if broken is not None:
        result.status = Status.INFRA_ERROR
        result.score = None
        why = explain(Status.INFRA_ERROR.value, broken.message, rubric.limits)
        result.message = (f"the grader's machinery failed while re-running this hand-in ({why.cause}); no score "
                          f"is written: " + (f"{why.fix}, or grade it again" if why.transient else
                                             f"{why.fix}, then grade it again" if why.fix else "grade it again"))
        return
    total = sum(p.score for p in result.parts.values()) - sum(result.penalties.values())
    result.score = worth.rounded(rubric, max(0.0, total))
    result.status = Status.GRADED
    passed = sum(p.status == Status.PASSED for p in result.parts.values())
    result.message = f"{passed} of {len(graded)} parts pass every re-run check"
