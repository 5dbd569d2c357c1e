"""An LMS's exported sheet, read and written back in the LMS's own encoding and delimiter.

LMSs export CSV as UTF-8 with or without a byte-order mark (Canvas and Blackboard's comma files
carry one), and Blackboard's Grade Center also as tab-delimited "XLS" text in UTF-16. A sheet
remembers how it came (encoding, mark, delimiter) and is written back the same way, so the LMS
that made it reads its import as it reads its own export. Every cell that came from a name goes
through grader.names.cell (never a formula).

Each kind of id is matched only against ids of its own kind (`ids_of`): one student's SIS id may
be the same digits as another's Canvas id.
"""

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

from grader.names import lms_key
from grader.results import ToDict

BOMS = ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))


class LmsError(ValueError):
    """The LMS file cannot be filled in; the message names the file and says what is wrong with it."""


@dataclass
class Filled(ToDict):
    """What filling one LMS file did."""
    lms: str
    written: str
    column: str
    filled: int = 0
    kept: list = field(default_factory=list)           # "student: why their cell was left as it was"
    not_in_export: list = field(default_factory=list)  # students of the gradebook the LMS file lacks
    points: dict = field(default_factory=dict)         # student -> the LMS's points possible (None: none given)
    earlier: str = ""                                  # where an earlier import file of the same name was kept
    notes: list = field(default_factory=list)          # sentences for the TA


@dataclass
class Sheet:
    path: Path
    rows: list                   # lists of cells; rows[0] is the header
    encoding: str = "utf-8"
    delimiter: str = ","

    @property
    def header(self) -> list:
        return [h.strip() for h in self.rows[0]]

    def index(self, name: str):
        """The column named `name` (spaces around it ignored), or None."""
        header = self.header
        return header.index(name) if name in header else None

    def body(self):
        """The rows after the header, each padded to the header's width."""
        width = len(self.rows[0])
        return [row + [""] * (width - len(row)) for row in self.rows[1:]]

    def render(self, rows: list, quote_all: bool = False) -> bytes:
        """`rows` in this sheet's encoding and delimiter (CRLF lines, as the LMSs write them)."""
        buffer = io.StringIO()
        csv.writer(buffer, delimiter=self.delimiter, lineterminator="\r\n",
                   quoting=csv.QUOTE_ALL if quote_all else csv.QUOTE_MINIMAL).writerows(rows)
        return buffer.getvalue().encode(self.encoding)


def read_sheet(path: Path, what: str) -> Sheet:
    """The sheet at `path` (`what` the LMS calls it, for messages)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise LmsError(f"{path}: cannot read it ({e.strerror})") from e
    encoding = next((name for bom, name in BOMS if raw.startswith(bom)), "utf-8")
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError:
        raise LmsError(f"{path}: not UTF-8 or UTF-16 text; export the {what} again as CSV") from None
    text = text.lstrip("\ufeff")
    first = text.split("\n", 1)[0]
    delimiter = "\t" if first.count("\t") > first.count(",") else ","
    rows = [row for row in csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)]
    if not rows or not any(cell.strip() for cell in rows[0]):
        raise LmsError(f"{path}: empty; export the {what} again")
    return Sheet(Path(path), rows, encoding, delimiter)


def number(text: str):
    try:
        return float(text.replace(",", "").strip())
    except ValueError:
        return None


def ids_of(filled: Filled, rows: list, kinds: dict, grades: dict) -> list:
    """The gradebook student each of `rows` is ("" for none). `kinds` maps each kind of id the LMS
    file has (the download's own first) to how a row gives it. A gradebook id is of the kind of id
    the file holds it as, and is matched only there: an SIS id that is the same text as another
    student's Canvas id is not that student. An id the file holds as two kinds, in two rows, is
    taken as the kind most of the gradebook's other ids are (a tie: the earlier kind), and said."""
    order, where = list(kinds), {}   # gradebook id -> [(kind, row)] where the file holds it
    for kind, give in kinds.items():
        for i, row in enumerate(rows):
            if student := keyed(give(row), grades):
                where.setdefault(student, []).append((kind, i))
    plain = [spots[0][0] for spots in where.values() if len({i for _, i in spots}) == 1]
    keys = [""] * len(rows)
    for student, spots in sorted(where.items(), key=lambda item: order.index(item[1][0][0])):
        kind, i = min(spots, key=lambda spot: (-plain.count(spot[0]), order.index(spot[0]), spot[1]))
        others = sorted({k for k, j in spots if j != i})
        if others:
            filled.notes.append(f"{student}: the {kind} of one row and the {' and '.join(others)} of another; "
                                f"matched as {kind}, the kind of id the gradebook's other students are")
        if keys[i]:
            filled.notes.append(f"{student}: its row is already {keys[i]}'s; not filled")
        else:
            keys[i] = student
    return keys


def keyed(cell: str, grades: dict) -> str:
    """The gradebook's student an id cell of the LMS's file names ("" for none): the id as it is, or
    as intake keyed an id that safe_id had to change (grader.names.lms_key: `o'neil@...`)."""
    raw = cell.strip()
    return raw if raw in grades else lms_key(raw) if raw and lms_key(raw) in grades else ""


def match_row(filled: Filled, keys: list, grades: dict, seen: set, who: str):
    """The gradebook row of the LMS row with ids `keys` (in the order they are tried), or None (then
    it is reported: not in the gradebook, or no final grade yet)."""
    keys = [keys] if isinstance(keys, str) else keys
    match = next((grades[k] for k in keys if k in grades), None)
    if match is None:
        filled.kept.append(f"{who}: no graded hand-in and not on the roster, so no grade of theirs")
        return None
    seen.add(match.student)
    if match.final is None:
        filled.kept.append(f"{who} ({match.student}): no final grade yet ({';'.join(match.flags)})")
        return None
    return match
