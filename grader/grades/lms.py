"""Fill the final grades into the file an LMS exported, giving the file to import back.

- **Canvas**: the gradebook export (Grades > Export). Its columns are `Student, ID, SIS User ID,
  SIS Login ID, [Integration ID,] Section`, one per assignment named `Title (assignment id)`,
  then totals; its second row is `Points Possible`. A student is matched by SIS User ID, SIS Login
  ID, Integration ID or Canvas ID (the id in Canvas's bulk-download file names). The file written
  holds the identifying columns and the assignment's column only, so an import changes nothing
  else.
- **Moodle**: the assignment's offline grading worksheet (View all submissions > Grading action >
  Download grading worksheet): `Identifier, Full name, Email address, Status, Grade, Maximum
  Grade, Grade can be changed, Last modified (submission), Last modified (grade), Feedback
  comments`. A student is matched by the number in `Participant 12345` (the id in Moodle's
  bulk-download names), ID number, username or email. `Grade` changes, and `Feedback comments`
  when feedback texts are given (`gradebook --feedback`). Its `Last modified (submission)` is
  the submission time (`read_moodle_times`, in the deadline's zone: the worksheet gives none).

Grades are scaled from the rubric's maximum to the LMS's (Points Possible, Maximum Grade). A
student with no final grade yet (a flag says why) keeps the cell as it was and is reported.
"""

import csv
import io
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from grader.grades.book import Book
from grader.grades.sources import Submission
from grader.names import cell
from grader.kit import atomic_write
from grader.results import ToDict

CANVAS_IDS = ("SIS User ID", "SIS Login ID", "Integration ID", "ID")
CANVAS_KEEP = ("Student", "ID", "SIS User ID", "SIS Login ID", "Integration ID", "Section")
MOODLE_IDS = ("ID number", "Username", "Email address")


class LmsError(ValueError):
    """The LMS file cannot be filled in; the message says what is wrong with it."""


@dataclass
class Filled(ToDict):
    lms: str
    written: str
    column: str
    filled: int = 0
    kept: list = field(default_factory=list)          # "student: why their cell was left as it was"
    not_in_export: list = field(default_factory=list)  # students of the gradebook the LMS file lacks


def _read(path: Path) -> list:
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except OSError as e:
        raise LmsError(f"{path}: cannot read it ({e.strerror})") from e
    except UnicodeDecodeError:
        raise LmsError(f"{path}: not UTF-8 text; export it again as CSV") from None
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        raise LmsError(f"{path}: empty")
    return rows


def _write(rows: list) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\r\n").writerows(rows)
    return buffer.getvalue()


def _number(text: str):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _grade(final: float, book: Book, lms_max) -> str:
    scaled = final * lms_max / book.max_score if lms_max and book.max_score else final
    return f"{scaled:.2f}"


def _by_key(book: Book) -> dict:
    return {r.student: r for r in book.rows}


def _fill_row(filled: Filled, row, keys: list, grades: dict, seen: set, who: str):
    """The gradebook row of the LMS row with ids `keys`, or None (then it is reported)."""
    match = next((grades[k] for k in keys if k in grades), None)
    if match is None:
        filled.kept.append(f"{who}: not in the gradebook")
        return None
    seen.add(match.student)
    if match.final is None:
        filled.kept.append(f"{who} ({match.student}): no final grade yet ({';'.join(match.flags)})")
        return None
    return match


def fill_canvas(export: Path, book: Book, assignment: str = None) -> tuple:
    """(the import file's text, Filled) for Canvas's gradebook export `export`."""
    rows = _read(export)
    header = [h.strip() for h in rows[0]]
    if "Student" not in header or "ID" not in header:
        raise LmsError(f"{export}: not a Canvas gradebook export (no Student and ID columns)")
    every = [h for h in header if re.search(r"\(\d+\)$", h)]
    columns = [h for h in every if assignment.lower() in h.lower()] if assignment else every
    if len(columns) != 1:
        which = f"match {assignment!r}" if assignment else "in it"
        raise LmsError(f"{export}: {len(columns) or 'no'} assignment columns {which}; name the one to fill "
                       f"with --assignment (assignment columns: {', '.join(every) or 'none'})")
    column = header.index(columns[0])
    keep = [header.index(h) for h in CANVAS_KEEP if h in header] + [column]
    ids = [header.index(h) for h in CANVAS_IDS if h in header]
    filled = Filled("canvas", "", columns[0])
    grades, seen, out = _by_key(book), set(), [[header[i] for i in keep]]
    points = None
    for row in rows[1:]:
        row = row + [""] * (len(header) - len(row))
        name = row[header.index("Student")].strip()
        if name == "Points Possible" or not row[header.index("ID")].strip():
            points = _number(row[column]) if name == "Points Possible" else points
            out.append([row[i] for i in keep])
            continue
        if name == "Student, Test":   # Canvas's test student
            continue
        match = _fill_row(filled, row, [row[i].strip() for i in ids if row[i].strip()], grades, seen, name)
        if match is not None:
            row[column] = _grade(match.final, book, points)
            filled.filled += 1
        out.append([row[i] for i in keep])
    filled.not_in_export = [r.student for r in book.rows if r.student not in seen]
    return _write(out), filled


MOODLE_TIME = "Last modified (submission)"
MOODLE_TIME_FORMATS = ("%A, %d %B %Y, %I:%M %p", "%A, %d %B %Y, %H:%M", "%d %B %Y, %I:%M %p", "%d %B %Y, %H:%M",
                       "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M")


def read_moodle_times(worksheet: Path, zone) -> list:
    """The submission times of Moodle's grading worksheet (`Last modified (submission)`, read in
    `zone`), as grader.grades.sources.Submission for each participant id that has one."""
    rows = _read(worksheet)
    header = [h.strip() for h in rows[0]]
    if "Identifier" not in header or MOODLE_TIME not in header:
        return []
    found = []
    for line, row in enumerate(rows[1:], start=2):
        row = row + [""] * (len(header) - len(row))
        text = row[header.index(MOODLE_TIME)].strip()
        number = re.sub(r"^\D+", "", row[header.index("Identifier")].strip())
        if not number or text in ("", "-"):
            continue
        for fmt in MOODLE_TIME_FORMATS:
            try:
                when = datetime.strptime(text, fmt).replace(tzinfo=zone)
                break
            except ValueError:
                continue
        else:
            raise LmsError(f"{worksheet} line {line}: {MOODLE_TIME} {text!r} is not a time this reads "
                           f"(e.g. Tuesday, 14 April 2026, 11:59 PM); download the worksheet in English")
        found.append(Submission((number,), when, "", f"{worksheet} line {line}"))
    return found


def fill_moodle(worksheet: Path, book: Book, feedback: dict = None) -> tuple:
    """(the worksheet to upload, Filled) for Moodle's offline grading worksheet; `feedback`
    (student -> a short text) fills `Feedback comments` too."""
    rows = _read(worksheet)
    header = [h.strip() for h in rows[0]]
    for needed in ("Identifier", "Grade"):
        if needed not in header:
            raise LmsError(f"{worksheet}: not a Moodle grading worksheet (no {needed} column)")
    grade, most = header.index("Grade"), header.index("Maximum Grade") if "Maximum Grade" in header else None
    can = header.index("Grade can be changed") if "Grade can be changed" in header else None
    ids = [header.index(h) for h in MOODLE_IDS if h in header]
    comments = header.index("Feedback comments") if feedback and "Feedback comments" in header else None
    filled = Filled("moodle", "", "Grade" if comments is None else "Grade, Feedback comments")
    grades, seen, out = _by_key(book), set(), [rows[0]]
    for row in rows[1:]:
        row = row + [""] * (len(header) - len(row))
        ident = row[header.index("Identifier")].strip()
        number = re.sub(r"^\D+", "", ident)
        keys = [number] + [row[i].strip() for i in ids if row[i].strip()]
        match = _fill_row(filled, row, keys, grades, seen, ident)
        if match is not None and can is not None and row[can].strip().lower() == "no":
            filled.kept.append(f"{ident} ({match.student}): Moodle says the grade cannot be changed (locked "
                               f"or overridden in the gradebook)")
        elif match is not None:
            row[grade] = _grade(match.final, book, _number(row[most]) if most is not None else None)
            filled.filled += 1
        if match is not None and comments is not None and match.student in feedback:
            row[comments] = cell(feedback[match.student])
        out.append(row[:len(header)])
    filled.not_in_export = [r.student for r in book.rows if r.student not in seen]
    return _write(out), filled


def fill(spec: str, book: Book, output: Path, assignment: str = None, feedback: dict = None) -> Filled:
    """Fill the LMS file of `spec` ("canvas:EXPORT.csv" or "moodle:WORKSHEET.csv") and write the file
    to import beside `output` as <its name>-import.csv (`feedback`: Moodle's Feedback comments)."""
    lms, _, path = spec.partition(":")
    if lms not in ("canvas", "moodle") or not path:
        raise LmsError(f"--lms {spec}: expected canvas:EXPORTED.csv or moodle:WORKSHEET.csv")
    path = Path(path)
    text, filled = fill_canvas(path, book, assignment) if lms == "canvas" else fill_moodle(path, book, feedback)
    target = Path(output).parent / f"{path.stem}-import.csv"
    atomic_write(target, text)
    filled.written = str(target)
    return filled
