"""Grade a batch: every hand-in under the given paths, into one output folder.

- Hand-ins already graded with the same bytes, rubric and grader code (grader.kit.source_digest) are not graded again
  (their out/<student>/grading.json is reused) unless `force`.
- The hand-ins left are graded on this machine (grader.batch.local: the canary first, `jobs` at
  once) or by the tasks of a Slurm job array (grader.batch.array).
- Every hand-in's files are written as soon as it is graded, atomically; grades.csv and
  summary.md at the end, from all of them.
"""

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from grader.batch.local import grade_handins
from grader.pipeline import handin as handins, report
from grader.results import Status, grader_digest, new_result, ungraded
from grader.rubric import load_rubric


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
            and data.get("grader_digest") == grader_digest() and data.get("status") not in ("error", "infra_error"))
    return data if same else None


def grade_batch(paths, out, jobs: int = 1, rubric_path=None, force: bool = False, only=None,
                executor: str = "warm", sandbox: str = "auto", progress: bool = True,
                slurm: dict = None) -> BatchSummary:
    """Grade every hand-in under `paths` into `out`; see the module docstring.

    With executor="slurm", the hand-ins are graded by the tasks of a Slurm job array (grader.batch.array;
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
        student = handins.student_id(name, rubric.files.student_id_pattern)
        result = ungraded(new_result(student, name, "", rubric), rubric, Status.INVALID, message,
                          "not run: the hand-in could not be read", score=0.0)
        report.write_handin(result, out)
        results[student] = report.gradebook_view(result.to_dict())
    todo = []
    for h in found:
        cached = None if force else _cached(out, h, rubric)
        if cached is not None:
            results[h.student] = report.gradebook_view(cached)
            summary.cached += 1
        else:
            todo.append(h)
    if executor == "slurm":
        from grader.batch.array import grade_on_slurm
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
