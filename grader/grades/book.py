"""The final gradebook: a pure function of the graded results, the policy and its files.

Nothing of it is stored: every call reads OUT's grading.json files and the policy and computes
every final grade again, so a regrade, a moved deadline or a new override can never leave a stale
penalty or wipe a TA's grade. Per student:

1. **which hand-in**: their own, or their group's (Gradescope's `users`). Of several, the one the
   policy's `handins` names; else the latest by submission time, when every one has a time of its
   own (a `source` column, or the time the LMS download gave it); else none: flagged `duplicate`, no final grade, for a person to decide.
2. **overrides** replace a part's points, then the total is summed again (less the rubric's
   penalties). An override made for other bytes than the hand-in graded now is `override_stale` and
   applied only with `keep_stale`.
3. **late**: days late are counted per started day after the deadline (the student's extension, if
   any); the penalty is `late_penalty_per_day` percent of the earned score per day beyond the
   student's late-day budget; past `max_late_days` the grade is 0. The submission time is the
   policy's `submissions` file's, else the one the LMS download gave (OUT/students/<key>/download.json:
   Gradescope's created_at, Blackboard's attempt; Moodle's worksheet is read by `gradebook --lms`).
   A hand-in with no submission time is flagged `no_time` and never penalised: the gradebook
   command lists those first, for a person.
4. A roster student with no hand-in gets 0 and `missing`; a hand-in of a student not on the roster
   is listed and flagged `not_on_roster`.
"""

import csv
import io
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from grader.grades.policy import PolicyError
from grader.grades.sources import lms_marks, same_source
from grader.names import cell, result_files, student_of
from grader.parts import BY_ID
from grader.results import ToDict

COLUMNS = ["student", "autograde", "overrides", "submitted_at", "late_days", "penalty", "final", "flags"]


class GradebookError(ValueError):
    """OUT holds no graded results to make a gradebook of."""


def load_results(out) -> list:
    """Every graded result in `out` (its <folder>/grading.json), in folder order."""
    out = Path(out)
    if not out.is_dir():
        raise GradebookError(f"{out}: no such folder; give the --out folder of python -m grader grade")
    results = []
    for path in result_files(out):
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise GradebookError(f"{path}: cannot be read ({e}); grade that hand-in again") from e
        try:   # what the LMS download said of it (grader.batch.run): its submission time, LATE, upload name
            result["download"] = json.loads((path.parent / "download.json").read_text())
        except (OSError, ValueError):
            result["download"] = {}
        results.append(result)
    if not results:
        raise GradebookError(f"{out}: no graded hand-ins in it (no students/<student>/grading.json)")
    return results


@dataclass
class Row(ToDict):
    student: str
    autograde: float = None       # the chosen hand-in's score (None: no score, see flags)
    overrides: str = ""           # "part=points (+delta)" per override applied
    submitted_at: str = ""
    late_days: int = None
    penalty: float = None
    final: float = None           # None: no grade can be given yet (see flags)
    flags: list = field(default_factory=list)
    roster: dict = field(default_factory=dict)
    source: str = ""              # the hand-in that counted
    sha256: str = ""
    notes: list = field(default_factory=list)   # sentences for a person
    changes: list = field(default_factory=list)  # [why, points]: each step from the autograde to the final
                                                 # grade, in words a student reads (grader.grades.statement)


@dataclass
class Book(ToDict):
    rows: list
    roster_columns: list
    max_score: float


def _times(student: str, submissions: list) -> list:
    return [s for s in submissions if student in s.students]


def download_time(result: dict, zone):
    """The submission time the LMS download gave `result` (grading's download.json), or None; a time
    without a zone (Blackboard's names) is taken in `zone`, the deadline's."""
    text = (result.get("download") or {}).get("submitted_at") or ""
    try:
        when = datetime.fromisoformat(text.strip()) if text.strip() else None
    except ValueError:
        return None
    return when.replace(tzinfo=zone) if when is not None and when.tzinfo is None else when


def _time_of(result: dict, records: list, zone=None):
    """(time, exact): the submission time of `result` from `records` (the student's), the latest;
    else the time its LMS download gave it."""
    exact = [s.submitted_at for s in records if same_source(s.source, result["source"])]
    if exact:
        return max(exact), True
    loose = [s.submitted_at for s in records if not s.source]
    if loose:
        return max(loose), False
    when = download_time(result, zone)
    return (when, True) if when is not None else (None, False)


def _choose(student: str, candidates: list, records: list, policy) -> tuple:
    """(the result that counts or None, notes) for a student with `candidates` hand-ins."""
    if len(candidates) == 1:
        return candidates[0], []
    names = ", ".join(r["source"] for r in candidates)
    if student in policy.handins:
        wanted = [r for r in candidates if same_source(policy.handins[student], r["source"])]
        if len(wanted) != 1:
            raise PolicyError(f"{policy.path}.handins.{student}: {policy.handins[student]!r} is not one of "
                              f"their graded hand-ins ({names})")
        return wanted[0], [f"{len(candidates)} hand-ins ({names}); counted {wanted[0]['source']} (policy handins)"]
    if len({r["sha256"] for r in candidates}) == 1:
        return candidates[0], []
    timed = [(_time_of(r, records, policy.deadline.tzinfo), r) for r in candidates]
    if all(exact for (_, exact), _ in timed):
        (when, _), latest = max(timed, key=lambda t: t[0][0])
        return latest, [f"{len(candidates)} hand-ins ({names}); counted the latest, {latest['source']} "
                        f"({when.astimezone(policy.deadline.tzinfo).isoformat()})"]
    return None, [f"{len(candidates)} hand-ins ({names}) and no submission time of each: say which counts "
                  f"in the policy's handins"]


def _apply_overrides(result: dict, overrides: list, keep_stale: bool, policy, row: Row):
    """The earned score after the overrides that apply (None when there is none to give)."""
    parts = {p: v["score"] for p, v in result.get("parts", {}).items()}
    applied = []
    for o in overrides:
        part = result.get("parts", {}).get(o.part)
        if part is None or o.points > part["max_score"]:
            most = "no such part in the result" if part is None else f"the part's most is {part['max_score']:g}"
            raise PolicyError(f"{policy.path}: the override of {o.part} for {o.student} gives {o.points:g} "
                              f"points; {most}")
        if o.sha256 != result["sha256"]:
            row.flags.append("override_stale")
            row.notes.append(f"the override of {o.part} ({o.reason}) was made for another hand-in (sha256 "
                             f"{o.sha256[:12]}..., graded now {result['sha256'][:12]}...)"
                             + ("; applied (--keep-stale-overrides)" if keep_stale else "; not applied"))
            if not keep_stale:
                continue
        applied.append(f"{o.part}={o.points:g} ({o.points - part['score']:+g})")
        row.changes.append([f"{BY_ID[o.part].title}: {o.points:g} points instead of {part['score']:g} "
                            f"({o.reason})", o.points - part["score"]])
        parts[o.part] = o.points
    row.overrides = "; ".join(applied)
    if not applied:
        return result["score"]
    return round(max(0.0, sum(parts.values()) - sum((result.get("penalties") or {}).values())), 4)


def _late(row: Row, earned, when, deadline, budget: int, policy) -> None:
    """Fill the row's late days, penalty and final grade from the earned score."""
    row.late_days = max(0, math.ceil((when - deadline).total_seconds() / 86400)) if when else None
    if earned is None:
        return
    row.penalty = 0.0
    late = (f"handed in {when:%Y-%m-%d %H:%M %z}, {row.late_days} started day(s) after the deadline "
            f"{deadline:%Y-%m-%d %H:%M %z}" + (" (your extension)" if "extension" in row.flags else "")
            if row.late_days else "")
    if row.late_days and policy.max_late_days is not None and row.late_days > policy.max_late_days:
        row.flags.append("too_late")
        row.penalty = earned
        row.changes.append([f"{late}: more than the {policy.max_late_days} day(s) a hand-in may be late, "
                            f"so the grade is 0", -earned])
    elif row.late_days:
        charged = max(0, row.late_days - budget)
        if charged < row.late_days:
            row.flags.append(f"late_budget:{row.late_days - charged}")
        row.penalty = round(min(earned, earned * policy.late_penalty_per_day / 100 * charged), 4)
        used = f"; {row.late_days - charged} of them from your late days" if charged < row.late_days else ""
        row.changes.append([f"{late}{used}: {policy.late_penalty_per_day:g} % of the earned score for each of "
                            f"{charged} day(s)", -row.penalty])
    row.final = round(earned - row.penalty, 4)


def _budget(student: str, roster: dict, policy, where) -> int:
    left = roster.get(student, {}).get("late_days_left", "")
    if not left:
        return policy.late_days_budget
    if not left.isdigit():
        raise PolicyError(f"{where}: late_days_left of {student} is {left!r}, not a whole number")
    return int(left)


def _grade_one(student, candidates, records, policy, roster, keep_stale) -> Row:
    row = Row(student=student, roster=dict(roster.get(student, {})))
    if not candidates:
        row.final, row.flags = 0.0, ["missing"]
        row.notes.append("on the roster, no hand-in graded")
        if records:
            row.flags.append("not_graded")
            row.notes.append(f"but {records[0].origin} has a submission of theirs: was it graded?")
        return row
    result, notes = _choose(student, candidates, records, policy)
    row.notes += notes
    if result is None:
        row.flags.append("duplicate")
        return row
    if len(candidates) > 1:
        row.flags.append(f"latest_of_{len(candidates)}")
    if student_of(result["student"]) != student:
        row.flags.append("group")
        row.notes.append(f"graded with the group's hand-in of {student_of(result['student'])}")
    row.source, row.sha256, row.autograde = result["source"], result["sha256"], result["score"]
    if result["status"] != "graded":
        row.flags.append(result["status"])
        row.notes.append(f"{result['status']}: {result['message']}")
    mine = [o for o in policy.overrides if o.student == student]
    earned = _apply_overrides(result, mine, keep_stale, policy, row)
    when, _ = _time_of(result, records, policy.deadline.tzinfo)
    deadline = policy.extensions.get(student, policy.deadline)
    # Shown in the deadline's zone: Canvas gives UTC, and "23:31 +0000" beside "23:59 +0200" reads as on time.
    when = when.astimezone(deadline.tzinfo) if when is not None else None
    if student in policy.extensions:
        row.flags.append("extension")
    if when is None:
        row.flags.append("no_time")
        if lms_marks(result["source"]).get("late") or (result.get("download") or {}).get("late"):
            row.flags.append("lms_late")
            row.notes.append("no submission time, but the LMS marked the file LATE: not penalised; check it")
            row.changes.append(["the LMS marked the hand-in late, but its time was not given: no late "
                                "penalty yet", 0.0])
    else:
        row.submitted_at = when.isoformat()
        if when > deadline:
            row.flags.append("late")
    _late(row, earned, when, deadline, _budget(student, roster, policy, policy.roster), policy)
    if earned is not None and row.final is not None and row.final == 0 and "too_late" not in row.flags:
        row.notes.append("final grade 0")
    return row


def final_gradebook(results: list, policy, submissions: list = (), roster=None, keep_stale: bool = False) -> Book:
    """The final gradebook of `results` (grading.json dicts) under `policy`; `roster` is
    (columns, {student: row}) from grader.grades.sources.read_roster, or None."""
    by_student = {}
    for r in results:
        by_student.setdefault(student_of(r["student"]), []).append(r)
    columns, on_roster = roster if roster is not None else ([], {})
    groups = {}   # student -> the graded hand-ins of their groups
    for s in submissions:
        graded = [r for m in s.students for r in by_student.get(m, [])]
        for m in s.students:
            if m not in by_student and graded:
                groups.setdefault(m, []).extend(r for r in graded if r not in groups.get(m, []))
    for r in results:   # a group hand-in of an LMS download (Gradescope's other submitters)
        for m in (r.get("download") or {}).get("also") or []:
            if m not in by_student:
                groups.setdefault(m, []).extend([r] if r not in groups.get(m, []) else [])
    students = list(on_roster) + sorted((set(by_student) | set(groups)) - set(on_roster))
    known = set(students)
    for what, keys in (("extensions", policy.extensions), ("handins", policy.handins),
                       ("overrides", [o.student for o in policy.overrides])):
        stray = sorted(set(keys) - known)
        if stray:
            raise PolicyError(f"{policy.path}.{what}: {stray[0]} is not on the roster and has no graded hand-in")
    rows = []
    for student in students:
        row = _grade_one(student, by_student.get(student) or groups.get(student, []),
                         _times(student, submissions), policy, on_roster, keep_stale)
        if roster is not None and student not in on_roster:
            row.flags.append("not_on_roster")
            row.notes.append("a graded hand-in of a student not on the roster")
        rows.append(row)
    return Book(rows=rows, roster_columns=columns, max_score=max((r["max_score"] for r in results), default=0.0))


def fmt(value) -> str:
    if value is None:
        return ""
    return f"{value:.4f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


def book_csv(book: Book) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS + book.roster_columns)
    for r in book.rows:
        writer.writerow([cell(r.student), fmt(r.autograde), r.overrides, r.submitted_at, fmt(r.late_days),
                         fmt(r.penalty), fmt(r.final), ";".join(r.flags)]
                        + [cell(r.roster.get(c, "")) for c in book.roster_columns])
    return buffer.getvalue()
