"""Grade a batch: every hand-in under the given paths, into one output folder.

- A path that does not exist, a file that is not a zip, a folder with no hand-in in it and an
  `--only` id that matches no hand-in are the TA's mistakes, never a student's: InputError, and
  nothing is graded.
- The PATHs are LMS downloads, zipped or not, plain folders of hand-ins or hand-ins
  (grader.intake.find, grader.intake.download): what each was read as is said on the console,
  and the files of a download that fit no student are listed in summary.md (and kept in
  OUT/strays.json for later runs into OUT), never graded.
- A hand-in is kept in OUT/students/<student>/ (grading.json, results.json, feedback.md, and
  download.json: what the download said of it, its LMS name and submission time), where no id can
  be one of the grader's own files. Hand-ins are told apart by student id and file name (`source`):
  a file of the same name with other bytes is the student's newer hand-in and replaces the earlier
  result (moved to OUT/students/.replaced/ once the new one is written, listed in summary.md); a further hand-in of the same
  student under another name goes into OUT/students/<student>~<first 8 hex digits of its sha256>/
  and both are flagged `duplicate`.
- Hand-ins already graded with the same bytes, rubric, isolation mode and grader digest
  (grader.kit.source_digest) are not graded again (their grading.json is reused) unless `force`.
- The hand-ins left are graded on this machine (grader.batch.local: the canary first, `jobs` at
  once) or by the tasks of a Slurm job array (grader.batch.array).
- Every world runs on the data of OUT's data key (OUT/.data-key, made by the first `grade` into OUT,
  readable by its owner alone; grader.rerun.wire.secret): the same wrong code gives the same weight in
  every hand-in and every regrade into OUT. Deleting it gives the next run new data.
- Every hand-in's files are written by the pipeline as soon as it is graded, atomically
  (grader.pipeline.record), whichever route graded it; the routes return only each hand-in's
  status. Then grades.csv, summary.md and report.html from every result in OUT, read back from
  disk, whatever this invocation graded (grader.batch.outputs). The canary's outcome is kept in
  OUT/canary.json (grader.batch.local): when nothing in OUT could be graded, the summary's
  `ungradable` says why and what to do (grader.results.ungradable), as report.html and summary.md
  do at their top.
- A refused `grade` changes nothing in OUT: the paths, the rubric and (on this machine) the sandbox
  are checked before anything is written.
"""

import difflib
import hashlib
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from grader.batch import outputs
from grader.batch.local import batch_jobs, data_key, grade_handins
from grader.intake import handin as handins
from grader.intake.find import Unreadable, find_handins
from grader import kit
from grader.kit import write_json
from grader.names import SEP, result_files, student_dir, student_of
from grader.pipeline import record
from grader.rerun.executors import make_executor
from grader.results import grader_digest, ungradable
from grader.rubric import load_rubric

STRAYS = "strays.json"


class InputError(ValueError):
    """The paths or ids given name no hand-in; nothing was graded. One problem per line."""


@dataclass
class BatchSummary:
    graded: int = 0               # hand-ins this run graded (an unreadable one's refusal included)
    cached: int = 0               # earlier results this run reused
    ran: dict = field(default_factory=dict)        # status -> hand-ins, of those this run graded
    statuses: dict = field(default_factory=dict)   # status -> results, over every result in `out`
    ungradable: str = ""          # why `out` holds no score at all (grader.results.ungradable), else ''

    out: str = ""
    jobs: str = ""                # how many hand-ins were graded at once, and why (grader.limits.default_jobs)
    seconds: float = 0.0
    worlds: int = 0               # re-run worlds started, the canary's included
    world_seconds: float = 0.0    # their time, summed over the executors
    replaced: list = field(default_factory=list)   # sentences: results replaced by a newer hand-in
    duplicates: int = 0           # students with several hand-ins in `out`
    shapes: list = field(default_factory=list)     # "PATH: what it was read as"
    strays: list = field(default_factory=list)     # sentences: files of a download that fit no student

    @property
    def trouble(self) -> int:
        return sum(self.statuses.get(s, 0) for s in ("error", "infra_error"))


def _index(out: Path) -> dict:
    """folder -> (student id, source, sha256) of every result in `out`."""
    index = {}
    for path in result_files(out):
        try:
            data = json.loads(path.read_text())
            index[path.parent.name] = (student_of(data["student"]), data["source"], data.get("sha256", ""))
        except (OSError, ValueError, KeyError):
            continue
    return index


def _place(items: list, index: dict) -> dict:
    """Give each hand-in (or unreadable one) its folder, as `.student`; return {folder: the sha256 of
    the result it replaces} for those whose earlier result had other bytes."""
    by_source = {(sid, source): folder for folder, (sid, source, _) in index.items()}
    claimed, replaces = set(), {}
    for h in sorted(items, key=lambda h: (h.student, h.name)):
        ident = h.student
        folder = by_source.get((ident, h.name))
        if folder is None or folder in claimed:
            digest = h.sha256 or hashlib.sha256(h.name.encode()).hexdigest()
            folder, width = ident, 8
            while folder in claimed or (folder in index and index[folder][:2] != (ident, h.name)):
                folder, width = f"{ident}{SEP}{digest[:width]}", width + 4
        elif index[folder][2] != h.sha256:
            replaces[folder] = index[folder][2]
        claimed.add(folder)
        h.student = folder
    return replaces


def _select(items: list, only) -> tuple:
    """The items `only` names (by student id or folder), and the problems with `only`."""
    if not only:
        return items, []
    ids = {student_of(h.student) for h in items} | {h.student for h in items}
    problems = []
    for wanted in only:
        if wanted not in ids:
            near = difflib.get_close_matches(wanted, sorted(ids), n=3)
            problems.append(f"--only {wanted}: no hand-in of that id among the {len(items)} found"
                            + (f" (did you mean {', '.join(near)}?)" if near else ""))
    chosen = [h for h in items if h.student in only or student_of(h.student) in only]
    return chosen, problems


def _set_aside(out: Path, folder: str, sha256: str, h) -> str:
    """What summary.md says of an earlier result that `h` replaces (record.write_handin moves it)."""
    target = record.replaced_folder(out, folder, sha256)
    return (f"{student_of(folder)}: {h.name} has other bytes than when it was graded; graded again, "
            f"the earlier result is in {target.relative_to(out)}/")


def _strays(out: Path, met: list) -> list:
    """Every file of a download that fit no student, met by this `grade` into `out` or an earlier
    one (OUT/strays.json keeps them until a person deletes it)."""
    try:
        earlier = json.loads((out / STRAYS).read_text())
    except (OSError, ValueError):
        earlier = []
    every = sorted(set(earlier if isinstance(earlier, list) else []) | set(met))
    if every != earlier:
        write_json(out / STRAYS, every)
    return every


def _cached(out: Path, h, rubric, sandbox: str):
    """The earlier result of `h` when it can stand: same bytes, rubric, grader digest (grading code,
    utils.py, torch), and the same isolation mode (a result graded with `--sandbox off` is never
    reused by a sandboxed run, nor the other way); a result that ran no code has no mode."""
    path = student_dir(out, h.student) / "grading.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    mode = (data.get("isolation") or {}).get("mode")
    same = (data.get("sha256") == h.sha256 and data.get("rubric_sha256") == rubric.digest()
            and data.get("grader_digest") == grader_digest() and mode in (None, sandbox)
            and data.get("status") not in ("error", "infra_error"))
    return data if same else None


def _found(paths, out: Path, rubric, only, lms) -> tuple:
    """The hand-ins (and unreadable ones) under `paths` that `only` names, each given its folder in
    `out`, with {folder: sha256 of the result it replaces} and the summary of what was read."""
    found = find_handins(paths, rubric.files.student_id_pattern, lms)
    items = found.handins + found.unreadable
    replaces = _place(items, _index(out))
    items, only_problems = _select(items, only)
    problems = [message for _, message in found.errors] + only_problems
    if problems:
        raise InputError("\n".join(problems))
    return items, replaces, BatchSummary(out=str(out), shapes=found.shapes, strays=[s.message for s in found.strays])


def _todo(items: list, out: Path, rubric, sandbox: str, force: bool, summary: BatchSummary) -> list:
    """The hand-ins to grade: those without an earlier result that can stand (counted as cached).
    What a run killed while writing one of their folders left there (kit.unfinished_writes) goes:
    that folder is this run's (an array task's hand-ins are its own)."""
    todo = []
    for h in (i for i in items if isinstance(i, handins.Handin)):
        if not force and _cached(out, h, rubric, sandbox) is not None:
            summary.cached += 1
        else:
            todo.append(h)
            for path in kit.unfinished_writes(student_dir(out, h.student)):
                path.unlink(missing_ok=True)
    return todo


def _unreadable(items: list, out: Path, rubric) -> dict:
    """Have the pipeline write the result of every hand-in that could not be read; {folder: status}."""
    return {u.student: record.unreadable_into(u, rubric, out).status for u in items if isinstance(u, Unreadable)}


def _write_outputs(out: Path, rubric, items: list, summary: BatchSummary) -> None:
    """download.json beside each result this run wrote, then grades.csv, summary.md and the staff
    report over every result in `out`, and the summary's counts of them."""
    # Beside the result, once it is written (a replaced result is moved aside whole, see record.write_handin).
    for h in (i for i in items if isinstance(i, handins.Handin)):
        if student_dir(out, h.student).is_dir():
            write_json(student_dir(out, h.student) / "download.json", h.intake(), sort_keys=True)
    views = outputs.load_views(out)
    outputs.write_outputs(views, out, rubric.max_score, rubric.files.student_id_pattern, summary.replaced,
                          _strays(out, summary.strays))
    summary.statuses = dict(Counter(r["status"] for r in views))
    summary.duplicates = len(outputs.duplicates(views))
    summary.ungradable = ungradable(out)


def grade_batch(paths, out, jobs: int = kit.JOBS, rubric_path=None, force: bool = False, only=None,
                executor: str = "warm", sandbox: str = "auto", progress: bool = True,
                slurm: dict = None, lms: str = None) -> BatchSummary:
    """Grade every hand-in under `paths` into `out`; see the module docstring.

    With executor="slurm", the hand-ins are graded by the tasks of a Slurm job array (grader.batch.array;
    `slurm` holds its options), each task with the warm executor on its node. `lms` names the LMS
    whose downloads the PATHs are (else it is recognised from the names).
    """
    started = time.monotonic()
    rubric = load_rubric(rubric_path)
    out = Path(out)
    items, replaces, summary = _found(paths, out, rubric, only, lms)
    todo = _todo(items, out, rubric, sandbox, force, summary)
    if executor == "slurm":
        jobs = kit.TASK_JOBS if jobs is None else jobs
    elif todo:
        chosen = batch_jobs(jobs, rubric)
        jobs, summary.jobs = chosen.jobs, chosen.why
        if progress:
            print(f"grading {len(todo)} hand-in(s): {chosen.why}", file=sys.stderr, flush=True)
    # The sandbox and the machine are probed before OUT is touched: a refusal (CannotGrade) leaves it as it was.
    first = make_executor(executor, sandbox, rubric.limits, jobs=max(1, min(jobs, len(todo)))) \
        if todo and executor != "slurm" else None
    try:
        if first is not None:
            first.start()
        out.mkdir(parents=True, exist_ok=True)
        if todo:
            data_key(out)   # made here, before any array task needs it
        summary.replaced = [_set_aside(out, h.student, replaces[h.student], h) for h in items if h.student in replaces]
        graded = _unreadable(items, out, rubric)
        if executor == "slurm":
            from grader.batch.array import grade_on_slurm
            graded |= grade_on_slurm(todo, out, rubric_path, rubric, sandbox=sandbox, jobs=jobs,
                                     progress=progress, **(slurm or {}))
        else:
            done, summary.worlds, summary.world_seconds = grade_handins(todo, out, rubric, jobs, executor,
                                                                       sandbox, progress, first=first)
            graded |= done
    finally:
        if first is not None:
            first.close()   # closing twice is harmless: grade_handins closes it too
    summary.graded, summary.ran = len(graded), dict(Counter(graded.values()))
    _write_outputs(out, rubric, items, summary)
    summary.seconds = round(time.monotonic() - started, 2)
    return summary
