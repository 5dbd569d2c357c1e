"""What grading produces, as data: statuses and the results of checks, parts and hand-ins; and
whether a batch in OUT could be graded at all (its canary's outcome, OUT/canary.json)."""

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from functools import lru_cache
from pathlib import Path

from grader import __version__, kit, typed
from grader.names import result_files



class Status(str, Enum):
    """The outcome of one part at one check, of one part overall, or of one hand-in."""
    PASSED = "passed"
    FAILED = "failed"                    # ran, but a value it returned (weight, output, gradient) is wrong
    NOT_IMPLEMENTED = "not_implemented"  # a TODO still raises NotImplementedError
    CRASHED = "crashed"                  # raised, or a rank died
    TIMEOUT = "timeout"                  # ran past its wall clock, or a collective waited in vain
    OOM = "oom"                          # ran out of memory
    NOT_RUN = "not_run"                  # not attempted (e.g. no assignment4.py)
    INFRA_ERROR = "infra_error"          # the grader's machinery failed: not the student's fault
    INVALID = "invalid"                  # the hand-in cannot be graded as handed in (bad zip, no code)
    ERROR = "error"                      # grading this hand-in crashed (a grader bug); see the message
    GRADED = "graded"                    # a hand-in graded to the end

    def __str__(self) -> str:
        return self.value


class ToDict:
    def to_dict(self) -> dict:
        return typed.plain(self)


@dataclass
class CheckOutcome(ToDict):
    """One part re-run at one check (configuration and world size)."""
    check: str
    hidden: bool
    world_size: int
    status: Status
    message: str                       # one sentence, first thing the student reads
    diagnosis: str = ""                # what the difference looks like, when the weights differ
    max_abs_diff: float = None
    failing_ranks: list = field(default_factory=list)
    collectives: dict = field(default_factory=dict)  # op -> calls, over all ranks
    comm_ok: bool = True               # the part communicated as the assignment asks
    comm_message: str = ""
    error: str = ""                    # exception line or why the world ended
    traceback: str = ""                # head of the traceback (public checks only)
    flaky: bool = False                # a failure that passed when run again
    weight_digest: str = ""            # failed on a wrong weight: compare.weight_digest (grader.integrity)
    points: float = None               # of the part's re-run points, earned here (grader.worth)
    max_points: float = None           # ... and possible here


@dataclass
class LogPart(ToDict):
    """The .log's evidence for one part, as scored."""
    passed: bool
    points: float
    message: str
    excerpt: list = field(default_factory=list)


@dataclass
class PartResult(ToDict):
    part: str
    status: Status
    score: float
    max_score: float
    rerun_points: float
    log_points: float
    message: str
    rerun_max: float = 0.0
    log_max: float = 0.0
    checks: list = field(default_factory=list)   # CheckOutcome
    log: LogPart = None


@dataclass
class HandinResult(ToDict):
    student: str
    source: str                        # the hand-in's file or folder name
    sha256: str                        # of the hand-in as received (zip bytes, or its files)
    status: Status
    score: float = None                # None when no score may be written (infra_error, error)
    max_score: float = 0.0
    message: str = ""
    parts: dict = field(default_factory=dict)    # part id -> PartResult
    flags: list = field(default_factory=list)    # codes, e.g. "stale_log", "modified_utils", "flaky"
    notes: list = field(default_factory=list)    # sentences for feedback: file problems, penalties
    penalties: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)    # role -> name in the hand-in
    log: dict = field(default_factory=dict)      # the log report
    err: dict = field(default_factory=dict)      # the .err report
    isolation: dict = field(default_factory=dict)
    torch: str = ""                    # the torch that graded: "2.13.0+cpu (CPU build)", "2.13.0 (CUDA 13.0 build)"
    grader_version: str = ""
    grader_digest: str = ""            # grader.kit.source_digest(): the code that graded it
    rubric_sha256: str = ""
    seconds: float = 0.0
    graded_at: str = ""
    grader_error: str = ""             # grading crashed: the grader's exception and traceback, for the
                                       # TAs (grading.json); never in the student's feedback


@lru_cache(maxsize=1)
def grader_digest() -> str:
    """The grader's source digest, computed once per process (the code does not change under it)."""
    return kit.source_digest()


def new_result(student: str, source: str, sha256: str, rubric) -> HandinResult:
    """A hand-in's result before grading: status `error` until a stage says otherwise."""
    return HandinResult(student=student, source=source, sha256=sha256, status=Status.ERROR,
                        max_score=rubric.max_score, grader_version=__version__, grader_digest=grader_digest(),
                        rubric_sha256=rubric.digest(),
                        graded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def mark_not_run(result: HandinResult, rubric, message: str) -> None:
    """Every part of `result` not run, with `message` as the reason."""
    for part in rubric.part_ids:
        points = rubric.parts[part]
        result.parts[part] = PartResult(part=part, status=Status.NOT_RUN, score=0.0,
                                        max_score=points.log + points.rerun, rerun_points=0.0,
                                        log_points=0.0, message=message, rerun_max=points.rerun,
                                        log_max=points.log)


def ungraded(result: HandinResult, rubric, status: Status, message: str, why_not_run: str,
             score=None) -> HandinResult:
    """`result` as one that could not be graded: `status`, `score` (None: no score may be written),
    the message, and every part not yet scored marked not run for `why_not_run`."""
    result.status, result.score, result.message = status, score, message
    if not result.parts:
        mark_not_run(result, rubric, why_not_run)
    return result


def grading_crashed(result: HandinResult, rubric, error: BaseException, traceback: str) -> HandinResult:
    """`result` as one whose grading crashed (a grader bug): the student reads that it did and that
    it says nothing of their code; the exception and `traceback` go to `grader_error`, for the TAs
    only (the grader's text may quote anything it was handling, a hidden check's values included)."""
    ungraded(result, rubric, Status.ERROR, f"grading this hand-in failed ({type(error).__name__}, a grader "
             f"bug, not your code): the course staff have the details", "not run: grading failed")
    result.grader_error = f"{type(error).__name__}: {error}\n{traceback[-3000:]}"
    return result


CANARY = "canary.json"   # OUT/canary.json: the reference's re-run before the latest grading into OUT
UNGRADABLE_TODO = ("run `python -m grader doctor` on this machine and read the rubric's `limits` and `timeouts`; "
                   "then run the same `grade` again (hand-ins without a score are graded again, the rest are kept)")


class Cause(str, Enum):
    """Why a batch's canary failed: each its own fix (grader.pipeline.canary)."""
    REFERENCE = "reference"   # the reference ran and its answers are wrong: its code is
    LIMITS = "limits"         # the rubric's limits or timeouts are smaller than the reference needs
    MACHINE = "machine"       # this machine cannot run a world

    def __str__(self) -> str:
        return self.value


@dataclass
class Canary(ToDict):
    """The reference solution re-run at every check before hand-ins are graded (grader.pipeline.canary)."""
    status: Status            # passed; infra_error (nothing can be trusted); not_run (no reference here)
    cause: str = ""           # what failed, in one line
    kind: str = ""            # a Cause value, when it failed
    fix: str = ""             # what to do about it, in one line
    ran_at: str = ""
    grader_digest: str = ""
    rubric_sha256: str = ""
    clocks: dict = field(default_factory=dict)   # check -> the part clock the batch grades it with (grader.limits.part_clock)


def write_canary(out, canary: Canary) -> None:
    kit.write_json(Path(out) / CANARY, canary.to_dict(), sort_keys=True)


def read_canary(out):
    """OUT's latest canary (None when no grading has run the reference into OUT)."""
    try:
        data = json.loads((Path(out) / CANARY).read_text())
        return Canary(status=Status(data["status"]), cause=str(data.get("cause", "")), ran_at=str(data.get("ran_at", "")),
                      grader_digest=str(data.get("grader_digest", "")), rubric_sha256=str(data.get("rubric_sha256", "")),
                      clocks={str(k): float(v) for k, v in (data.get("clocks") or {}).items()},
                      kind=str(data.get("kind", "")), fix=str(data.get("fix", "")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def ungradable(out) -> str:
    """'' when the batch in OUT was graded; else one line for the top of every report, the exit of
    `grade` and the refusal of `gradebook`: the latest canary failed (the grading machine cannot run
    the reference solution), or OUT holds results and every one is infra_error. The cause, then
    what to do."""
    canary = read_canary(out)
    todo = UNGRADABLE_TODO
    if canary is not None and canary.status == Status.INFRA_ERROR:
        cause, todo = canary.cause, canary.fix or todo
    else:
        statuses, cause = set(), ""
        for path in result_files(out):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            statuses.add(data.get("status"))
            cause = cause or str(data.get("message", "")).removeprefix("not graded: ").removesuffix("; grade it again")
        if statuses != {Status.INFRA_ERROR.value}:
            return ""
    cause = " ".join(cause.split())[:1200] or "the grading machine failed"   # the cause and its fix
    return f"Not graded: no hand-in has a score, because {cause}. What to do: {todo}."
