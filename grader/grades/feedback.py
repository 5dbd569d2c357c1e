"""Feedback back through the LMS: each student's feedback, headed by the grade that LMS shows.

`gradebook --feedback` writes OUT/feedback-upload/, from the hand-in that counted for each student
in the final gradebook and the names the download gave it (OUT/students/<key>/download.json).
Every file starts with the student's grade statement (grader.grades.statement: the grade as the
LMS shows it, scaled as its import was, and each step from the autograde to it: overrides, the
late penalty, late days), then the autograder's feedback.md, whose score line reads "Autograde":

- **Moodle**, `moodle-feedback.zip`: a folder per student named as in the download,
  `Full Name_id_assignsubmission_file_/assignment4-feedback.md`; upload it with View all
  submissions > Grading action > Upload multiple feedback files in a zip. With
  `--lms moodle:WORKSHEET.csv` the worksheet's `Feedback comments` get the statement too.
- **Canvas**, `canvas-feedback.zip`: `login_[LATE_]userid_submissionid_assignment4-feedback.md`, the
  download's prefix, by which Canvas tells whose it is; upload it with Assignments > Re-Upload
  Submissions: each file becomes a comment with an attachment on that student's submission.
- **Blackboard** takes no feedback files in bulk: with `--lms blackboard:GRADE_CENTER.csv` the
  statement and each part's outcome go into the upload's `Feedback to Learner` column.
- **Gradescope** takes none either (its students see the autograder's results.json):
  `gradescope-feedback.zip` holds one folder per submission of the export (`submission_N/`), for the
  course to hand out.
"""

import io
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from grader.grades.statement import markdown, number, statement
from grader.kit import atomic_write
from grader.lmss import LMSS
from grader.names import plain, student_dir
from grader.parts import BY_ID, PART_IDS

FOLDER = "feedback-upload"
NAME = "assignment4-feedback.md"


@dataclass
class Uploads:
    written: dict = field(default_factory=dict)   # lms -> the zip written
    counts: dict = field(default_factory=dict)    # lms -> feedback files in it
    left_out: list = field(default_factory=list)  # "student: why no feedback file was made"
    notes: list = field(default_factory=list)     # sentences for the TA, once per LMS


def counted(book, results: list) -> dict:
    """student -> the result (grading.json dict) that counted for them in `book`."""
    by_key = {(r["source"], r["sha256"]): r for r in results}
    return {row.student: by_key[(row.source, row.sha256)] for row in book.rows
            if (row.source, row.sha256) in by_key}


def part_lines(result: dict) -> list:
    """Each part's outcome in a line (for an LMS cell, where the full feedback cannot go)."""
    parts = result.get("parts") or {}
    return [f"{BY_ID[i].title}: {number(p['score'])} / {number(p['max_score'])}, {p['status']}"
            + (f": {plain(p['message'])[:200]}" if p.get("message") and p["status"] != "passed" else "")
            for i, p in ((i, parts[i]) for i in PART_IDS if i in parts)]


def with_statement(text: str, said) -> str:
    """feedback.md under the statement `said`; its score line says what it scores: the autograde."""
    lines = text.split("\n")
    lines = [line.replace("**Score: ", "**Autograde: ", 1) if line.startswith("**Score: ") else line for line in lines]
    head = lines[:2] if lines and lines[0].startswith("# ") else []
    return "\n".join(head) + ("\n" if head else "") + markdown(said) + "\n" + "\n".join(lines[len(head):])


def _member(lms: str, upload: str) -> str:
    return f"{upload}_{NAME}" if LMSS[lms].feedback_flat else f"{upload}/{NAME}"


def _zip(files: dict) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in sorted(files.items()):
            z.writestr(name, text)
    return buffer.getvalue()


def write_uploads(out, book, results: list, filled: dict = None) -> Uploads:
    """Write OUT/feedback-upload/<lms>-feedback.zip for each LMS the results came from; `filled`
    (lms -> grader.grades.lms.sheet.Filled) gives each student's points possible in that LMS."""
    out, uploads, filled = Path(out), Uploads(), filled or {}
    members, chosen = {lms.name: {} for lms in LMSS.values() if lms.feedback_goes}, counted(book, results)
    in_sheet = {}
    for row in book.rows:
        result = chosen.get(row.student)
        if result is None:
            if row.source or "missing" not in row.flags:
                uploads.left_out.append(f"{row.student}: no hand-in counted yet ({';'.join(row.flags)})")
            continue
        download = result.get("download") or {}
        lms, upload = download.get("lms", ""), download.get("upload", "")
        if lms in LMSS and LMSS[lms].feedback_column:
            in_sheet[lms] = in_sheet.get(lms, 0) + 1
            continue
        if lms not in members or not upload:
            uploads.left_out.append(f"{row.student}: {lms or 'not from an LMS download'}; its feedback is "
                                    f"{student_dir(out, result['student']) / 'feedback.md'}")
            continue
        try:
            text = (student_dir(out, result["student"]) / "feedback.md").read_text()
        except OSError as e:
            uploads.left_out.append(f"{row.student}: no feedback.md ({e.strerror}); grade the hand-in again")
            continue
        shown = lms in filled and row.student in filled[lms].points   # its grade is in the LMS's import
        said = statement(row, book.max_score, lms if shown else "", filled[lms].points[row.student] if shown else None)
        members[lms][_member(lms, plain(upload))] = with_statement(text, said)
    for lms, count in in_sheet.items():
        where = filled[lms].written if lms in filled else f"--lms {lms}:FILE"
        uploads.notes.append(f"{LMSS[lms].title} takes no feedback files: {count} student(s)' feedback goes in "
                             f"the {LMSS[lms].feedback_column} column of {where}")
    for lms, files in members.items():
        if files:
            target = out / FOLDER / f"{lms}-feedback.zip"
            atomic_write(target, _zip(files))
            uploads.written[lms], uploads.counts[lms] = str(target), len(files)
    return uploads
