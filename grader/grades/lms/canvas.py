"""Canvas: the gradebook import, and the submission times its bulk download leaves out.

**Import** (Grades > Import): from the gradebook export (Grades > Export > Export Entire
Gradebook), a CSV with `Student, ID, SIS User ID, SIS Login ID, Section` (in that order; an
`Integration ID` or `Root Account` column the export has is kept, before `Section`), then the
assignment's column `Title (assignment id)`, and its rows as exported: `Points Possible` (and any
other row without an ID, such as `Manual Posting`) kept as they are, Canvas's test student left
out. Only those columns are written, so an import changes nothing else. A student is matched by
Canvas ID (the id in the bulk download's names), SIS User ID, SIS Login ID or Integration ID, each
kind only against ids of its own kind (grader.grades.lms.sheet.ids_of). The Student cell goes
through grader.names.cell. UTF-8, with the byte-order mark when the export had one.

**Submission times**: the bulk download says only `LATE`. Two ways to the times:

- without code: open the assignment's submissions in the browser where you are logged in to Canvas,
  `https://CANVAS/api/v1/courses/COURSE/assignments/ASSIGNMENT/submissions?per_page=100` (COURSE
  and ASSIGNMENT from the assignment page's address), and save the page (and `&page=2` ... while
  a page holds any); list the saved files in the policy's `submissions:` (grader.grades.sources
  reads them, Canvas's `while(1);` prefix included);
- with an API token (Account > Settings > New Access Token): `gradebook --canvas URL` with the
  assignment page's address and the token in the environment (CANVAS_API_TOKEN) or
  `--canvas-token`; `api_times` reads the same endpoint through canvasapi, page after page.

Each submission's `submitted_at` counts for its `user_id` (the id of the download's names).
"""

import re
from pathlib import Path

from grader.grades.lms.sheet import Filled, LmsError, ids_of, match_row, number, read_sheet
from grader.grades.sources import read_canvas_submissions
from grader.grades.statement import cell
from grader.names import cell as inert_cell

IDS = ("ID", "SIS User ID", "SIS Login ID", "Integration ID")   # the download's own (Canvas ID) first
REQUIRED = ("Student", "ID", "SIS User ID", "SIS Login ID")
OPTIONAL = ("Integration ID", "Root Account")
TEST_STUDENT = "Student, Test"
ASSIGNMENT_URL = re.compile(r"^(?P<base>https?://[^/?#]+(?:/[^?#]*?)?)/courses/(?P<course>\d+)/assignments/"
                            r"(?P<assignment>\d+)(?:[/?#].*)?$")
TOKEN_ENV = "CANVAS_API_TOKEN"


def _column(sheet, assignment: str) -> str:
    every = [h for h in sheet.header if re.search(r"\(\d+\)$", h)]
    columns = [h for h in every if assignment.lower() in h.lower()] if assignment else every
    if len(columns) != 1:
        which = f"match {assignment!r}" if assignment else "in it"
        raise LmsError(f"{sheet.path}: {len(columns) or 'no'} assignment columns {which}; name the one to fill "
                       f"with --assignment (assignment columns: {', '.join(every) or 'none'})")
    return columns[0]


def fill_canvas(export: Path, book, assignment: str = None, **_) -> tuple:
    """(the import file's bytes, Filled) for Canvas's gradebook export `export`."""
    sheet = read_sheet(export, "Canvas gradebook")
    header = sheet.header
    if "Student" not in header or "ID" not in header:
        raise LmsError(f"{export}: not a Canvas gradebook export (no Student and ID columns); export it with "
                       f"Grades > Export > Export Entire Gradebook")
    column = _column(sheet, assignment)
    names = list(REQUIRED) + [h for h in OPTIONAL if h in header] + ["Section", column]
    keep = [sheet.index(h) for h in names]
    filled = Filled("canvas", "", column)
    grades, seen, out = {r.student: r for r in book.rows}, set(), [names]
    student, ident, at, points = sheet.index("Student"), sheet.index("ID"), sheet.index(column), None
    body = sheet.body()
    keys = ids_of(filled, body, {h: (lambda row, i=sheet.index(h): row[i]) for h in IDS if h in header}, grades)
    for row, key in zip(body, keys):
        take = [row[i] if i is not None else "" for i in keep]
        name = row[student].strip()
        if not row[ident].strip():   # Points Possible, Manual Posting: as exported
            points = number(row[at]) if name == "Points Possible" else points
            out.append(take)
            continue
        if name == TEST_STUDENT:
            continue
        take[0] = inert_cell(take[0])   # Student: a display name, never a formula
        match = match_row(filled, key, grades, seen, name)
        if match is not None:
            take[-1] = cell(match.final, book.max_score, points)
            filled.points[match.student] = points
            filled.filled += 1
        out.append(take)
    filled.not_in_export = [r.student for r in book.rows if r.student not in seen]
    return sheet.render(out), filled


def api_times(url: str, token: str) -> list:
    """The submission times of the Canvas assignment whose page is `url`, read with `token` through
    Canvas's API (canvasapi: the submissions endpoint, every page by its Link header)."""
    match = ASSIGNMENT_URL.match(url.strip())
    if not match:
        raise LmsError(f"--canvas {url}: expected the assignment page's address, "
                       f"https://CANVAS/courses/COURSE/assignments/ASSIGNMENT")
    if not token:
        raise LmsError(f"--canvas: no API token; set {TOKEN_ENV} (Canvas: Account > Settings > New Access Token), "
                       f"or give --canvas-token")
    import requests
    from canvasapi import Canvas
    from canvasapi.exceptions import CanvasException
    try:
        course = Canvas(match["base"], token).get_course(int(match["course"]))
        items = [s.__dict__ for s in course.get_assignment(int(match["assignment"])).get_submissions()]
    except (CanvasException, requests.RequestException) as e:
        raise LmsError(f"--canvas {url}: Canvas's API answered {type(e).__name__}: {str(e)[:200]} (check the "
                       f"address, and that the token's user may see the course's submissions)") from None
    return read_canvas_submissions(items, f"Canvas assignment {match['assignment']}")
