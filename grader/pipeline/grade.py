"""Grade one hand-in: unpack -> log evidence -> re-run at every check -> compare -> score.

`grade_handin` always returns a HandinResult: a hand-in that cannot be graded as handed in is
`invalid` (with the reason; no score unless the rubric's `files.invalid_scores_zero`), a crash of
the grader itself is `error` (no score; its traceback in grading.json's `grader_error` only), and a failure of the re-run machinery is `infra_error`
(no score).
"""

import dataclasses
import difflib
import hashlib
import random
import shutil
import time
import traceback
from pathlib import Path

from grader import kit
from grader.limits import PART_FACTOR, PART_FLOOR_SECONDS
from grader.evidence.errfile import parse_err
from grader.evidence.logtext import read_log
from grader.evidence.runs import rule_of
from grader.intake import handin as handins
from grader.parts import BY_ID, PART_IDS
from grader.rerun import check as rerun
from grader.rerun import machine
from grader.rerun.sandbox.namespaces import scratch_dir
from grader.results import CheckOutcome, HandinResult, Status, grading_crashed, new_result, ungraded
from grader.verdict import carried, comm
from grader.verdict.judging import judging
from grader.verdict.say import Say
from grader.verdict.score import log_validity, score_handin

RETRIED = (Status.FAILED, Status.CRASHED, Status.TIMEOUT, Status.OOM)
# What a timeout on a batch's clock (grader.limits.part_clock) adds to its message.
CLOCK_SAID = (f"the part's clock here was {{clock:g}} s: {PART_FACTOR:g} times what the reference solution "
              f"took at this check on the grading machine, and at least {PART_FLOOR_SECONDS:g} s")
DIFF_LINE_CHARS = 200   # characters shown of a line of the utils.py diff
DIFF_READ = 5000        # lines of a handed-in utils.py compared (its first lines are what differ)
DIFF_BYTES = 1 << 20    # bytes of it read (the provided one is a few KB; any longer differs anyway)


def _utils_notes(student_utils: Path) -> list:
    with open(student_utils, "rb") as f:
        data = f.read(DIFF_BYTES + 1)
    theirs = data[:DIFF_BYTES].decode("utf-8", "replace").splitlines()
    ours = kit.UTILS.read_text().splitlines()
    if len(data) > DIFF_BYTES:   # read in part: compared with as many of ours, its last line cut short
        ours = ours[:len(theirs)]
    if theirs == ours:
        return []
    diff = list(difflib.unified_diff(ours, theirs[:DIFF_READ], "utils.py (provided)", "utils.py (handed in)",
                                     lineterm="", n=1))
    shown = "\n".join(d if len(d) <= DIFF_LINE_CHARS else d[:DIFF_LINE_CHARS] + kit.CUT
                      for d in diff[:24]) + ("\n..." if len(diff) > 24 else "")
    return [f"utils.py differs from the provided one; the grader ran your code with the provided copy:\n"
            f"```diff\n{shown}\n```"]


def judge_check(executor, code, check, rubric, scratch, parts=PART_IDS, passed=None, clock=None,
                matter=None, deadline=None) -> dict:
    """Re-run `parts` (those of the rubric the check runs) at `check` and judge them. A failure is
    run once more: a flip to passed is flagged flaky (the failure stands, for a person to look at).
    The second run decides where the first said nothing about the code: the machinery failed, or
    the part ran past its clock in a world kept from the CPU (grader.rerun.starved), which runs
    again on the rubric's own clock. A part past its clock with the CPU it wanted hung: it is not
    run again. `passed`: part -> the checks it passed already (grader.verdict.diagnose uses them).
    `clock`: each part's wall clock here, in seconds (a batch's, grader.limits.part_clock), else
    the rubric's timeouts.part. `matter`: whether each parallel part's collectives made its values,
    by (part, kind), as the hand-in's earlier checks showed it (_collectives_matter); None: not asked.
    `deadline`: when the hand-in's time is up (time.monotonic()); no world of it starts after."""
    parts = [p for p in parts if p in rubric.parts_at(check)]
    measured = clock is not None and clock < rubric.timeouts.part   # else the rubric's own clock
    clocked = dataclasses.replace(rubric, timeouts=dataclasses.replace(rubric.timeouts, part=clock)) \
        if clock is not None else rubric
    say = Say(check, [c for c in rubric.checks if not c.hidden])
    passed = passed or {}
    judged_on = {}   # part -> (the run, the values expected) its outcome here was judged on

    def verdict(p, run, carried_too=True):
        # Each part is judged as its record says for this kind of check (grader.verdict.judging); the
        # reference is computed from the data this very run was served (every world draws its own).
        way = judging(p, check.kind)
        exp = way.expected(check, rubric.learning_rate, run.data, p) if run.status == Status.PASSED else None
        outcome = way.judge(run, exp, p, check, rubric.tolerance, say, passed.get(p, ()))
        # Right values count only with the part's collectives behind them, carrying what its
        # algorithm moves (grader.verdict.comm, grader.verdict.carried); a scaled world's values
        # alone say what it shows (what its ranks hand on follows from what they were handed).
        outcome = comm.hold(outcome, run, p, check, say)
        if carried_too:
            outcome = carried.hold(outcome, run, p, check, exp, say)
            judged_on[p] = run, exp
        return comm.handed_out(outcome, run, p, check, say)

    runs = rerun.run_check(executor, code, check, clocked, scratch, parts, deadline=deadline)
    judged = {p: verdict(p, runs[p]) for p in parts}
    if measured:
        for outcome in (o for o in judged.values() if o.status == Status.TIMEOUT):
            outcome.message += f" ({CLOCK_SAID.format(clock=clock)})"
    decide = [p for p, o in judged.items() if o.status == Status.INFRA_ERROR or runs[p].starved]
    again = [p for p, o in judged.items() if o.status in RETRIED and runs[p].starved is None and p not in decide]
    for p, second in _run_again(executor, code, check, rubric, scratch, decide, verdict, deadline).items():
        judged[p] = second
    for p, second in _run_again(executor, code, check, clocked, scratch, again, verdict, deadline).items():
        judged[p].flaky = second.status == Status.PASSED
    if matter is not None and check.world_size > 1:
        _collectives_matter(executor, code, check, clocked, scratch, judged, verdict, matter, say, deadline, judged_on)
    return judged


def _collectives_matter(executor, code, check, rubric, scratch, judged: dict, verdict, matter: dict, say,
                        deadline=None, judged_on=None) -> None:
    """Each parallel part that passed at `check` (of several ranks) the first time at its kind, and
    at every hidden check, runs once more, in a world that changes what its collectives return
    (grader.verdict.comm): values still right there did not come from them, and the part fails
    here and at every later check of several ranks of that kind. A hidden check is scaled again,
    since code can tell the public check apart (its seed and sizes are the students') and do the
    parallel work there alone. A scaled world the hand-in's code did not run through (a crash, a
    timeout, out of memory) shows nothing: the part fails here for it, and the next check of the
    kind scales again; one the machine failed, or kept from the CPU, shows nothing either way.
    `matter`: (part, kind) -> "" where its collectives were shown to make its values, else where
    they were shown not to. Where the part's moves were placed in the calls of the run it passed
    (`judged_on`: part -> (run, values expected); grader.verdict.carried.move_targets), each move
    is changed alone, in a world of its own (the parts share them: as many worlds as the part with
    most moves has, at most MOVE_WORLDS): every move's result must reach the values, so one move
    whose result is used does not cover for others computed and dropped, and data carried beside a
    move, or in calls that carry none, stays as it was. Elsewhere one world changes every call."""
    passed = [p for p, o in judged.items() if o.status == Status.PASSED and BY_ID[p].moves]
    for p in (p for p in passed if matter.get((p, check.kind))):
        comm.independent(judged[p], p, check, say, shown_at=matter[p, check.kind])
    unknown = [p for p in passed if (p, check.kind) not in matter or (check.hidden and not matter[p, check.kind])]
    rounds = {p: _rounds(p, check, *judged_on[p]) if p in (judged_on or {}) else [(None, None)] for p in unknown}
    shown = {p: [] for p in unknown}   # part -> (move's index or None, its outcome in the world that changed it)
    for j in range(max(map(len, rounds.values()), default=0)):
        now = [p for p in unknown if j < len(rounds[p]) and not any(o.status == Status.PASSED for _, o, _ in shown[p])]
        scaling = {p: rounds[p][j][1] for p in now if rounds[p][j][1] is not None} or True
        runs = rerun.run_check(executor, code, check, rubric, scratch, now, scaled=scaling, deadline=deadline) if now else {}
        for p in now:
            shown[p].append((rounds[p][j][0], verdict(p, runs[p], carried_too=False), runs[p].starved))
    for p in unknown:
        right = next((move for move, o, _ in shown[p] if o.status == Status.PASSED), False)
        if right is not False:
            matter[p, check.kind] = _named(check)
            comm.independent(judged[p], p, check, say, move=right)
        elif all(o.status == Status.FAILED for _, o, _ in shown[p]):   # wrong values: they came through the collectives
            matter[p, check.kind] = ""
        else:
            failed = next((o for _, o, starved in shown[p] if o.status not in (Status.FAILED, Status.INFRA_ERROR)
                           and not starved), None)
            if failed is not None:
                comm.unshown(judged[p], p, check, say, failed.message)


MOVE_WORLDS = 3   # moves of a part changed each alone at one check (of those it has, drawn)


def _rounds(part_id: str, check, run, exp) -> list:
    """[(the index of the move changed alone, or None: all; its targets, or None: every call
    whole)], one per scaled world the part needs at `check`. A part of more moves than MOVE_WORLDS
    has a few of them drawn afresh at every check, so no move is known to be left as it was; a move
    that is the sum of several calls (micro-batches) has a world for each of them, so that no call
    of data posing as one of them goes unchanged for want of a draw."""
    each = carried.move_targets(part_id, check, run, exp)
    if not each:
        return [(None, None)]
    moves = sorted({j for j, _ in each})
    drawn = moves if len(moves) <= MOVE_WORLDS else random.sample(moves, MOVE_WORLDS)
    return [(j, t) for j, t in each if j in drawn]


def _run_again(executor, code, check, rubric, scratch, parts: list, verdict, deadline=None) -> dict:
    """`parts` run once more at `check`, each judged by `verdict`: part -> its outcome."""
    runs = rerun.run_check(executor, code, check, rubric, scratch, parts, deadline=deadline) if parts else {}
    return {p: verdict(p, runs[p]) for p in parts}


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


def _not_run(check, message: str) -> CheckOutcome:
    return CheckOutcome(check=check.name, hidden=check.hidden, world_size=check.world_size, status=Status.TIMEOUT,
                        message=message)


def _named(check) -> str:
    """A check as a later check's outcome names it (where a part hung, or was shown not to need its
    collectives): a hidden check's name is not said."""
    return "an earlier hidden check" if check.hidden else f"check '{check.name}'"


def _rerun_all(result: HandinResult, assignment: Path, rubric, executor, work: Path, deadline: float,
               clocks: dict = None) -> dict:
    """Every part at every check of the rubric that runs it, within the hand-in's time: part ->
    [CheckOutcome]. `clocks`: check name -> each part's clock there (a batch's canary measured them).

    A part that ran past its clock at a check with the CPU it wanted (judge_check) hung: it is not
    run at the later checks of that kind (a step, or a layer's backward: other code), whose outcomes
    say so. Each would cost its whole clock for a failure that stands either way: a hang so costs
    one clock, not one per check."""
    code = rerun.prepare_code(assignment)
    outcomes = {p: [] for p in rubric.part_ids}
    passed = {p: [] for p in rubric.part_ids}
    hung = {}   # (part, check kind) -> the check at which it hung
    matter = {}   # (part, check kind) -> whether its collectives made its values (judge_check)
    for check in rubric.checks:
        if time.monotonic() > deadline:
            for p in rubric.parts_at(check):
                outcomes[p].append(_not_run(check, f"not run: the hand-in's {rubric.timeouts.handin:g} s were used up"))
            continue
        for p in (p for p in rubric.parts_at(check) if (p, check.kind) in hung):
            outcomes[p].append(_not_run(check, f"not run: this part hung at {_named(hung[p, check.kind])} (it ran "
                                               f"past its clock there), so it is not run again at later checks"))
        runnable = [p for p in rubric.parts_at(check) if (p, check.kind) not in hung]
        judged = judge_check(executor, code, check, rubric, work, parts=runnable, passed=passed,
                             clock=(clocks or {}).get(check.name), matter=matter, deadline=deadline) if runnable else {}
        for p, outcome in judged.items():
            outcomes[p].append(outcome)
            if outcome.status == Status.PASSED:
                passed[p].append(check)
            if outcome.status == Status.TIMEOUT and not outcome.flaky:
                hung[p, check.kind] = check
            if outcome.flaky and "flaky" not in result.flags:
                result.flags.append("flaky")
    return outcomes


def grade_handin(handin, rubric, executor, scratch: Path, clocks: dict = None) -> HandinResult:
    """Grade `handin` (a grader.intake.handin.Handin) with `executor`; see the module docstring.
    `clocks`: check name -> each part's clock there (a batch's, from its canary); else the rubric's."""
    started = time.monotonic()
    result = new_result(handin.student, handin.name, handin.sha256, rubric)
    result.torch = machine.torch_version()
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
        outcomes = _rerun_all(result, files["assignment"], rubric, executor, work, started + rubric.timeouts.handin,
                              clocks)
        result.isolation = dict(getattr(executor, "isolation", {}))   # as it was for these re-runs
        score_handin(result, outcomes, rubric, log_report, log_usable)
        result.notes = list(dict.fromkeys(result.notes))   # one note, said once
    except Exception as e:  # noqa: BLE001 - one hand-in's grading bug must not end the batch
        grading_crashed(result, rubric, e, traceback.format_exc())
    finally:
        shutil.rmtree(work, ignore_errors=True)
        result.seconds = round(time.monotonic() - started, 3)
    return result
