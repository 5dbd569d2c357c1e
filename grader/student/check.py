"""The students' self-check: the graders' grading of one hand-in, at the public checks only.

    python -m grader check [PATH] [--log FILE] [--err FILE]

PATH is the zip to be handed in, or the working folder (default `assignment_4/`). A folder is
zipped in memory exactly as `python -m grader package` zips it, with the run `package` would take
(found by what its files hold, whatever their names; `--log FILE` names it), and that zip is
graded. Either way the hand-in goes through `grader.pipeline.grade.grade_handin`,
the function the graders' batch runs on every hand-in, with the public rubric
(`grader.rubric.public_rubric`, shipped as `grader/rubric-public.yaml`: the default configuration
on 4, 1 and 2 ranks in the stock course, the same points and log requirements) instead of theirs,
which adds hidden checks. What comes back is a row per part:
the re-run's verdict, the log's verdict and a message, and the reasons the hand-in is not ready.

Then what grading adds: each kind of hidden check that runs a part (its step, its layer alone
forward and backward), how it differs from the public checks (several nodes, other sizes ...) and
the points it holds (grader.worth.hidden_summary, which the public rubric carries), never a name
or a value. A hand-in that passes every public check can lose points only there. Where a hidden
kind has a public twin that gives nothing away (the layer's backward at the default sizes), the
public rubric has it too, so `check` already runs it.
"""

import hashlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from grader.intake import handin as handins
from grader.intake.find import discover
from grader.names import listed
from grader.parts import BACKWARD, BY_ID
from grader.pipeline.grade import grade_handin
from grader.rerun.executors import make_executor
from grader.rerun.machine import explain
from grader.rerun.sandbox.namespaces import scratch_dir
from grader.results import Status, ToDict
from grader.rubric import load_public_rubric, public_rubric
from grader.worth import kind_said
from grader.student import package

TRACEBACK_LINES = 8
PENALTY_REASONS = {"missing_err": "the run's stderr (.err) is missing", "missing_log": "no log of a run",
                   "missing_utils": "utils.py is missing", "modified_utils": "utils.py differs from the provided one"}


class CheckError(ValueError):
    """There is nothing to check at the path given; the message says what to give instead."""


@dataclass
class CheckRow(ToDict):
    part: str
    title: str
    rerun: Status        # the part's verdict over every public check
    log: Status          # passed, failed, or not_run (no .log)
    message: str
    traceback: str = ""  # the end of the first failing check's traceback, when the part raised
    printed: bool = False   # ... or the end of what its ranks printed, where none raised (a hang)


@dataclass
class CheckReport(ToDict):
    source: str                                   # what was checked, as the user named it
    status: Status                                # of the hand-in: graded, invalid, error, infra_error
    passed: bool                                  # every public check and the log passed, nothing is missing
    message: str = ""
    checks: list = field(default_factory=list)    # the public checks run, as "name (n ranks)"
    layer_checks: list = field(default_factory=list)  # ... of those, the ones that run a layer alone
    layers: str = ""                              # the layers those run: "FullColumnParallelLinear"
    hidden: list = field(default_factory=list)    # grader.worth.HiddenGroup: what grading adds
    rerun_max: dict = field(default_factory=dict)  # part -> its re-run points
    decimals: int = 2                             # the rubric's score_decimals, to say points with
    files: dict = field(default_factory=dict)     # role -> name in the hand-in
    rows: list = field(default_factory=list)      # CheckRow, one per part
    notes: list = field(default_factory=list)     # what grading noticed (stale log, modified utils ...)
    problems: list = field(default_factory=list)  # why it is not ready to hand in ([] when passed)
    seconds: float = 0.0
    sandbox: str = ""                             # why the re-runs ran without the sandbox ('' when they did not)


def _ranks(n: int) -> str:
    return f"{n} rank{'s' if n != 1 else ''}"


def _row(part) -> CheckRow:
    if part.log is None:
        log = Status.NOT_RUN
    else:
        log = Status.PASSED if part.log.passed and part.log.points >= part.log_max else Status.FAILED
    if part.status != Status.PASSED:
        message = part.message
    elif log == Status.NOT_RUN:
        message = f"passed {len(part.checks)} public checks; no .log to show it ran on the cluster"
    elif log == Status.FAILED:
        message = f"passed {len(part.checks)} public checks; but the log: {part.log.message}"
    else:
        message = f"passed {len(part.checks)} public checks; log: {part.log.message}"
    failed = next((o for o in part.checks if o.status != Status.PASSED and o.traceback.strip()), None)
    traceback = "\n".join(failed.traceback.strip().splitlines()[-TRACEBACK_LINES:]) if failed else ""
    # a rank's traceback where one raised, else what the ranks printed (a hang, a rank killed)
    printed = failed is not None and "Traceback (most recent call last)" not in failed.traceback
    return CheckRow(part=part.part, title=BY_ID[part.part].title, rerun=part.status, log=log, message=message,
                    traceback=traceback, printed=printed)


def _problems(result, rows, rubric) -> list:
    if result.status == Status.INFRA_ERROR:
        broken = next((p.message for p in result.parts.values() if p.status == Status.INFRA_ERROR), result.message)
        why = explain(Status.INFRA_ERROR.value, broken, rubric.limits)
        return [f"the re-runs could not run on this machine, which says nothing about your code: {why.text()}"]
    if result.status == Status.ERROR:
        return [f"checking crashed, which says nothing about your code ({result.message}); tell the course staff"]
    if result.status != Status.GRADED:
        return [result.message or f"the hand-in could not be graded ({result.status})"]
    problems = []
    failing = [r.part for r in rows if r.rerun != Status.PASSED]
    if failing:
        problems.append(f"{len(failing)} part{'s' if len(failing) > 1 else ''} fail{'s' if len(failing) == 1 else ''} "
                        f"public checks: {', '.join(failing)}")
    if "log" not in result.files:
        problems.append("no log of a run in the hand-in: " + package.RUN_FIRST)
    else:
        uncounted = [r.part for r in rows if r.log != Status.PASSED]
        if uncounted:
            problems.append(f"the log does not count for {', '.join(uncounted)} (see the messages and notes)")
        if not result.log.get("finished"):
            problems.append("the run in the log did not finish (see the notes)")
    for key in result.penalties:
        problems.append(f"{PENALTY_REASONS.get(key, key)} (-{result.penalties[key]:g} points)")
    return problems


def check_handin(handin, rubric, executor, source: str = "") -> CheckReport:
    """Grade `handin` (a grader.intake.handin.Handin) by `rubric`'s public checks and report per part."""
    rubric = public_rubric(rubric)   # its public checks, and what its hidden ones hold
    scratch = Path(scratch_dir("a4-check-"))
    try:
        result = grade_handin(handin, rubric, executor, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rows = [_row(p) for p in result.parts.values()] if result.status == Status.GRADED else []
    problems = _problems(result, rows, rubric)
    said = {c.name: f"{c.name} ({_ranks(c.world_size)})" for c in rubric.checks}
    return CheckReport(source=source or handin.name, status=result.status, passed=not problems,
                       message=result.message, checks=list(said.values()),
                       layer_checks=[said[c.name] for c in rubric.checks if c.kind == BACKWARD],
                       layers=listed(BY_ID[p].layer for p in rubric.part_ids if BY_ID[p].layer),
                       hidden=list(rubric.hidden_summary), decimals=rubric.score_decimals,
                       rerun_max={p: rubric.parts[p].rerun for p in rubric.part_ids},
                       files=dict(result.files), rows=rows, notes=list(result.notes), problems=problems,
                       seconds=result.seconds)


def handin_at(path=None, log=None, err=None, pattern: str = r"(?P<id>.+)") -> tuple:
    """(Handin, notes) for `path`: a hand-in zip as it is, or a folder zipped as `package` would zip it."""
    if path is not None and Path(path).suffix.lower() == ".zip":
        path = Path(path)
        if not path.is_file():
            raise CheckError(f"{package.show(path)}: no such file; build the zip with python -m grader package")
        found, problems = discover([path], pattern)
        if problems:
            raise CheckError(f"{problems[0][1].split('; ')[0]}; build it again with python -m grader package")
        if len(found) != 1:
            raise CheckError(f"{package.show(path)} holds {len(found)} hand-in zips: hand in one zip with the "
                             f"four files (python -m grader package builds it)")
        return found[0], []
    try:
        sources = package.collect(path, log, err)
    except package.PackageError as e:
        raise CheckError(str(e)) from e
    notes = [sources.note] if sources.note else []
    if sources.log is None:
        where = " or ".join(package.show(f) for f in sources.searched)
        notes.append(f"no log of a run in {where} (no file holds a run's lines): {package.RUN_FIRST}, or give "
                     f"the job's stdout with --log FILE")
    elif log is not None:
        err = ("its stderr is in the same file" if sources.err == sources.log else
               f"its stderr: {package.show(sources.err)}" if sources.err else "no stderr file beside it")
        notes.append(f"took the run in {package.show(sources.log)}, as given ({err})")
    data = package.zip_bytes(sources)
    name = f"{package.show(sources.code.parent)} (zipped as python -m grader package would)"
    return handins.Handin(name=name, student="self-check", sha256=hashlib.sha256(data).hexdigest(),
                          zip_bytes=data), notes


def check(path=None, log=None, err=None, rubric_path=None, executor=None) -> CheckReport:
    """Check the hand-in at `path` (see the module docstring); `executor` may be shared between calls."""
    rubric = load_public_rubric(rubric_path)
    handin, notes = handin_at(path, log, err, rubric.files.student_id_pattern)
    own = executor is None
    executor = executor or make_executor("warm", "best")
    started = time.monotonic()
    try:
        report = check_handin(handin, rubric, executor)
    finally:
        if own:
            executor.close()
    report.notes = notes + report.notes
    isolation = getattr(executor, "isolation", {}) or {}
    if isolation.get("sandbox", "none") == "none" and isolation.get("problems"):
        report.sandbox = _without_sandbox(isolation)
    report.seconds = round(time.monotonic() - started, 1)
    return report


def _without_sandbox(isolation: dict) -> str:
    """Why the re-runs ran in plain processes here, what still held them and what they lacked. The
    student release ships no bubblewrap (its requirements.txt has none): where none is installed,
    that is said as it is, never as a package to install."""
    problem = isolation["problems"][0]
    if problem.startswith("bubblewrap is not installed"):
        problem = "no bubblewrap here (the student release does not bring it; the graders' machines have it)"
    held = [name for name, holds in (("each world's own memory limit", "held" in isolation.get("memory", "")
                                      and "NOT held" not in isolation.get("memory", "")),
                                     ("its own processes' limit", "at most" in isolation.get("tasks", "")),
                                     ("a fresh folder per world", isolation.get("scratch", "").startswith("a new")))
            if holds]
    return f"{problem}; so with {_listed(held) or 'no limit of the sandbox'} and without {_lacking(isolation)}"


def _listed(names: list) -> str:
    return ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1] if names else ""


def _lacking(isolation: dict) -> str:
    """The layers a world without the sandbox lacks, from its isolation summary."""
    layers = [name for name, missing in (("its own files", isolation.get("files", "").startswith("NOT")),
                                         ("its own network", isolation.get("network", "").startswith("NOT")),
                                         ("its own processes", isolation.get("processes") == "process group"),
                                         ("a memory limit", "NOT held" in isolation.get("memory", ""))) if missing]
    return ", ".join(layers[:-1]) + (" and " if len(layers) > 1 else "") + layers[-1] if layers else "no layer"


def format_report(report: CheckReport) -> str:
    """The report as the student reads it: what was checked, a table of the parts, then the verdict."""
    lines = [f"Public checks of {report.source}"]
    if report.sandbox:
        lines.append(f"  (your code ran without the grader's sandbox here, which is fine for your own code: "
                     f"{report.sandbox})")
    if report.files:
        named = dict(report.files)
        if named.get("err") and named.get("err") == named.get("log"):
            named["log"], named["err"] = f"{named['log']} (stdout and stderr)", None
        files = ", ".join(named.get(role, f"no {name}") for role, name in
                          (("assignment", "assignment4.py"), ("utils", "utils.py"), ("log", "log"), ("err", ".err"))
                          if not (role == "err" and role in named and named[role] is None))
        steps = [c for c in report.checks if c not in report.layer_checks]
        lines += [f"  files:   {files}", f"  re-runs: every part on the CPU at {', '.join(steps)}"]
        if report.layer_checks:
            lines.append(f"           {report.layers} alone, forward and backward, at {', '.join(report.layer_checks)}")
    lines.append("")
    if report.rows:
        table = [("part", "re-run", "log", "message")] + [
            (r.title, str(r.rerun), "no log" if r.log == Status.NOT_RUN else str(r.log), r.message) for r in report.rows]
        widths = [max(len(row[i]) for row in table) for i in range(3)]
        for row in table:
            lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3])
        lines.append("")
    shown = {}
    for row in (r for r in report.rows if r.traceback and r.rerun != Status.NOT_IMPLEMENTED):
        raised = not row.printed
        if row.traceback in shown:   # one traceback (code that does not load) is said once
            lines += [f"{row.title}: the same {'traceback' if raised else 'output'} as {shown[row.traceback]}.", ""]
            continue
        shown[row.traceback] = row.title.split(":")[0]
        lines += [f"{row.title}, the end of {'its traceback' if raised else 'what its ranks printed'}:"] + [f"    {t}" for t in row.traceback.splitlines()] + [""]
    if report.notes:
        lines += ["Notes:"] + [f"- {note}" for note in report.notes] + [""]
    lines += hidden_lines(report)
    if report.passed:
        lines.append("All public checks passed." + (" Grading can still take only the points of the hidden "
                                                    "checks above, and only for what they run." if report.hidden else ""))
    else:
        lines += ["Not ready to hand in:"] + [f"- {p}" for p in report.problems]
    lines.append(f"({report.seconds:g} s)")
    return "\n".join(lines) + "\n"


def hidden_lines(report: CheckReport) -> list:
    """What the hidden checks add at grading, part by part: the points each kind of them holds."""
    if not report.hidden or not report.rows:
        return []
    points = lambda x: f"{round(x, report.decimals):g}"   # noqa: E731 - said as scores are
    lines = ["When your hand-in is graded, hidden checks also run it (their names and numbers stay hidden). "
             "What each can still fail, and the re-run points it holds:"]
    for part in dict.fromkeys(g.part for g in report.hidden):
        groups = [g for g in report.hidden if g.part == part]
        most = f" of its {points(report.rerun_max[part])}" if part in report.rerun_max else ""
        lines.append(f"  {BY_ID[part].title}: {points(sum(g.points for g in groups))}{most} re-run points")
        for g in sorted(groups, key=lambda g: -g.points):
            how = ", ".join(g.what) if g.what else "a public configuration again"
            count = f"{g.checks} check{'s' if g.checks != 1 else ''}"
            lines.append(f"    {points(g.points):>5}  {kind_said(part, g.kind)}, {how} ({count})")
    return lines + [""]
