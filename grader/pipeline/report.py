"""What grading found for one hand-in, as the text of its files: grading.json (everything, for
TAs), feedback.md and feedback.html (what the student reads, grader.pipeline.feedback) and
Gradescope's results.json. grader.pipeline.record writes them, atomically (a temporary file, then a
rename), and nothing else does. (The batch's grades.csv and summary.md are grader.batch.outputs's.)

Hidden checks are named, never their values: their messages were said without them where they
were made (grader.verdict.say), a rank's own words never reached them (grader.rerun.wire.hidden), and
their tracebacks are left out. A crash of the grader itself is said in a sentence; its traceback is
in grading.json's `grader_error`, for the TAs. A traceback several parts
share (code that does not load) is shown once. In Gradescope's results.json they go further: each part's
hidden checks are a test of their own, shown to students only after the due date
(`after_due_date`) and under neutral names ("hidden check 2"); what students see before then,
the top-level output included, holds only the public checks.

What a hand-in holds ends up in these files (its notes, its logs' lines, the diff of its utils.py),
so each is bounded (grader.kit's `fit`): every text and list of a result cut to fit
kit.FILE_BYTES, first loosely, then tighter, every cut marked "... (cut)".
"""

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

from grader.kit import FILE_BYTES, LEVELS, bounded, fit
from grader.parts import BY_ID
from grader.pipeline.feedback import check_line, feedback_html, feedback_markdown, public_view


def _neutral_names(result: dict) -> dict:
    """Hidden check name -> "hidden check N", numbered in the rubric's order."""
    names = []
    for part in result["parts"].values():
        names += [o["check"] for o in part["checks"] if o["hidden"] and o["check"] not in names]
    return {name: f"hidden check {i}" for i, name in enumerate(names, start=1)}


def _neutral(text: str, names: dict) -> str:
    for name, label in names.items():
        text = re.sub(rf"hidden check [`']{re.escape(name)}[`']", label, text)
    return text


def _check_points(part: dict, weights: dict) -> dict:
    """Check name -> (points earned, points possible) of the part's re-run points: as scored
    (grader.worth), or, in a result scored before checks carried them, from the weights."""
    if part["checks"] and all(o.get("points") is not None for o in part["checks"]):
        return {o["check"]: (o["points"], o["max_points"]) for o in part["checks"]}
    total = sum(weights.get(o["check"], 1.0) for o in part["checks"]) or 1.0
    share = {o["check"]: part["rerun_max"] * weights.get(o["check"], 1.0) / total for o in part["checks"]}
    earned = part["rerun_points"] > 0    # a part that skipped its collective earns no re-run point anywhere
    return {o["check"]: (share[o["check"]] if earned and o["status"] == "passed" else 0.0, share[o["check"]])
            for o in part["checks"]}


def _test(name, score, max_score, passed, output, visibility="visible") -> dict:
    return {"name": name, "score": round(score, 4), "max_score": round(max_score, 4),
            "status": "passed" if passed else "failed", "output": output, "output_format": "md",
            "visibility": visibility}


def gradescope_results(result: dict, weights: dict = None) -> dict:
    """Gradescope's results.json: per part a test for its re-run at the public checks, one for its
    log evidence, and one for its hidden checks (after the due date, neutral names). `weights`:
    check name -> weight (the rubric's; equal when not given)."""
    weights, names = weights or {}, _neutral_names(result)
    tests = []
    for part in result["parts"].values():
        title = f"{part['part']}: {BY_ID[part['part']].title}"
        points = _check_points(part, weights)
        public = [o for o in part["checks"] if not o["hidden"]]
        hidden = [o for o in part["checks"] if o["hidden"]]
        status, message = public_view(part)
        if not part["checks"]:
            status, message, points = part["status"], part["message"], {}
        lines = "\n".join(check_line(o) for o in public)
        tests.append(_test(f"{title}, re-run" + (" (public checks)" if hidden else ""),
                           sum(points[o["check"]][0] for o in public) if part["checks"] else part["rerun_points"],
                           sum(points[o["check"]][1] for o in public) if part["checks"] else part["rerun_max"],
                           status == "passed", f"**{message}**\n\n{lines}".strip()))
        log = part.get("log") or {"points": 0.0, "message": "no log evidence for this part"}
        tests.append(_test(f"{title}, log evidence", log["points"], part["log_max"],
                           log["points"] >= part["log_max"], log["message"]))
        if hidden:
            lines = "\n".join(check_line(o, names[o["check"]]) for o in hidden)
            tests.append(_test(f"{title}, hidden checks", sum(points[o["check"]][0] for o in hidden),
                               sum(points[o["check"]][1] for o in hidden),
                               all(o["status"] == "passed" for o in hidden), lines, "after_due_date"))
    score = result["score"]
    if score is None and result["status"] == "invalid":
        score = 0.0    # Gradescope needs a number; the output says why, and the student hands in again
    for test in tests:
        test["output"] = _neutral(test["output"], names)
        if score is None:
            test.pop("score")
    doc = {"output": _neutral(feedback_markdown(result, public_only=bool(names)), names), "output_format": "md",
           "test_output_format": "md", "visibility": "visible", "stdout_visibility": "hidden", "tests": tests,
           "extra_data": {"student": result["student"], "sha256": result["sha256"], "status": result["status"],
                          "flags": result["flags"], "parts": {p: v["status"] for p, v in result["parts"].items()},
                          "grader_version": result["grader_version"], "rubric_sha256": result["rubric_sha256"],
                          "isolation": result.get("isolation", {}),
                          "hidden_checks": {label: name for name, label in names.items()}}}
    if score is not None:
        doc["score"] = score
    return fit(doc)


def _when(text: str) -> datetime:
    text = text.strip()
    return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)


def limited_results(metadata: Path, max_submissions: int, window_hours: float = 0.0):
    """The results.json to write instead of grading when this submission is past the limit of
    `max_submissions` graded submissions (in the `window_hours` before it; 0: ever), else None.

    Counted from Gradescope's submission_metadata.json: the previous submissions that were graded
    (not themselves refused), by their submission_time against this one's `created_at`, never the
    clock (a re-run of the autograder must decide as the first run did). A refused submission
    keeps the result of the latest graded one, with a message on top."""
    if not max_submissions:
        return None
    try:
        data = json.loads(Path(metadata).read_text())
        created = _when(data["created_at"])
        previous = [(p, _when(p["submission_time"])) for p in data.get("previous_submissions") or []]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None    # nothing to count by: grade it
    since = created - timedelta(hours=window_hours) if window_hours else None
    graded = [(p, t) for p, t in previous if t <= created and (since is None or t > since)
              and not ((p.get("results") or {}).get("extra_data") or {}).get("rate_limited")]
    if len(graded) < max_submissions:
        return None
    last, when = max(graded, key=lambda pt: pt[1])
    window = f" in {window_hours:g} hours" if window_hours else ""
    free = min(t for _, t in graded) + timedelta(hours=window_hours)
    again = f" You can be graded again from {free:%Y-%m-%d %H:%M %Z}." if window_hours else ""
    doc = dict(last.get("results") or {})
    doc["output"] = (f"**Not graded:** you have had {len(graded)} graded submissions{window}, the most this "
                     f"assignment grades.{again} Shown: the result of your submission of "
                     f"{when:%Y-%m-%d %H:%M %Z}.\n\n" + doc.get("output", ""))
    if "score" not in doc and last.get("score") is not None and not doc.get("tests"):
        doc["score"] = float(last["score"])
    doc["extra_data"] = {**(doc.get("extra_data") or {}), "rate_limited": True}
    return fit(doc)


def fit_page(data: dict) -> str:
    """feedback.html within kit.FILE_BYTES: a page is never cut mid-tag, so its result is cut first,
    at the loosest of kit.LEVELS whose page fits (else the tightest)."""
    for chars, items in LEVELS:
        page = feedback_html(bounded(data, chars, items))
        if len(page.encode("utf-8", "replace")) <= FILE_BYTES:
            break
    return page
