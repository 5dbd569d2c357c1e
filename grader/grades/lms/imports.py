"""Every LMS's way back: which file of the LMS `gradebook --lms LMS:FILE` fills, and where the import goes.

Each LMS's record (grader.lmss) names the file it exports and the function that fills it, in the
LMS's own format (grader.grades.lms.canvas, .moodle, .blackboard, .gradescope), and the function
that reads the submission times that file carries, where it carries them (`times`); docs/tas.md
says per LMS what to export and where the import goes. The import is FINAL-<lms>-import.csv (or
.xls, .txt, as the file came), FINAL being the final gradebook's name (`-o`, default OUT/final.csv),
so an import file is named by the run that wrote it; one of that name written earlier with other
content is kept, renamed with its time (`keep_earlier`), and said.
"""

from datetime import datetime
from pathlib import Path

from grader import lmss
from grader.grades.lms.sheet import LmsError
from grader.kit import atomic_write
from grader.lmss import LMSS, load


def parse(specs) -> list:
    """[(lms, Path)] of `--lms` values, each LMS at most once."""
    found = []
    for spec in specs or ():
        lms, _, path = spec.partition(":")
        if lms not in LMSS or not path:
            raise LmsError(f"--lms {spec}: expected {lmss.specs()}")
        if any(lms == other for other, _ in found):
            raise LmsError(f"--lms {spec}: a second {lms} file; fill one at a time (each writes "
                           f"FINAL-{lms}-import)")
        found.append((lms, Path(path)))
    return found


def times(specs, zone) -> list:
    """The submission times the LMS files of `specs` carry (Moodle's worksheet, Gradescope's grades)."""
    return [s for lms, path in parse(specs) if LMSS[lms].times for s in load(LMSS[lms].times)(path, zone)]


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
    data, filled = LMSS[lms].fill(path, book, assignment=assignment, feedback=feedback)
    target = import_path(output, lms, path)
    if target.resolve() == path.resolve():
        raise LmsError(f"{path}: the import would be written over the file it is made from; give -o elsewhere")
    filled.earlier = keep_earlier(target, data)
    atomic_write(target, data)
    filled.written = str(target)
    return filled
