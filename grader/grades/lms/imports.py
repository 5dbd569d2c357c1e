"""Every LMS's way back: which file of the LMS `gradebook --lms LMS:FILE` fills, and where the import goes.

- canvas:FILE, Grades > Export > Export Entire Gradebook: FINAL-canvas-import.csv, for Grades > Import;
- moodle:FILE, View all submissions > Download grading worksheet: FINAL-moodle-import.csv, for View all
  submissions > Upload grading worksheet;
- blackboard:FILE, Grade Center > Work Offline > Download (.csv, or the tab-delimited .xls):
  FINAL-blackboard-import.csv (or .xls), for Grade Center > Work Offline > Upload;
- gradescope:FILE, Review Grades > Download Grades > CSV: FINAL-gradescope-import.csv, for wherever
  the course keeps its grades (Gradescope itself imports none).

FINAL is the final gradebook's name (`-o`, default OUT/final.csv), so an import file is named by
the run that wrote it; one of that name written earlier with other content is kept, renamed with
its time (`keep_earlier`), and said. Each LMS's format: grader.grades.lms.canvas, .moodle,
.blackboard, .gradescope. Moodle's worksheet and Gradescope's grade export also carry submission
times (`times`).
"""

from datetime import datetime
from pathlib import Path

from grader.grades.lms.blackboard import fill_blackboard
from grader.grades.lms.canvas import fill_canvas
from grader.grades.lms.gradescope import fill_gradescope, read_gradescope_times
from grader.grades.lms.moodle import fill_moodle, read_moodle_times
from grader.grades.lms.sheet import LmsError
from grader.kit import atomic_write

FILLERS = {"canvas": fill_canvas, "moodle": fill_moodle, "blackboard": fill_blackboard, "gradescope": fill_gradescope}
TIMES = {"moodle": read_moodle_times, "gradescope": read_gradescope_times}
SPECS = "canvas:EXPORT.csv, moodle:WORKSHEET.csv, blackboard:GRADE_CENTER.csv (or .xls) or gradescope:GRADES.csv"


def parse(specs) -> list:
    """[(lms, Path)] of `--lms` values, each LMS at most once."""
    found = []
    for spec in specs or ():
        lms, _, path = spec.partition(":")
        if lms not in FILLERS or not path:
            raise LmsError(f"--lms {spec}: expected {SPECS}")
        if any(lms == other for other, _ in found):
            raise LmsError(f"--lms {spec}: a second {lms} file; fill one at a time (each writes "
                           f"FINAL-{lms}-import)")
        found.append((lms, Path(path)))
    return found


def times(specs, zone) -> list:
    """The submission times the LMS files of `specs` carry (Moodle's worksheet, Gradescope's grades)."""
    return [s for lms, path in parse(specs) if lms in TIMES for s in TIMES[lms](path, zone)]


def import_path(output: Path, lms: str, source: Path) -> Path:
    """Where the import of `lms` goes: beside the final gradebook `output`, named by it."""
    suffix = source.suffix.lower() if source.suffix.lower() in (".csv", ".xls", ".txt") else ".csv"
    return Path(output).parent / f"{Path(output).stem}-{lms}-import{suffix}"


def keep_earlier(target: Path, data: bytes) -> str:
    """Move an earlier file at `target` with other content than `data` aside (its name with its
    modification time); return where it went ("" when there was none to keep)."""
    try:
        if target.read_bytes() == data:
            return ""
        stamp = datetime.fromtimestamp(target.stat().st_mtime).strftime("%Y%m%d-%H%M%S")
    except OSError:
        return ""
    kept = target.with_name(f"{target.stem}.{stamp}{target.suffix}")
    n = 1
    while kept.exists():
        kept, n = target.with_name(f"{target.stem}.{stamp}-{n}{target.suffix}"), n + 1
    target.rename(kept)
    return str(kept)


def fill(lms: str, path: Path, book, output: Path, assignment: str = None, feedback: dict = None):
    """Fill the LMS file `path` of `lms` with `book`'s final grades (with `feedback`, student ->
    lines, the LMS's feedback cells too) and write its import beside `output`; the Filled."""
    data, filled = FILLERS[lms](path, book, assignment=assignment, feedback=feedback)
    target = import_path(output, lms, path)
    if target.resolve() == path.resolve():
        raise LmsError(f"{path}: the import would be written over the file it is made from; give -o elsewhere")
    filled.earlier = keep_earlier(target, data)
    atomic_write(target, data)
    filled.written = str(target)
    return filled
