"""The canary: the reference solution re-run and judged at every check before a batch's hand-ins
(and by `doctor`), and, when it does not pass, which of three causes stopped it, each with its fix
(grader.results.Cause):

- reference: the reference ran and its answers are wrong (a weight, an output, a gradient): its
  code is wrong. The part, the check and the diagnosis are named; the fix is the reference's.
- limits: the rubric's `limits` or `timeouts` are below grader/limits.py's defaults and too small
  for the reference. The failing check is run once more with each lowered value at its default;
  if it passes then, each one too small is named with what the reference used there (its memory
  and tasks, measured from outside as doctor measures them, and its seconds).
- machine: this machine cannot run a world (grader.rerun.machine.explain: the cause and its fix).
"""

import dataclasses
import time
from datetime import datetime, timezone

from grader import kit
from grader.limits import Limits, part_clock
from grader.parts import BY_ID
from grader.pipeline.grade import judge_check
from grader.pipeline.peak import Peak
from grader.rerun import machine
from grader.rerun.check import prepare_code
from grader.results import UNGRADABLE_TODO, Canary, Cause, Status, grader_digest
from grader.rubric import Timeouts

RAN = (Status.FAILED, Status.NOT_IMPLEMENTED)   # the reference ran to the end: its answers are wrong
# A failure a limit may have caused: a rank killed (SIGKILL -9, SIGXCPU -24, SIGXFSZ -25), out of
# memory or of tasks, out of time. A rank's own exception (gloo that cannot start) is not one.
LIMITED = ("-9", "-24", "-25", "killed", *machine.MEMORY, *machine.TASKS)
FIX_REFERENCE = (f"fix the reference ({kit.REFERENCE.relative_to(kit.ROOT)}) until `python -m grader doctor` "
                 f"passes (it re-runs the reference at every check and checks its answers); then run the same "
                 f"`grade` again (hand-ins without a score are graded again, the rest are kept)")


@dataclasses.dataclass
class Used:
    """What the reference used at one check, run with the rubric's lowered limits at their defaults."""
    memory_mb: int   # the most, its worlds together (Pss); 0 where /proc cannot tell
    tasks: int       # the most processes and threads at once
    seconds: float   # the whole check, every part and every retry


def lowered(rubric) -> dict:
    """"limits.memory_mb" -> (the rubric's value, grader/limits.py's default), for each limit and
    timeout the rubric sets below its default."""
    out = {}
    for section, defaults in (("limits", Limits()), ("timeouts", Timeouts())):
        for key, default in dataclasses.asdict(defaults).items():
            value = getattr(getattr(rubric, section), key)
            if value < default:
                out[f"{section}.{key}"] = (value, default)
    return out


def _roomy(rubric):
    """`rubric` with every lowered limit and timeout at its default."""
    limits = Limits(**{k: max(v, getattr(Limits(), k)) for k, v in dataclasses.asdict(rubric.limits).items()})
    timeouts = Timeouts(**{k: max(v, getattr(Timeouts(), k)) for k, v in dataclasses.asdict(rubric.timeouts).items()})
    return dataclasses.replace(rubric, limits=limits, timeouts=timeouts)


def used(fresh, rubric, check, code: dict, scratch):
    """Run `check` again with the rubric's lowered values at their defaults, on an executor of
    `fresh(limits)`: what the reference used (Used), or None when it fails there too."""
    roomy = _roomy(rubric)
    executor = fresh(roomy.limits)
    try:
        executor.start()   # the helper's own memory is not the world's: measured from here on
        started = time.monotonic()
        with Peak() as peak:
            judged = judge_check(executor, code, check, roomy, scratch)
        seconds = time.monotonic() - started
    except (OSError, RuntimeError):   # CannotGrade included: the machine, then
        return None
    finally:
        executor.close()
    if any(o.status != Status.PASSED for o in judged.values()):
        return None
    return Used(peak.memory_mb, peak.tasks, seconds)


def _too_small(low: dict, need: Used, timed_out: bool) -> dict:
    """Of the lowered values, those the reference needs more of: its timeouts where it ran out of
    time, else its limits measured too small (all of them where none is measured)."""
    low = {k: v for k, v in low.items() if k.startswith("timeouts.") == timed_out} or low
    measured = {"limits.memory_mb": need.memory_mb and need.memory_mb * 5 // 4, "limits.processes": need.tasks and need.tasks + 8}
    return {k: v for k, v in low.items() if measured.get(k) and v[0] < measured[k]} or low


def _needed(key: str, need: Used) -> str:
    if key == "limits.memory_mb" and need.memory_mb:
        return f"a world of the reference used {need.memory_mb} MB"
    if key == "limits.processes" and need.tasks:
        return f"a world of the reference ran {need.tasks} processes and threads at once"
    if key.startswith("timeouts."):
        return f"the reference took {need.seconds:.1f} s for the whole check"
    return "the reference passed with the default"


def _unit(key: str) -> str:
    return " MB" if key.endswith("_mb") else " s" if key.startswith("timeouts.") or key.endswith("_s") else ""


def limits_cause(head: str, check, low: dict, need: Used, timed_out: bool) -> tuple:
    """(cause, fix) where the reference passed `check` only with the lowered values at their defaults."""
    small = _too_small(low, need, timed_out)
    said = "; ".join(f"{key} ({value:g}{_unit(key)}, default {default:g}) is less than it needs: {_needed(key, need)}"
                     for key, (value, default) in small.items())
    least = {"limits.memory_mb": need.memory_mb * 2, "limits.processes": need.tasks * 2}
    fix = ", ".join(f"{key} {least.get(key) or default:g}" for key, (_, default) in small.items())
    sections = sorted({key.split(".")[0] for key in small})
    return (f"{head}: the rubric's {' and '.join(sections)} are too small for the reference solution: {said}; "
            f"with {'that' if len(small) == 1 else 'those'} at the default it passed check '{check.name}'",
            f"raise {', '.join(small)} in the rubric (e.g. {fix}: twice what the reference used where measured, "
            f"else the default) or leave "
            f"{'it' if len(small) == 1 else 'them'} out, then run the same `grade` again (hand-ins without a score "
            f"are graded again, the rest are kept); `python -m grader doctor --rubric FILE` measures a world")


def _cause(part: str, outcome, check, rubric, code: dict, scratch, fresh) -> tuple:
    """(Cause, cause, fix) of the reference's `outcome` of `part` at `check`."""
    message = " ".join(outcome.message.split())
    if outcome.status in RAN:
        diagnosis = " ".join((outcome.diagnosis or "").split())
        return (Cause.REFERENCE, f"the reference solution is wrong, not the machine or the students: its "
                f"{BY_ID[part].title} ran at check '{check.name}' and {outcome.status}: {message}"
                + (f" ({diagnosis})" if diagnosis and diagnosis not in message else ""), FIX_REFERENCE)
    head = f"the reference solution fails {part} at check '{check.name}' ({outcome.status}: {message})"
    low = lowered(rubric)
    if low and fresh is not None and (outcome.status in (Status.OOM, Status.TIMEOUT)
                                      or any(s in message.lower() for s in LIMITED)):
        need = used(fresh, rubric, check, code, scratch)
        if need is not None:
            return (Cause.LIMITS, *limits_cause(head, check, low, need, outcome.status == Status.TIMEOUT))
    why = machine.explain(outcome.status.value, outcome.message, rubric.limits)
    return (Cause.MACHINE, f"{head}; the grading machine cannot grade: {why.cause}"
            + (f"; {why.fix}" if why.fix else "") + ("; grade it again" if why.transient else ", then grade again"),
            UNGRADABLE_TODO)


def canary(executor, rubric, scratch, fresh=None) -> Canary:
    """Re-run the reference at every check: passed, with each check's part clock for the batch
    (grader.limits.part_clock: from the reference's time at that check, on this machine, now), or
    infra_error with the first failure's Cause,
    the cause in words and its fix. `fresh(limits)`: a new executor like `executor` with other
    limits (to tell the rubric's limits from the machine; without it a failure is the machine's)."""
    said = Canary(status=Status.NOT_RUN, cause="no reference solution in this tree", grader_digest=grader_digest(),
                  rubric_sha256=rubric.digest(), ran_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    if not kit.REFERENCE.exists():
        return said
    code = prepare_code(kit.REFERENCE)
    for check in rubric.checks:
        started = time.monotonic()
        judged = judge_check(executor, code, check, rubric, scratch)
        said.clocks[check.name] = part_clock(time.monotonic() - started, rubric.timeouts.part)
        for part, outcome in judged.items():
            if outcome.status != Status.PASSED:
                kind, said.cause, said.fix = _cause(part, outcome, check, rubric, code, scratch, fresh)
                said.status, said.kind = Status.INFRA_ERROR, kind.value
                return said
    said.status, said.cause = Status.PASSED, ""
    return said

