"""Moodle: the assignment's offline grading worksheet, filled, and the submission times it carries.

The worksheet (View all submissions > Grading action > Download grading worksheet) has
`Identifier, Full name, Email address, Status, Grade, Maximum Grade, Grade can be changed, Last
modified (submission), Last modified (grade), Feedback comments`; Moodle's upload (Grading
action > Upload grading worksheet) finds each row by its `Identifier` (`Participant 12345`), so
every column and row is written back as it came, `Identifier` untouched, `Full name` through
grader.names.cell. A student is matched by the number in `Participant 12345` (the id in Moodle's
bulk-download names), ID number, username or email, each kind only against ids of its own kind
(grader.grades.lms.sheet.ids_of).
`Grade` gets the final grade scaled to the row's `Maximum Grade`; a row Moodle says cannot be
changed (locked, or overridden in the gradebook) is kept and reported. With feedback,
`Feedback comments` gets the student's grade statement (grader.grades.statement.text): the grade
that row shows, and why it differs from the autograde.

`Last modified (submission)` is the submission time (`read_moodle_times`, in the deadline's zone:
the worksheet gives none).
"""

import re
from datetime import datetime
from pathlib import Path

from grader.grades.lms.sheet import Filled, LmsError, ids_of, match_row, number, read_sheet
from grader.grades.sources import Submission
from grader.grades.statement import cell, statement, text
from grader.names import cell as inert_cell

IDS = ("ID number", "Username", "Email address")
TIME = "Last modified (submission)"
TIME_FORMATS = ("%A, %d %B %Y, %I:%M %p", "%A, %d %B %Y, %H:%M", "%d %B %Y, %I:%M %p", "%d %B %Y, %H:%M",
                "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M")


def read_moodle_times(worksheet: Path, zone) -> list:
    """The submission times of Moodle's grading worksheet (`Last modified (submission)`, read in
    `zone`), as grader.grades.sources.Submission for each participant id that has one."""
    sheet = read_sheet(worksheet, "grading worksheet")
    ident, at = sheet.index("Identifier"), sheet.index(TIME)
    if ident is None or at is None:
        return []
    found = []
    for line, row in enumerate(sheet.body(), start=2):
        when, participant = row[at].strip(), re.sub(r"^\D+", "", row[ident].strip())
        if not participant or when in ("", "-"):
            continue
        for fmt in TIME_FORMATS:
            try:
                parsed = datetime.strptime(when, fmt).replace(tzinfo=zone)
                break
            except ValueError:
                continue
        else:
            raise LmsError(f"{worksheet} line {line}: {TIME} {when!r} is not a time this reads "
                           f"(e.g. Tuesday, 14 April 2026, 11:59 PM); download the worksheet in English")
        found.append(Submission((participant,), parsed, "", f"{worksheet} line {line}"))
    return found


def fill_moodle(worksheet: Path, book, feedback: dict = None, **_) -> tuple:
    """(the worksheet to upload, Filled) for Moodle's offline grading worksheet; with `feedback`
    (student -> lines), `Feedback comments` gets each filled student's grade statement."""
    sheet = read_sheet(worksheet, "grading worksheet")
    for needed in ("Identifier", "Grade"):
        if sheet.index(needed) is None:
            raise LmsError(f"{worksheet}: not a Moodle grading worksheet (no {needed} column); download it with "
                           f"View all submissions > Grading action > Download grading worksheet")
    ident, grade, most = sheet.index("Identifier"), sheet.index("Grade"), sheet.index("Maximum Grade")
    can, comments = sheet.index("Grade can be changed"), sheet.index("Feedback comments")
    comments = comments if feedback is not None else None
    filled = Filled("moodle", "", "Grade" if comments is None else "Grade, Feedback comments")
    if feedback is not None and comments is None:
        filled.notes.append(f"{worksheet}: no Feedback comments column (the assignment's feedback comments "
                            f"are off): grades only")
    grades, seen, out = {r.student: r for r in book.rows}, set(), [sheet.rows[0]]
    kinds = {"Participant": lambda row: re.sub(r"^\D+", "", row[ident].strip())}
    kinds |= {h: (lambda row, i=sheet.index(h): row[i]) for h in IDS if sheet.index(h) is not None}
    body, named = sheet.body(), sheet.index("Full name")
    for row, key in zip(body, ids_of(filled, body, kinds, grades)):
        who = row[ident].strip()
        if named is not None:
            row[named] = inert_cell(row[named])
        match = match_row(filled, key, grades, seen, who)
        if match is not None and can is not None and row[can].strip().lower() == "no":
            filled.kept.append(f"{who} ({match.student}): Moodle says the grade cannot be changed (locked "
                               f"or overridden in the gradebook)")
        elif match is not None:
            points = number(row[most]) if most is not None else None
            row[grade] = cell(match.final, book.max_score, points)
            filled.points[match.student] = points
            filled.filled += 1
            if comments is not None:
                row[comments] = inert_cell(text(statement(match, book.max_score, "moodle", points)))
        out.append(row[:len(sheet.rows[0])])
    filled.not_in_export = [r.student for r in book.rows if r.student not in seen]
    return sheet.render(out), filled
