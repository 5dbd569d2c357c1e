"""Where a hand-in's results live in OUT, and names made inert before they are written.

Per-student output lives under OUT/students/<key>/ (grading.json, feedback.md, results.json,
download.json), so no student id, whatever a download names it, can be `grades.csv`, `summary.md`
or one of the grader's own folders. A key is a student id (`safe_id`: only `A-Za-z0-9._@+-`,
leading with a letter or digit; an LMS's id it had to change with a hash of the id, `lms_key`), or
`<id>~<sha256[:8]>` for a further hand-in.

Names come from students (file and folder names in a download): before one is written into
Markdown or CSV it goes through `inert` (Markdown: control characters removed, Markdown's
characters escaped) or `cell` (CSV: control characters removed, and a cell a spreadsheet would
take for a formula, starting with `= + - @`, a tab or a carriage return, prefixed with `'`).

A hand-in's source (grading.json's `source`, grades.csv's, every page's) names where it was found:
a file or folder name, and inside a zip `inside`'s rendering, `bulk.zip › folder/alice.zip`.
"""

import hashlib
import re
import unicodedata
from pathlib import Path

STUDENTS = "students"   # OUT/students/<key>/: one folder per hand-in
SEP = "~"               # a further hand-in of a student is graded as "<id>~<sha256[:8]>" (grader.batch.run)
INSIDE = " › "          # between a zip and a file in it, in a hand-in's source: "bulk.zip › alice.zip"
MARKDOWN = re.compile(r"([\\`*\[\]<>#!|~])")   # what can start markup anywhere in a line (not `_`: ids have it)
LINE_START = re.compile(r"^(\s*)([-+=])")   # what starts a list item or underlines a heading
FORMULA = ("=", "+", "-", "@", "\t", "\r")


def safe_id(ident: str) -> str:
    """An id as a folder name: only `A-Za-z0-9._@+-`, leading with a letter or digit (never `.`, nor
    what a shell or a spreadsheet reads as an option or a formula), never empty."""
    return re.sub(r"[^A-Za-z0-9._@+-]+", "_", ident).lstrip("._@+-").rstrip("._")[:100] or "unnamed"


def lms_key(raw: str) -> str:
    """The key (folder name, the gradebook's student) of an id an LMS download gives: `safe_id`'s,
    and where that had to change the id, a hash of the id and a closing `_` (which no id kept as it
    is ends with) after it: two ids ("2400001" and "2400001.") are never one student's, whichever
    download or run each comes in. Files back to the LMS name the student as the LMS did."""
    key = safe_id(raw)
    return key if key == raw else f"{key[:80]}_{hashlib.sha256(raw.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}_"


def students_dir(out) -> Path:
    return Path(out) / STUDENTS


def student_dir(out, key: str) -> Path:
    """The folder of the hand-in graded as `key` (a student id, or `<id>~<digest>`)."""
    return students_dir(out) / key


def student_of(key: str) -> str:
    """The student id of a result's key (its folder name, grading.json's `student`)."""
    return key.split(SEP)[0]


def result_files(out) -> list:
    """Every OUT/students/<key>/grading.json, in key order (folders set aside start with `.`)."""
    return sorted(p for p in students_dir(out).glob("*/grading.json") if not p.parent.name.startswith("."))


def gradescope_user(user: dict) -> str:
    """The student id of one of `users` in Gradescope's submission_metadata.json: its `sid` (the
    course's id), else its `email`, else its Gradescope `id`; '' if none. Grading names a submission
    by it and the gradebook matches submission times by it, so both call this."""
    return str(user.get("sid") or user.get("email") or user.get("id") or "").strip()


def inside(archive: str, member: str) -> str:
    """How a file inside a zip is named wherever a source is shown: `export.zip › export/submission_1`.
    Inside the zip its folders keep `/`; INSIDE marks the zip's edge only, and a `›` in a member's
    own name is shown as `>`, so the edge is never ambiguous (`innermost` finds it)."""
    return f"{archive}{INSIDE}{member.replace(INSIDE.strip(), '>')}"


def innermost(source: str) -> str:
    """The part of a source inside its innermost zip (the whole source when it is in none)."""
    return source.rsplit(INSIDE, 1)[-1]


def plain(text) -> str:
    """`text` with control and format characters (newlines, escapes, bidi overrides) made spaces."""
    return "".join(" " if unicodedata.category(c)[0] == "C" else c for c in str(text))


def inert(text) -> str:
    """`text` safe to write into Markdown: one line, Markdown's characters escaped."""
    return LINE_START.sub(r"\1\\\2", MARKDOWN.sub(r"\\\1", plain(text)))


def cell(text) -> str:
    """`text` safe as a CSV cell a spreadsheet opens: one line, never a formula."""
    text = plain(text)
    return "'" + text if text.startswith(FORMULA) else text


def listed(words: list) -> str:
    """Words as a sentence lists them: "a", "a and b", "a, b and c"."""
    words = list(words)
    return " and ".join(w for w in (", ".join(words[:-1]), words[-1] if words else "") if w)
