"""The staff report's first table: one row per hand-in in OUT, worst first, each with what a TA acts on.

A row holds the hand-in's score (rounded for reading: the numbers grades.csv keeps are not
touched), its status, every part that lost points with the points lost and one line saying why,
its flags, and the link to its feedback page (students/<key>/feedback.html, else feedback.md for a
result written before pages were).

Why a part lost points, in one line (`part_reason`), from its first failing check (a public one
when there is one: it says its numbers):
- a crash: the exception line and the line of assignment4.py it was raised from;
- a hang (timeout): the re-run's message, which names the ranks and the collective they waited in
  first (the words the row already says, "timed out", the part's name, left out);
- a wrong weight: the diagnosis (what the difference looks like), else the message;
- right weights at every check: the communication that was wrong, else what the log lacked.

Worst first: no score (infra_error, error, invalid) before any score, then by score, lowest first.
"""

import json
import re
from pathlib import Path

from grader.names import student_dir, student_of
from grader.parts import BY_ID

LINE = 240   # characters of one reason: a row stays one line of a wide table
OWN_FRAME = re.compile(r'File "assignment4\.py", line (\d+)')
TIMED_OUT = re.compile(r"^timed out: (\w+ did not finish: )?")   # grader.verdict.compare's and grader.rerun.check's words


def readable(points, digits: int = 2) -> str:
    """A number as a person reads it: 85.07, not 85.0667; 85, not 85.0; '-' for none."""
    return "-" if points is None else f"{round(float(points), digits):g}"


def _line(text: str) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= LINE else text[:LINE - 1] + "…"


def part_reason(part: dict) -> str:
    """Why `part` (a part of grading.json) lost points, in one line; see the module docstring."""
    outcomes = part.get("checks") or []
    failing = [o for o in outcomes if o.get("status") != "passed"]
    first = next((o for o in failing if not o.get("hidden")), failing[0] if failing else None)
    if first is None:
        comm = next((o for o in outcomes if not o.get("comm_ok", True)), None)
        if comm is not None:
            return _line(f"right weights, but {comm.get('comm_message', '')}")
        if outcomes or part.get("status") == "passed":
            log = part.get("log") or {}
            return _line(f"log: {log.get('message') or 'no log evidence'}")
        return _line(part.get("message", ""))
    where = f"{'hidden ' if first.get('hidden') else ''}check '{first['check']}'"
    status = first["status"]
    if status == "crashed":
        frames = OWN_FRAME.findall(first.get("traceback") or "")
        at = f" (assignment4.py line {frames[-1]})" if frames else ""
        return _line(f"crashed at {where}: {first.get('error') or first.get('message', '')}{at}")
    said = first.get("diagnosis") if status == "failed" and first.get("diagnosis") else first.get("message", "")
    if status == "timeout":   # the row says timeout and names the part: the line keeps the cause
        said = TIMED_OUT.sub("", said)
    return _line(f"{status} at {where}: {said}")


def _feedback(out: Path, key: str) -> str:
    """The link to a hand-in's feedback page, relative to OUT."""
    folder = student_dir(Path("."), key)
    page = "feedback.html" if (student_dir(out, key) / "feedback.html").is_file() else "feedback.md"
    return (folder / page).as_posix()


def _download(out: Path, key: str) -> dict:
    try:
        data = json.loads((student_dir(out, key) / "download.json").read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def rows(results: dict, out: Path) -> list:
    """One row per result (`results`: key -> grading.json), worst first; see the module docstring."""
    found = []
    for key, r in results.items():
        lost = []
        for pid, part in (r.get("parts") or {}).items():
            if pid not in BY_ID:
                continue
            short = (part.get("max_score") or 0) - (part.get("score") or 0)
            if r.get("score") is not None and short > 1e-9:   # no score: the row's message says why
                lost.append({"part": pid, "title": BY_ID[pid].title, "status": str(part.get("status", "")),
                             "lost": readable(short), "reason": part_reason(part)})
        download = _download(out, key)
        flags = list(r.get("flags") or []) + (["late"] if download.get("late") else [])
        found.append({"key": key, "student": student_of(key), "source": str(r.get("source", "")),
                      "status": str(r.get("status", "")), "score": r.get("score"),
                      "shown_score": readable(r.get("score")), "max_score": readable(r.get("max_score")),
                      "message": _line(r.get("message", "")), "lost": lost, "flags": flags,
                      "lms": str(download.get("lms") or ""), "feedback": _feedback(out, key)})
    return sorted(found, key=lambda row: (row["score"] is not None, row["score"] or 0.0, row["key"]))


def with_final(found: list, final_rows: list) -> None:
    """Each hand-in's row (`found`, from `rows`) gets what the final gradebook made of it: the final
    grade, the late penalty and its days, the overrides; None for a hand-in that did not count (a
    student's earlier one)."""
    by = {(r.get("student"), r.get("source", "")): r for r in final_rows}
    for row in found:
        f = by.get((row["student"], row["source"]))
        row["final"] = None if f is None else {
            "grade": readable(f.get("final")) if f.get("final") is not None else "-",
            "penalty": readable(f["penalty"]) if f.get("penalty") else "", "late_days": f.get("late_days"),
            "overrides": f.get("overrides") or ""}
