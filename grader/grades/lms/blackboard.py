"""Blackboard: the Grade Center's upload file, from its download.

The download (Grade Center > Work Offline > Download: the full Grade Center, or better the
assignment's column alone with "Include comments for this Column") names each grade column as
`Title [Total Pts: 100 Score] |123456`: the points possible, the primary display and the column's
id. Blackboard's upload (Work Offline > Upload, delimiter Auto) finds each student by `Username`
and each column by that id: a header without it would make a new text column of 0 points. So the
file written holds the identity columns (`Last Name, First Name, Username, Student ID`; never
`Last Access` or `Availability`), the assignment's column with its header exactly as downloaded,
and with feedback the comment columns that follow a column downloaded with its comments:
`Grading Notes, Notes Format, Feedback to Learner, Feedback Format` (the student's grade statement
as HTML in `Feedback to Learner`). Every value is quoted, as Blackboard asks of a comma file, and
the file keeps the download's delimiter and encoding (the tab-delimited .xls download is UTF-16).
A calculated column (`[Total Pts: up to 100 ...]`, Weighted Total, Total) is never filled.

The grade is the final grade scaled to the column's points possible. A student is matched by
Username (the id in the Assignment File Download's names), else by Student ID.
"""

import re
from pathlib import Path

from grader.grades.lms.sheet import Filled, LmsError, ids_of, match_row, read_sheet
from grader.grades.statement import as_html, cell, statement
from grader.names import cell as inert_cell

COLUMN = re.compile(r"^(?P<title>.*?) \[Total Pts: (?P<upto>up to )?(?P<points>[\d.,]+) (?P<display>[^\]]+)\] "
                    r"\|(?P<id>\d+)$")
IDENTITY = ("Last Name", "First Name", "Username", "Student ID")
COMMENTS = ("Grading Notes", "Notes Format", "Feedback to Learner", "Feedback Format")
CALCULATED = ("Weighted Total", "Total")


def columns(header: list) -> dict:
    """Header -> its COLUMN match, for every grade column that can be filled (not calculated)."""
    found = {}
    for h in header:
        match = COLUMN.match(h)
        if match and not match["upto"] and match["title"] not in CALCULATED:
            found[h] = match
    return found


def _column(sheet, assignment: str):
    every = columns(sheet.header)
    chosen = [h for h in every if assignment.lower() in every[h]["title"].lower()] if assignment else list(every)
    if len(chosen) != 1:
        which = f"match {assignment!r}" if assignment else "in it"
        raise LmsError(f"{sheet.path}: {len(chosen) or 'no'} grade columns {which}; name the one to fill with "
                       f"--assignment (grade columns: {', '.join(every) or 'none: download the Grade Center again'})")
    return chosen[0], every[chosen[0]]


def fill_blackboard(download: Path, book, assignment: str = None, feedback: dict = None, **_) -> tuple:
    """(the upload file's bytes, Filled) for Blackboard's Grade Center download `download`; with
    `feedback` (student -> lines after the statement), the comment columns too."""
    sheet = read_sheet(download, "Grade Center download")
    if sheet.index("Username") is None:
        raise LmsError(f"{download}: not a Blackboard Grade Center download (no Username column); download it "
                       f"with Grade Center > Work Offline > Download")
    header, match = _column(sheet, assignment)
    points = float(match["points"].replace(",", ""))
    if match["display"].strip() not in ("Score", "Percentage"):
        raise LmsError(f"{download}: the column {header!r} shows {match['display']}; a grade upload needs a "
                       f"Score or Percentage column (edit the column's Primary Display in Blackboard)")
    identity = [h for h in IDENTITY if sheet.index(h) is not None]
    names = identity + [header] + (list(COMMENTS) if feedback is not None else [])
    filled = Filled("blackboard", "", header)
    if feedback is not None and any(sheet.index(c) is None for c in COMMENTS):
        filled.notes.append(f"{download}: downloaded without its comments; the upload adds them (download the "
                            f"column alone with 'Include comments for this Column' to see them as Blackboard does)")
    grades, seen, out = {r.student: r for r in book.rows}, set(), [names]
    kinds = {h: (lambda row, i=sheet.index(h): row[i])
             for h in ("Username", "Student ID") if sheet.index(h) is not None}
    body = sheet.body()
    for row, key in zip(body, ids_of(filled, body, kinds, grades)):
        take = {h: row[sheet.index(h)] if sheet.index(h) is not None else "" for h in names}
        take.update({h: inert_cell(take[h]) for h in ("Last Name", "First Name") if h in take})
        who = row[sheet.index("Username")].strip()
        found = match_row(filled, key, grades, seen, who)
        if found is not None:
            take[header] = cell(found.final, book.max_score, points)
            filled.points[found.student] = points
            filled.filled += 1
            if feedback is not None:
                said = statement(found, book.max_score, "blackboard", points)
                take.update({"Feedback to Learner": as_html(said, feedback.get(found.student, ())),
                             "Feedback Format": "HTML", "Notes Format": take["Notes Format"] or "HTML"})
        out.append([take[h] for h in names])
    filled.not_in_export = [r.student for r in book.rows if r.student not in seen]
    return sheet.render(out, quote_all=True), filled
