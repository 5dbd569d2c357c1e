"""Feedback back through the LMS: each student's feedback.md, shaped for the LMS's own bulk upload.

`gradebook --feedback` writes OUT/feedback-upload/, from the hand-in that counted for each student
in the final gradebook and the names the download gave it (OUT/students/<key>/download.json):

- **Moodle**, `moodle-feedback.zip`: a folder per student named as in the download,
  `Full Name_id_assignsubmission_file_/assignment4-feedback.md`; upload it with View all
  submissions > Grading action > Upload multiple feedback files in a zip. With
  `--lms moodle:WORKSHEET.csv` the worksheet's `Feedback comments` get `short_text` too (Grading
  action > Upload grading worksheet).
- **Canvas**, `canvas-feedback.zip`: `login_[LATE_]userid_submissionid_assignment4-feedback.md`, the
  download's prefix, by which Canvas tells whose it is; upload it with Assignments > Re-Upload
  Submissions: each file becomes a comment with an attachment on that student's submission.
- Gradescope's students see the autograder's results.json; Blackboard has no bulk upload of
  feedback files: their feedback.md files are listed, not zipped.
"""

import io
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from grader.names import plain, student_dir

FOLDER = "feedback-upload"
NAME = "assignment4-feedback.md"
ZIPS = {"moodle": "moodle-feedback.zip", "canvas": "canvas-feedback.zip"}


@dataclass
class Uploads:
    written: dict = field(default_factory=dict)   # lms -> the zip written
    counts: dict = field(default_factory=dict)    # lms -> feedback files in it
    left_out: list = field(default_factory=list)  # "student: why no feedback file was made"


def counted(book, results: list) -> dict:
    """student -> the result (grading.json dict) that counted for them in `book`."""
    by_key = {(r["source"], r["sha256"]): r for r in results}
    return {row.student: by_key[(row.source, row.sha256)] for row in book.rows
            if (row.source, row.sha256) in by_key}


def short_text(row, max_score: float) -> str:
    """The LMS's feedback comment: the final grade and where the feedback is."""
    if row.final is None:
        return f"Autograder: no grade yet ({';'.join(row.flags)}); see {NAME}."
    late = f", {row.late_days} day(s) late, -{row.penalty:g}" if row.penalty else ""
    return f"Autograder: {row.final:g} / {max_score:g}{late}. What was checked and why: {NAME}."


def _member(lms: str, upload: str) -> str:
    return f"{upload}/{NAME}" if lms == "moodle" else f"{upload}_{NAME}"


def write_uploads(out, book, results: list) -> Uploads:
    """Write OUT/feedback-upload/<lms>-feedback.zip for each LMS the results came from."""
    out, uploads = Path(out), Uploads()
    members = {lms: {} for lms in ZIPS}
    for row in book.rows:
        result = counted(book, results).get(row.student)
        if result is None:
            if row.source or "missing" not in row.flags:
                uploads.left_out.append(f"{row.student}: no hand-in counted yet ({';'.join(row.flags)})")
            continue
        download = result.get("download") or {}
        lms, upload = download.get("lms", ""), download.get("upload", "")
        if lms not in ZIPS or not upload:
            uploads.left_out.append(f"{row.student}: {lms or 'not from an LMS download'}; its feedback is "
                                    f"{student_dir(out, result['student']) / 'feedback.md'}")
            continue
        try:
            text = (student_dir(out, result["student"]) / "feedback.md").read_text()
        except OSError as e:
            uploads.left_out.append(f"{row.student}: no feedback.md ({e.strerror}); grade the hand-in again")
            continue
        members[lms][_member(lms, plain(upload))] = text
    for lms, files in members.items():
        if not files:
            continue
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
            for name, text in sorted(files.items()):
                z.writestr(name, text)
        target = out / FOLDER / ZIPS[lms]
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".part")
        tmp.write_bytes(buffer.getvalue())
        tmp.replace(target)
        uploads.written[lms], uploads.counts[lms] = str(target), len(files)
    return uploads

