"""Grade a batch: every hand-in under the given paths, into one output folder.

- Hand-ins already graded with the same bytes, rubric and grader version are not graded again
  (their out/<student>/grading.json is reused) unless `force`.
- Before grading, the reference solution is re-run at every check through the same machinery (the
  canary). If it does not pass, nothing can be trusted: every hand-in is recorded `infra_error`
  and no score is written.
- `jobs` hand-ins are graded at once, each job with its own executor. A crash while grading one
  hand-in becomes that hand-in's result; the batch goes on.
- Every hand-in's files are written as soon as it is graded, atomically; grades.csv and
  summary.md at the end, from all of them.
"""

import json
import queue
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from grader import __version__, handin as handins, report
from grader.executor import make_executor
from grader.grade import grade_handin, judge_check, mark_not_run, new_result
from grader.rerun import prepare_code
from grader.results import Status
from grader.rubric import load_rubric
from grader.sandbox import scratch_dir

REFERENCE = Path(__file__).resolve().parent.parent / "assignment_4" / "reference" / "assignment4.py"


@dataclass
class BatchSummary:
    graded: int = 0
    cached: int = 0
    statuses: dict = field(default_factory=dict)
    out: str = ""
    seconds: float = 0.0
    worlds: int = 0               # re-run worlds started, the canary's included
    world_seconds: float = 0.0    # their time, summed over the executors

    @property
    def trouble(self) -> int:
        return sum(self.statuses.get(s, 0) for s in ("error", "infra_error"))


def canary(executor, rubric, scratch: Path) -> str:
    """Re-run the reference at every check; return what failed ('' when everything passed)."""
    if not REFERENCE.exists():
        return ""
    code = prepare_code(REFERENCE, scratch)
    for check in rubric.checks:
        for part, outcome in judge_check(executor, code, check, rubric, scratch).items():
            if outcome.status != Status.PASSED:
                return f"the reference solution fails {part} at check '{check.name}': {outcome.message}"
    return ""


def _unique_students(found: list) -> None:
    seen = {}
    for h in found:
        base = h.student
        seen[base] = seen.get(base, 0) + 1
        if seen[base] > 1:
            h.student = f"{base}-{seen[base]}"


def _cached(out: Path, h, rubric):
    path = out / h.student / "grading.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    same = (data.get("sha256") == h.sha256 and data.get("rubric_sha256") == rubric.digest()
            and data.get("grader_version") == __version__ and data.get("status") not in ("error", "infra_error"))
    return data if same else None


class Progress:
    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled = total, 0, enabled
        self.started = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.lock = threading.Lock()

    def step(self, student: str, text: str) -> None:
        with self.lock:
            self.done += 1
            if not self.enabled:
                return
            elapsed = time.monotonic() - self.started
            eta = elapsed / self.done * (self.total - self.done)
            width = 24
            bar = "#" * int(width * self.done / max(self.total, 1))
            line = (f"[{bar:<{width}}] {self.done}/{self.total}  {student}: {text}  "
                    f"({elapsed:.0f} s, about {eta:.0f} s left)")
            if self.tty:
                sys.stderr.write("\r\033[K" + line[:160] + ("\n" if self.done == self.total else ""))
            else:
                sys.stderr.write(line + "\n")
            sys.stderr.flush()


def infra_result(h, rubric, message: str):
    result = new_result(h, rubric)
    result.status, result.score = Status.INFRA_ERROR, None
    result.message = f"not graded: {message}; grade it again"
    mark_not_run(result, rubric, "not run: infrastructure failure")
    return result


def grade_handins(todo: list, out: Path, rubric, jobs: int = 1, executor: str = "warm", sandbox: str = "auto",
                  progress: bool = True) -> tuple:
    """Grade the hand-ins in `todo` on this machine, writing each one's files into `out` as soon as
    it is graded. Returns ({student: its gradebook view}, worlds run, their seconds)."""
    results, worlds, world_seconds = {}, 0, 0.0
    if not todo:
        return results, worlds, world_seconds
    scratch = Path(scratch_dir("a4-grade-"))
    bar = Progress(len(todo), progress)
    executors = [make_executor(executor, sandbox) for _ in range(max(1, min(jobs, len(todo))))]
    idle = queue.Queue()
    for ex in executors:
        idle.put(ex)
    try:
        broken = canary(executors[0], rubric, scratch)
        if broken:
            broken += "; the grading machine is not working"

        def grade_one(h):
            if broken:
                result = infra_result(h, rubric, broken)
            else:
                ex = idle.get()
                try:
                    result = grade_handin(h, rubric, ex, scratch)
                finally:
                    idle.put(ex)
            report.write_handin(result, out)
            score = "no score" if result.score is None else f"{result.score:g}/{result.max_score:g}"
            bar.step(h.student, f"{result.status}, {score}")
            return result.student, report.gradebook_view(result.to_dict())

        with ThreadPoolExecutor(max_workers=len(executors)) as pool:
            for future in as_completed([pool.submit(grade_one, h) for h in todo]):
                student, view = future.result()
                results[student] = view
    finally:
        for ex in executors:
            ex.close()
            worlds += ex.worlds
            world_seconds += ex.world_seconds
        shutil.rmtree(scratch, ignore_errors=True)
    return results, worlds, world_seconds


def grade_batch(paths, out, jobs: int = 1, rubric_path=None, force: bool = False, only=None,
                executor: str = "warm", sandbox: str = "auto", progress: bool = True,
                slurm: dict = None) -> BatchSummary:
    """Grade every hand-in under `paths` into `out`; see the module docstring.

    With executor="slurm", the hand-ins are graded by the tasks of a Slurm job array (grader.scale;
    `slurm` holds its options), each task with the warm executor on its node.
    """
    started = time.monotonic()
    rubric = load_rubric(rubric_path)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    found, problems = handins.discover(paths, rubric.files.student_id_pattern)
    _unique_students(found)
    if only:
        wanted = set(only)
        found = [h for h in found if h.student in wanted]
        problems = []
    summary = BatchSummary(out=str(out))
    results = {}
    for name, message in problems:
        h = handins.Handin(name=name, student=handins.student_id(name, rubric.files.student_id_pattern), sha256="")
        result = new_result(h, rubric)
        result.status, result.score, result.message = Status.INVALID, 0.0, message
        mark_not_run(result, rubric, "not run: the hand-in could not be read")
        report.write_handin(result, out)
        results[h.student] = report.gradebook_view(result.to_dict())
    todo = []
    for h in found:
        cached = None if force else _cached(out, h, rubric)
        if cached is not None:
            results[h.student] = report.gradebook_view(cached)
            summary.cached += 1
        else:
            todo.append(h)
    if executor == "slurm":
        from grader.scale import grade_on_slurm
        graded = grade_on_slurm(todo, out, rubric_path, rubric, sandbox=sandbox, jobs=jobs,
                                progress=progress, **(slurm or {}))
    else:
        graded, summary.worlds, summary.world_seconds = grade_handins(todo, out, rubric, jobs, executor,
                                                                      sandbox, progress)
    results.update(graded)
    summary.graded = len(graded)
    all_results = list(results.values())
    report.write_gradebook(all_results, out, rubric.max_score)
    for r in all_results:
        summary.statuses[r["status"]] = summary.statuses.get(r["status"], 0) + 1
    summary.seconds = round(time.monotonic() - started, 2)
    return summary
