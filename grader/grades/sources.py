"""Where submission times, group members and student ids come from. Never from the clock.

- a CSV `student,submitted_at[,source]` (an LMS export): one row per hand-in; `source`, when given,
  is the hand-in's file name as grading.json records it, so that several hand-ins of one student
  can be told apart. Times are ISO 8601 with a zone (2026-04-14T23:59:00+02:00, or ...Z).
- Gradescope's `submission_metadata.json` (one object, or a list of them): `created_at` is the
  submission time, `users` the students (all of a group hand-in), each by `sid`, else `email`,
  else `id` (grader.names.gradescope_user, as `python -m grader gradescope` names a submission).
- Canvas's submissions, a page of its API saved from the browser (`.../api/v1/courses/C/assignments/
  A/submissions?per_page=100`, `while(1);` and all; grader.grades.lms.canvas says how): `submitted_at`
  per `user_id`. With an API token `gradebook --canvas` reads the same (grader.grades.lms.canvas).
- the LMS files `gradebook --lms` fills: Moodle's worksheet, Gradescope's grade export
  (grader.grades.lms.imports.times).
- LMS bulk-download file names (each LMS's `names`, grader.lmss): Moodle's
  `Full Name_12345_assignsubmission_file_...` and Canvas's `name_12345_67890_file.zip`, whose
  `LATE` marker (`name_LATE_12345_67890_file.zip`) says the LMS saw it after the due date; it is
  reported, never turned into a time.
- the roster: a CSV with a `student` column; its other columns are kept in the final gradebook.
"""

import csv
import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from grader.grades.policy import PolicyError, parse_time
from grader.lmss import LMSS
from grader.names import gradescope_user, innermost

CANVAS_GUARD = "while(1);"   # what Canvas puts before the JSON it shows a logged-in browser


@dataclass
class Submission:
    students: tuple          # every student it counts for (a group hand-in has several)
    submitted_at: datetime
    source: str = ""         # the hand-in's file name, when the record names it
    origin: str = ""         # where the record comes from ("submissions.csv line 3"), for messages


def _read_csv(path: Path, what: str) -> tuple:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise PolicyError(f"{path}: cannot read the {what} ({e.strerror})") from e
    except UnicodeDecodeError:
        raise PolicyError(f"{path}: not UTF-8 text; save the {what} as CSV UTF-8") from None
    reader = csv.DictReader(text.splitlines())
    columns = [c.strip() for c in reader.fieldnames or []]
    rows = [{(k or "").strip(): (v or "").strip() for k, v in row.items()} for row in reader]
    return columns, rows


def read_submissions_csv(path: Path) -> list:
    columns, rows = _read_csv(path, "submission times")
    missing = [c for c in ("student", "submitted_at") if c not in columns]
    if missing:
        raise PolicyError(f"{path}: no column '{missing[0]}'; the columns must be student,submitted_at "
                          f"(and source, optionally); found: {', '.join(columns) or 'none'}")
    found = []
    for line, row in enumerate(rows, start=2):
        if not row["student"]:
            continue
        where = f"{path} line {line}"
        found.append(Submission((row["student"],), parse_time(row["submitted_at"], where),
                                row.get("source", ""), where))
    return found


def _json(path: Path):
    """A JSON file's document; Canvas's `while(1);` prefix (a page saved from the browser) is skipped."""
    try:
        text = path.read_text(encoding="utf-8-sig").strip()
    except OSError as e:
        raise PolicyError(f"{path}: cannot read it ({e.strerror})") from e
    except UnicodeDecodeError:
        raise PolicyError(f"{path}: not UTF-8 text; save it again") from None
    try:
        return json.loads(text[len(CANVAS_GUARD):] if text.startswith(CANVAS_GUARD) else text)
    except ValueError as e:
        raise PolicyError(f"{path}: not valid JSON ({e})") from e


def read_canvas_submissions(data: list, path: Path) -> list:
    """Canvas's submissions (a page of its API, saved from the browser): `submitted_at` for `user_id`,
    the id of its bulk download's names; students who have not submitted have none."""
    found = []
    for i, item in enumerate(data):
        if isinstance(item, dict) and item.get("submitted_at") and item.get("user_id") is not None:
            where = f"{path}[{i}]"
            found.append(Submission((str(item["user_id"]),), parse_time(str(item["submitted_at"]),
                                                                        f"{where}.submitted_at"), "", where))
    return found


def is_canvas_submissions(data) -> bool:
    return isinstance(data, list) and any(isinstance(i, dict) and "user_id" in i and "submitted_at" in i for i in data)


def read_gradescope_metadata(path: Path, data=None) -> list:
    data = _json(path) if data is None else data
    found = []
    for i, item in enumerate(data if isinstance(data, list) else [data]):
        where = f"{path}[{i}]" if isinstance(data, list) else str(path)
        if not isinstance(item, dict) or "created_at" not in item:
            raise PolicyError(f"{where}: not Gradescope submission metadata (no created_at)")
        students = tuple(s for s in (gradescope_user(u) for u in item.get("users") or [] if isinstance(u, dict)) if s)
        if not students:
            raise PolicyError(f"{where}: no users with an sid, email or id")
        found.append(Submission(students, parse_time(item["created_at"], f"{where}.created_at"), "", where))
    return found


def read_submissions(paths) -> list:
    """Every Submission in the files `paths`: a .json is Canvas's submissions (a list with user_id and
    submitted_at) or Gradescope's metadata; anything else a CSV."""
    found = []
    for path in map(Path, paths):
        if path.suffix.lower() != ".json":
            found += read_submissions_csv(path)
            continue
        data = _json(path)
        found += read_canvas_submissions(data, path) if is_canvas_submissions(data) else \
            read_gradescope_metadata(path, data)
    return found


def read_roster(path: Path) -> tuple:
    """(the roster's other columns, {student: {column: value}}) in the roster's order."""
    columns, rows = _read_csv(Path(path), "roster")
    if "student" not in columns:
        raise PolicyError(f"{path}: no column 'student' (the ids the hand-ins are graded under); "
                          f"found: {', '.join(columns) or 'none'}")
    roster = {}
    for line, row in enumerate(rows, start=2):
        student = row.pop("student")
        if not student:
            continue
        if student in roster:
            raise PolicyError(f"{path} line {line}: {student} is on the roster twice")
        roster[student] = row
    return [c for c in columns if c != "student"], roster


def lms_marks(source: str) -> dict:
    """What an LMS bulk-download name says of a hand-in: {"lms": its name, "id", "late"} or {}."""
    name = innermost(source)
    for lms in LMSS.values():
        match = re.search(lms.names, name) if lms.names else None
        if match:
            return {"lms": lms.name, "id": match.group("id"), "late": bool(match.groupdict().get("late"))}
    return {}


def same_source(recorded: str, source: str) -> bool:
    """Whether a record's `source` names the hand-in graded from `source` (its file name, or the
    name of a zip inside a bulk download: grader.names.innermost)."""
    if not recorded:
        return False
    return recorded in (source, innermost(source), Path(innermost(source)).name)
