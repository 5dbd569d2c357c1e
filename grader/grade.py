"""Grade one hand-in: unpack -> log evidence -> re-run at every check -> compare -> score.

`grade_handin` always returns a HandinResult: a hand-in that cannot be graded as handed in is
`invalid` (score 0, with the reason), a crash of the grader itself is `error` (no score), and a
failure of the re-run machinery is `infra_error` (no score).
"""

import difflib
import hashlib
import shutil
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

from grader import __version__, compare, handin as handins, logs, rerun
from grader.parts import PART_IDS
from grader.results import CheckOutcome, HandinResult, PartResult, Status
from grader.sandbox import scratch_dir
from grader.score import log_validity, score_handin

RETRIED = (Status.FAILED, Status.CRASHED, Status.TIMEOUT, Status.OOM)


def new_result(handin, rubric) -> HandinResult:
    return HandinResult(student=handin.student, source=handin.name, sha256=handin.sha256,
                        status=Status.ERROR, max_score=rubric.max_score, grader_version=__version__,
                        rubric_sha256=rubric.digest(),
                        graded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def mark_not_run(result, rubric, message: str) -> None:
    for part in PART_IDS:
        points = rubric.parts[part]
        result.parts[part] = PartResult(part=part, status=Status.NOT_RUN, score=0.0,
                                        max_score=points.log + points.rerun, rerun_points=0.0,
                                        log_points=0.0, message=message, rerun_max=points.rerun,
                                        log_max=points.log)


def _utils_notes(student_utils: Path) -> list:
    theirs = student_utils.read_text(errors="replace").splitlines()
    ours = rerun.TRUSTED_UTILS.read_text().splitlines()
    if theirs == ours:
        return []
    diff = list(difflib.unified_diff(ours, theirs, "utils.py (provided)", "utils.py (handed in)", lineterm="", n=1))
    shown = "\n".join(diff[:24]) + ("\n..." if len(diff) > 24 else "")
    return [f"utils.py differs from the provided one; the grader ran your code with the provided copy:\n"
            f"```diff\n{shown}\n```"]


def judge_check(executor, code, check, rubric, scratch, parts=PART_IDS) -> dict:
    """Re-run `parts` at `check` and judge them. A failure is run once more: a flip to passed is
    flagged flaky (the failure stands, for a person to look at); when the machinery failed, the
    second run decides, since the first said nothing about the code."""
    exp = compare.expected(check, rubric.learning_rate)
    runs = rerun.run_check(executor, code, check, rubric, scratch, parts)
    judged = {p: compare.judge(runs[p], exp, p, check, rubric.tolerance) for p in parts}
    again = [p for p, o in judged.items() if o.status in RETRIED + (Status.INFRA_ERROR,)]
    if again:
        reruns = rerun.run_check(executor, code, check, rubric, scratch, again)
        for p in again:
            second = compare.judge(reruns[p], exp, p, check, rubric.tolerance)
            if judged[p].status == Status.INFRA_ERROR:
                judged[p] = second
            else:
                judged[p].flaky = second.status == Status.PASSED
    return judged


def grade_handin(handin, rubric, executor, scratch: Path) -> HandinResult:
    """Grade `handin` (a grader.handin.Handin) with `executor`; see the module docstring."""
    started = time.monotonic()
    result = new_result(handin, rubric)
    work = Path(scratch_dir("handin-", scratch))
    try:
        try:
            unpacked = handins.unpack(handin, work / "files", rubric.files)
        except handins.HandinError as e:
            result.status, result.score, result.message = Status.INVALID, 0.0, str(e)
            mark_not_run(result, rubric, "not run: the hand-in could not be unpacked")
            return result
        files = unpacked.files
        result.notes += unpacked.notes
        result.files = {role: str(path.relative_to(unpacked.root)) for role, path in files.items()}
        code_bytes = files["assignment"].read_bytes()
        code_sha256 = hashlib.sha256(code_bytes).hexdigest()
        for role, name, key in (("utils", "utils.py", "penalty_missing_utils"), ("log", "the .log", "penalty_missing_log"),
                                ("err", "the .err", "penalty_missing_err")):
            if role not in files:
                penalty = getattr(rubric.files, key)
                result.flags.append(f"missing_{role}")
                result.notes.append(f"{name} is missing from the hand-in" + (f" (-{penalty:g} points)" if penalty else ""))
                if penalty:
                    result.penalties[f"missing_{role}"] = penalty
        if "utils" in files:
            notes = _utils_notes(files["utils"])
            if notes:
                result.flags.append("modified_utils")
                result.notes += notes
                if rubric.files.penalty_modified_utils:
                    result.penalties["modified_utils"] = rubric.files.penalty_modified_utils

        log_report = None
        if "log" in files:
            log_report = logs.parse_log(files["log"].read_bytes(), min_world_size=rubric.log_min_world_size)
            result.log = log_report.to_dict()
        if "err" in files:
            err_report = logs.parse_err(files["err"].read_bytes())
            result.err = err_report.to_dict()
            for flag in err_report.flags:
                result.flags.append(f"err_{flag.code}")
                result.notes.append(f".err: {flag.message}")
        log_usable, flags, notes = log_validity(log_report, code_sha256, rubric)
        result.flags += flags
        result.notes += notes

        result.isolation = dict(getattr(executor, "isolation", {}))
        code = rerun.prepare_code(files["assignment"], work)
        outcomes = {p: [] for p in PART_IDS}
        deadline = started + rubric.timeouts.handin
        for check in rubric.checks:
            if time.monotonic() > deadline:
                for p in PART_IDS:
                    outcomes[p].append(CheckOutcome(check=check.name, hidden=check.hidden,
                                                    world_size=check.world_size, status=Status.TIMEOUT,
                                                    message=f"not run: the hand-in's {rubric.timeouts.handin:g} s were used up"))
                continue
            for p, outcome in judge_check(executor, code, check, rubric, work).items():
                outcomes[p].append(outcome)
                if outcome.flaky and "flaky" not in result.flags:
                    result.flags.append("flaky")
        score_handin(result, outcomes, rubric, log_report, log_usable)
    except Exception as e:  # noqa: BLE001 - one hand-in's grading bug must not end the batch
        result.status, result.score = Status.ERROR, None
        result.message = f"grading this hand-in failed: {type(e).__name__}: {e}"
        result.notes.append("grader traceback:\n```\n" + traceback.format_exc()[-3000:] + "```")
        if not result.parts:
            mark_not_run(result, rubric, "not run: grading failed")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        result.seconds = round(time.monotonic() - started, 3)
    return result
