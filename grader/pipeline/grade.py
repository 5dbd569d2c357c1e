"""Grade one hand-in: unpack -> log evidence -> re-run at every check -> compare -> score.

`grade_handin` always returns a HandinResult: a hand-in that cannot be graded as handed in is
`invalid` (with the reason; no score unless the rubric's `files.invalid_scores_zero`), a crash of
the grader itself is `error` (no score; its traceback in grading.json's `grader_error` only), and a failure of the re-run machinery is `infra_error`
(no score).
"""

import difflib
import hashlib
import shutil
import time
import traceback
from pathlib import Path

from grader import kit
from grader.evidence.errfile import parse_err
from grader.evidence.logtext import read_log
from grader.evidence.runs import rule_of
from grader.intake import handin as handins
from grader.parts import PART_IDS
from grader.rerun import check as rerun
from grader.rerun.sandbox import scratch_dir
from grader.results import CheckOutcome, HandinResult, Status, grading_crashed, new_result, ungraded
from grader.verdict import backward, compare, megatron
from grader.verdict.say import Say
from grader.verdict.score import log_validity, score_handin

RETRIED = (Status.FAILED, Status.CRASHED, Status.TIMEOUT, Status.OOM)
DIFF_LINE_CHARS = 200   # characters shown of a line of the utils.py diff
DIFF_READ = 5000        # lines of a handed-in utils.py compared (its first lines are what differ)


def _utils_notes(student_utils: Path) -> list:
    theirs = student_utils.read_text(errors="replace").splitlines()
    ours = kit.UTILS.read_text().splitlines()
    if theirs == ours:
        return []
    diff = list(difflib.unified_diff(ours, theirs[:DIFF_READ], "utils.py (provided)", "utils.py (handed in)",
                                     lineterm="", n=1))
    shown = "\n".join(d if len(d) <= DIFF_LINE_CHARS else d[:DIFF_LINE_CHARS] + kit.CUT
                      for d in diff[:24]) + ("\n..." if len(diff) > 24 else "")
    return [f"utils.py differs from the provided one; the grader ran your code with the provided copy:\n"
            f"```diff\n{shown}\n```"]


def judge_check(executor, code, check, rubric, scratch, parts=PART_IDS, passed=None, hung=()) -> dict:
    """Re-run `parts` (those of the rubric the check runs) at `check` and judge them. A failure is
    run once more: a flip to passed is flagged flaky (the failure stands, for a person to look at);
    when the machinery failed, the second run decides, since the first said nothing about the code.
    `passed`: part -> the checks it passed already (grader.verdict.diagnose uses them). `hung`: the
    parts whose timeout at an earlier check timed out again when run once more; a timeout of theirs
    is not run again (each costs the part's whole clock, and the failure stands either way)."""
    parts = [p for p in parts if p in rubric.parts_at(check)]
    say = Say(check, [c for c in rubric.checks if not c.hidden])
    passed = passed or {}

    def verdict(p, run):
        # The reference is computed from the data this very run was served (every world draws its own).
        if p == "megatron_mlp":
            made = megatron.served if check.kind == "backward" else megatron.stepped
            exp = made(check, rubric.learning_rate, run.data) if run.status == Status.PASSED else None
            judge = megatron.judge_backward if check.kind == "backward" else megatron.judge_step
        else:
            exp = None
            if run.status == Status.PASSED:
                exp = backward.expected_layer(check, run.data) if check.kind == "backward" else \
                    compare.expected(check, rubric.learning_rate, run.data, p)
            judge = backward.judge if check.kind == "backward" else compare.judge
        return judge(run, exp, p, check, rubric.tolerance, say, passed.get(p, ()))

    runs = rerun.run_check(executor, code, check, rubric, scratch, parts)
    judged = {p: verdict(p, runs[p]) for p in parts}
    again = [p for p, o in judged.items() if o.status in RETRIED + (Status.INFRA_ERROR,)
             and not (o.status == Status.TIMEOUT and p in hung)]
    if again:
        reruns = rerun.run_check(executor, code, check, rubric, scratch, again)
        for p in again:
            second = verdict(p, reruns[p])
            if judged[p].status == Status.INFRA_ERROR:
                judged[p] = second
            else:
                judged[p].flaky = second.status == Status.PASSED
    return judged


MISSING = {"utils": "utils.py is missing from the hand-in",
           "log": "no log of a run is in the hand-in (no file holds the run's [Distributed Init] and part lines, "
                  "whatever its name)",
           "err": "the run's stderr (the job's .err) is missing from the hand-in"}


def _file_notes(result: HandinResult, files: dict, rubric) -> None:
    """Penalties and notes for what is missing from the hand-in, or changed in its utils.py."""
    for role, key in (("utils", "penalty_missing_utils"), ("log", "penalty_missing_log"), ("err", "penalty_missing_err")):
        if role not in files:
            penalty = getattr(rubric.files, key)
            result.flags.append(f"missing_{role}")
            result.notes.append(MISSING[role] + (f" (-{penalty:g} points)" if penalty else ""))
            if penalty:
                result.penalties[f"missing_{role}"] = penalty
    if "utils" in files:
        notes = _utils_notes(files["utils"])
        if notes:
            result.flags.append("modified_utils")
            result.notes += notes
            if rubric.files.penalty_modified_utils:
                result.penalties["modified_utils"] = rubric.files.penalty_modified_utils


def _log_evidence(result: HandinResult, unpacked, code_sha256: str, rubric) -> tuple:
    """Read the run's stdout and stderr into `result`; return (the log report or None, whether its
    claims count)."""
    files = unpacked.files
    log_report = unpacked.run.report if unpacked.run is not None else None
    if log_report is not None:
        result.log = log_report.to_dict()
        result.log["parts"] = {p: e for p, e in result.log["parts"].items() if p in rubric.parts}   # the course's
    if "err" in files:
        err_report = parse_err(read_log(files["err"]))
        result.err = err_report.to_dict()
        for flag in err_report.flags:
            result.flags.append(f"err_{flag.code}")
            result.notes.append(f"{'stderr' if files['err'] == files.get('log') else '.err'}: {flag.message}")
    log_usable, flags, notes = log_validity(log_report, code_sha256, rubric)
    result.flags += flags
    result.notes += notes
    return log_report, log_usable


def _rerun_all(result: HandinResult, assignment: Path, rubric, executor, work: Path, deadline: float) -> dict:
    """Every part at every check of the rubric that runs it, within the hand-in's time: part -> [CheckOutcome]."""
    code = rerun.prepare_code(assignment)
    outcomes = {p: [] for p in rubric.part_ids}
    passed = {p: [] for p in rubric.part_ids}
    hung = set()   # parts whose timeout was run once more and timed out again (judge_check)
    for check in rubric.checks:
        if time.monotonic() > deadline:
            for p in rubric.parts_at(check):
                outcomes[p].append(CheckOutcome(check=check.name, hidden=check.hidden,
                                                world_size=check.world_size, status=Status.TIMEOUT,
                                                message=f"not run: the hand-in's {rubric.timeouts.handin:g} s were used up"))
            continue
        for p, outcome in judge_check(executor, code, check, rubric, work, passed=passed, hung=hung).items():
            outcomes[p].append(outcome)
            if outcome.status == Status.PASSED:
                passed[p].append(check)
            if outcome.status == Status.TIMEOUT and not outcome.flaky:
                hung.add(p)
            if outcome.flaky and "flaky" not in result.flags:
                result.flags.append("flaky")
    return outcomes


def torch_build() -> str:
    """The torch that grades, as grading.json and the staff report name it: its version (its local
    part, +cpu, names the CPU wheel; the CUDA wheel may have none) and its build, CPU or CUDA."""
    import torch   # loaded already: the verdict compares with it
    cuda = getattr(torch.version, "cuda", None)
    return f"{torch.__version__} ({f'CUDA {cuda} build' if cuda else 'CPU build'})"


def grade_handin(handin, rubric, executor, scratch: Path) -> HandinResult:
    """Grade `handin` (a grader.intake.handin.Handin) with `executor`; see the module docstring."""
    started = time.monotonic()
    result = new_result(handin.student, handin.name, handin.sha256, rubric)
    result.torch = torch_build()
    work = Path(scratch_dir("handin-", scratch))
    try:
        try:
            unpacked = handins.unpack(handin, work / "files", rubric.files, rule_of(rubric))
        except handins.HandinError as e:
            return ungraded(result, rubric, Status.INVALID, str(e), "not run: the hand-in could not be unpacked",
                            score=0.0 if rubric.files.invalid_scores_zero else None)
        files = unpacked.files
        result.notes += unpacked.notes
        result.files = {role: str(path.relative_to(unpacked.root)) for role, path in files.items()}
        code_sha256 = hashlib.sha256(files["assignment"].read_bytes()).hexdigest()
        _file_notes(result, files, rubric)
        log_report, log_usable = _log_evidence(result, unpacked, code_sha256, rubric)
        outcomes = _rerun_all(result, files["assignment"], rubric, executor, work, started + rubric.timeouts.handin)
        result.isolation = dict(getattr(executor, "isolation", {}))   # as it was for these re-runs
        score_handin(result, outcomes, rubric, log_report, log_usable)
        result.notes = list(dict.fromkeys(result.notes))   # one note, said once
    except Exception as e:  # noqa: BLE001 - one hand-in's grading bug must not end the batch
        grading_crashed(result, rubric, e, traceback.format_exc())
    finally:
        shutil.rmtree(work, ignore_errors=True)
        result.seconds = round(time.monotonic() - started, 3)
    return result
