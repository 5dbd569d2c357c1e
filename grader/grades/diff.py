"""What a regrade changed: every hand-in whose score or part status moved between two OUT folders.

    python -m grader diff OLD_OUT NEW_OUT

After a fixed rubric or a new grader, each hand-in (by its folder) whose score, status or any
part's status differs is listed with old and new and the reason each result gives. Exit status 1
when any score went down (a hand-in that lost its score, or is missing from NEW_OUT, counts): no
TA lowers grades without seeing it.
"""

from dataclasses import dataclass, field

from grader.grades.book import fmt, load_results
from grader.results import ToDict


@dataclass
class Moved(ToDict):
    handin: str                  # the result's folder key (student id, or id~sha for a further hand-in)
    source: str
    old_score: float = None
    new_score: float = None
    old_status: str = ""
    new_status: str = ""
    old_message: str = ""
    new_message: str = ""
    parts: dict = field(default_factory=dict)   # part -> {"old", "new", "old_reason", "new_reason"}
    lowered: bool = False


def _parts(result: dict) -> dict:
    return (result or {}).get("parts") or {}


def compare(old: list, new: list) -> list:
    """The Moved hand-ins between result lists `old` and `new` (grading.json dicts)."""
    before = {r["student"]: r for r in old}
    after = {r["student"]: r for r in new}
    moved = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        m = Moved(handin=key, source=(b or a)["source"],
                  old_score=a["score"] if a else None, new_score=b["score"] if b else None,
                  old_status=a["status"] if a else "absent", new_status=b["status"] if b else "absent",
                  old_message=a["message"] if a else "not in the old results",
                  new_message=b["message"] if b else "not in the new results")
        for part in sorted(set(_parts(a)) | set(_parts(b))):
            pa, pb = _parts(a).get(part), _parts(b).get(part)
            was, now = (pa or {}).get("status", "absent"), (pb or {}).get("status", "absent")
            if was != now or (pa or {}).get("score") != (pb or {}).get("score"):
                m.parts[part] = {"old": f"{was} {fmt((pa or {}).get('score'))}".strip(),
                                 "new": f"{now} {fmt((pb or {}).get('score'))}".strip(),
                                 "old_reason": (pa or {}).get("message", ""),
                                 "new_reason": (pb or {}).get("message", "")}
        m.lowered = m.old_score is not None and (m.new_score is None or m.new_score < m.old_score)
        if m.parts or m.old_score != m.new_score or m.old_status != m.new_status:
            moved.append(m)
    return moved


def diff_text(moved: list) -> str:
    if not moved:
        return "no score or part status moved\n"
    lines = []
    for m in moved:
        mark = "  LOWERED" if m.lowered else ""
        lines.append(f"{m.handin} ({m.source}): {fmt(m.old_score) or 'no score'} ({m.old_status}) -> "
                     f"{fmt(m.new_score) or 'no score'} ({m.new_status}){mark}")
        if m.old_status != m.new_status or not m.parts:
            lines += [f"  old: {m.old_message or '-'}", f"  new: {m.new_message or '-'}"]
        for part, p in m.parts.items():
            lines.append(f"  {part}: {p['old']} -> {p['new']}")
            lines.append(f"    old: {p['old_reason'] or '-'}")
            lines.append(f"    new: {p['new_reason'] or '-'}")
    down = sum(m.lowered for m in moved)
    lines.append(f"{len(moved)} hand-in(s) moved, {down} lowered")
    return "\n".join(lines) + "\n"


def diff_outs(old_out, new_out) -> list:
    return compare(load_results(old_out), load_results(new_out))
