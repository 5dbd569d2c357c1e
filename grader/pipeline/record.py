"""A hand-in's files, written by the pipeline alone and once: every caller grades through here
and collects what it returns, and nothing outside grader/pipeline/ writes these files
(tests/test_layout.py holds that).

    a batch (grader.batch.local, each task of grader.batch.array)
        grade_into(handin, rubric, executor, scratch, OUT) -> Written (student, status, score)
            grade.grade_handin, then write_handin: OUT/students/<key>/grading.json, results.json,
            feedback.md, feedback.html (report.py renders them)
        infra_into(handin, rubric, OUT, message)   not graded: the canary failed, an array task left none
        unreadable_into(unreadable, rubric, OUT)   a hand-in that could not be read: invalid
    Gradescope (grader.gradescope.run)
        limited_into(path, rubric, metadata)       past the course's limit: an earlier result, no re-run
        gradescope_into(path, rubric, result, network)   Gradescope's results.json at `path`
    a student's `check` (grader.student.check) calls grade.grade_handin and writes nothing

What the batch collects is each hand-in's status (Written), never its result: grades.csv,
summary.md and the staff report are built from the files written here
(grader.batch.outputs.load_views), whichever route graded them (this machine, a Slurm array task,
an earlier run that was killed).
"""

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from grader.kit import atomic_write, fit, fit_text, write_json
from grader.names import student_dir, students_dir
from grader.pipeline.feedback import feedback_markdown
from grader.pipeline.report import fit_page, gradescope_results, limited_results
from grader.results import Status, new_result, ungraded

REPLACED = ".replaced"   # earlier results replaced by a student's newer hand-in, under OUT/students


@dataclass(frozen=True)
class Written:
    """What a caller collects of a hand-in the pipeline wrote: never its result, which is on disk."""
    student: str            # its folder under OUT/students
    status: str             # grader.results.Status's value
    score: float = None     # None: no score was written
    max_score: float = 0.0

    def __str__(self) -> str:
        """As the batch's progress line says it: "graded, 87/100", "invalid, no score"."""
        return f"{self.status}, " + ("no score" if self.score is None else f"{self.score:g}/{self.max_score:g}")


def _weights(rubric) -> dict:
    """Check name -> its weight (equal weights without a rubric, as a result scored before checks
    carried their points is read)."""
    return {c.name: c.weight for c in rubric.checks} if rubric is not None else {}


def replaced_folder(out: Path, folder: str, sha256: str) -> Path:
    """Where an earlier result of other bytes than its hand-in's newer version is kept."""
    return students_dir(out) / REPLACED / f"{folder}-{(sha256 or 'unknown')[:8]}"


def write_handin(result, out: Path, rubric=None) -> Written:
    """Write grading.json, results.json, feedback.md and feedback.html of one hand-in into
    OUT/students/<student>/, each at most kit.FILE_BYTES; return what was written. An earlier result there
    of other bytes (the student's earlier hand-in) is set aside into OUT/students/.replaced/ only
    once this one is written beside it, and then in one rename."""
    data = fit(result.to_dict())
    # grading.json last: a batch reuses a folder that has it (grader.batch.run), so a run killed
    # between two files leaves a folder graded again, never one reused without its feedback.
    files = {"results.json": json.dumps(gradescope_results(data, _weights(rubric)), indent=1) + "\n",
             "feedback.md": fit_text(feedback_markdown(data)), "feedback.html": fit_page(data),
             "grading.json": json.dumps(data, indent=1, sort_keys=True) + "\n"}
    folder = student_dir(out, result.student)
    try:
        earlier = json.loads((folder / "grading.json").read_text()).get("sha256", "")
    except (OSError, ValueError, AttributeError):
        earlier = None
    if earlier is None or earlier == data["sha256"]:   # new, or graded again: each file replaced atomically
        for name, text in files.items():
            atomic_write(folder / name, text)
        return Written(result.student, data["status"], data["score"], data["max_score"])
    staged = students_dir(out) / REPLACED / f".{result.student}.new"
    shutil.rmtree(staged, ignore_errors=True)
    for name, text in files.items():
        atomic_write(staged / name, text)
    aside = replaced_folder(out, result.student, earlier)
    shutil.rmtree(aside, ignore_errors=True)
    folder.rename(aside)
    staged.rename(folder)
    return Written(result.student, data["status"], data["score"], data["max_score"])


def grade_into(handin, rubric, executor, scratch: Path, out: Path, clocks: dict = None) -> Written:
    """Grade `handin` (grade.grade_handin, which never raises for the hand-in's sake) and write its
    files into its folder in `out`."""
    from grader.pipeline.grade import grade_handin   # torch: only where a hand-in is graded, not where one is written
    try:
        result = grade_handin(handin, rubric, executor, scratch, clocks=clocks)
    except Exception as e:   # noqa: BLE001 - a fault of the grader's on one hand-in costs that hand-in, never the batch
        return infra_into(handin, rubric, out, f"the grader failed on this hand-in ({type(e).__name__}: {str(e)[:300]}); "
                                               f"a person should look at it")
    return write_handin(result, out, rubric)


def infra_into(handin, rubric, out: Path, message: str, again: bool = True) -> Written:
    """Write the result of a hand-in the machinery could not grade (no score) into `out`. `again`: a second try may help (else `message` says what to fix first)."""
    result = ungraded(new_result(handin.student, handin.name, handin.sha256, rubric), rubric, Status.INFRA_ERROR,
                      f"not graded: {message}" + ("; grade it again" if again else ""),
                      "not run: infrastructure failure")
    return write_handin(result, out, rubric)


def unreadable_into(unreadable, rubric, out: Path) -> Written:
    """Write the result of a hand-in that could not be read (a grader.intake.find.Unreadable):
    invalid, scored 0 only where the rubric's `files.invalid_scores_zero` says so."""
    result = ungraded(new_result(unreadable.student, unreadable.name, unreadable.sha256, rubric), rubric,
                      Status.INVALID, unreadable.message, "not run: the hand-in could not be read",
                      score=0.0 if rubric.files.invalid_scores_zero else None)
    return write_handin(result, out, rubric)


def limited_into(path: Path, rubric, metadata: Path):
    """When this Gradescope submission is past the course's limit of graded submissions
    (report.limited_results, counted from `metadata`), write the results.json of its latest graded
    one at `path`, saying why, and return it; else None, and nothing is written."""
    doc = limited_results(Path(metadata), rubric.gradescope.max_submissions, rubric.gradescope.window_hours)
    if doc is not None:
        doc.setdefault("extra_data", {})["network"] = "no hand-in code ran"
        write_json(path, doc)
    return doc


def gradescope_into(path: Path, rubric, result, network: str) -> dict:
    """Write Gradescope's results.json of `result` (a HandinResult) at `path`, the one file its
    container reads, and return it. `network`: what hand-in code could reach, kept in its extra_data."""
    doc = gradescope_results(result.to_dict(), _weights(rubric))
    doc["extra_data"]["network"] = network
    write_json(path, doc)
    return doc
