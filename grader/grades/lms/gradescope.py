"""Gradescope: the assignment's grade export, filled with the final grades, and the times in it.

Gradescope imports no grade file: for its own page, a course grades through the autograder
(`python -m grader gradescope`, whose results.json is what students see there). A course that
grades Gradescope's export (Review Grades > Export Submissions) with `grade` takes its grades back
in the columns of Gradescope's grade export (Review Grades > Download Grades > CSV): `First Name,
Last Name` (or `Name`), `SID, Email, Sections, Total Score, Max Points, Status, Submission ID,
Submission Time, Lateness (H:M:S), View Count, Submission Count`, then a column per question.
That file is filled in place (every column and row kept, `Total Score` the final grade scaled to
the row's `Max Points`), for wherever the course keeps its grades (its LMS's import of a Gradescope
export, a spreadsheet). A student is matched by SID, else Email (the ids `grade` gives a Gradescope
export's submitters).

`Submission Time` is the submission time (`read_gradescope_times`; its zone is in the text, else
the deadline's).
"""

from datetime import datetime
from pathlib import Path

from grader.grades.lms.sheet import Filled, LmsError, ids_of, match_row, number, read_sheet
from grader.grades.sources import Submission
from grader.grades.statement import cell
from grader.names import cell as inert_cell

IDS = ("SID", "Email")   # the download's id: the first submitter's sid, else email
NAMES = ("Name", "First Name", "Last Name")
TIME = "Submission Time"
TIME_FORMATS = ("%Y-%m-%d %H:%M:%S %z", "%Y-%m-%d %H:%M:%S.%f %z", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S%z")


def _sheet(export: Path):
    sheet = read_sheet(export, "Gradescope grades")
    missing = [c for c in ("Email", "Total Score", "Max Points") if sheet.index(c) is None]
    if missing:
        raise LmsError(f"{export}: not a Gradescope grade export (no {missing[0]} column); download it with "
                       f"Review Grades > Download Grades > CSV")
    return sheet


def read_gradescope_times(export: Path, zone) -> list:
    """The submission times of Gradescope's grade export (`Submission Time`), one per student with one."""
    sheet = _sheet(export)
    at, keys = sheet.index(TIME), [sheet.index(h) for h in IDS if sheet.index(h) is not None]
    if at is None:
        return []
    found = []
    for line, row in enumerate(sheet.body(), start=2):
        text, ident = row[at].strip(), next((row[i].strip() for i in keys if row[i].strip()), "")
        if not text or not ident:
            continue
        for fmt in TIME_FORMATS:
            try:
                when = datetime.strptime(text, fmt)
                break
            except ValueError:
                continue
        else:
            raise LmsError(f"{export} line {line}: {TIME} {text!r} is not a time this reads "
                           f"(e.g. 2026-04-14 21:10:00 +0200); download the grades again")
        found.append(Submission((ident,), when if when.tzinfo else when.replace(tzinfo=zone), "",
                                f"{export} line {line}"))
    return found


def fill_gradescope(export: Path, book, **_) -> tuple:
    """(the filled grade export's bytes, Filled) for Gradescope's grade export `export`."""
    sheet = _sheet(export)
    total, most = sheet.index("Total Score"), sheet.index("Max Points")
    keys = [sheet.index(h) for h in IDS if sheet.index(h) is not None]
    name = sheet.index("Name") if sheet.index("Name") is not None else sheet.index("Last Name")
    filled = Filled("gradescope", "", "Total Score")
    grades, seen, out = {r.student: r for r in book.rows}, set(), [sheet.rows[0]]
    kinds = {"SID, else Email": lambda row: next((row[i].strip() for i in keys if row[i].strip()), "")}
    kinds |= {"Email": (lambda row, i=sheet.index("Email"): row[i])} if sheet.index("Email") is not None else {}
    body, named = sheet.body(), [sheet.index(h) for h in NAMES if sheet.index(h) is not None]
    for row, key in zip(body, ids_of(filled, body, kinds, grades)):
        who = row[name].strip() if name is not None else row[keys[-1]].strip()
        for i in named:
            row[i] = inert_cell(row[i])
        match = match_row(filled, key, grades, seen, who)
        if match is not None:
            points = number(row[most])
            row[total] = cell(match.final, book.max_score, points)
            filled.points[match.student] = points
            filled.filled += 1
        out.append(row[:len(sheet.rows[0])])
    filled.not_in_export = [r.student for r in book.rows if r.student not in seen]
    return sheet.render(out), filled
