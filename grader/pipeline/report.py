"""Write what grading found: per hand-in results.json (Gradescope) and feedback.md, and the batch's
grades.csv and summary.md. Every file is written atomically (a temporary file, then a rename).

Hidden checks are named, never their values: their messages have every number replaced by `#`
and their tracebacks are left out. The full result, for TAs, is `grading.json`.
"""

import csv
import io
import re
from collections import Counter
from pathlib import Path

from grader.kit import atomic_write, write_json
from grader.parts import BY_ID, PART_IDS, PARTS

CSV_COLUMNS = ["student", "score", "max_score", "status", *PART_IDS, "flags"]


def redact(text: str) -> str:
    return re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", text or "")


def _check_line(o) -> str:
    name = f"hidden check `{o['check']}`" if o["hidden"] else f"check `{o['check']}` (world size {o['world_size']})"
    message = redact(o["message"]) if o["hidden"] else o["message"]
    flaky = " *(passed when run again: flagged for a person to look at)*" if o.get("flaky") else ""
    return f"- {name}: **{o['status']}**, {message}{flaky}"


def _fmt(points) -> str:
    return f"{points:g}" if points is not None else "-"


def _part_markdown(part: dict) -> str:
    info = BY_ID[part["part"]]
    lines = [f"## {info.title}: {part['status']} ({_fmt(part['score'])} / {_fmt(part['max_score'])})", "",
             f"**{part['message'] if part['status'] != 'passed' else 'Passed every re-run check.'}**", ""]
    lines += [_check_line(o) for o in part["checks"]]
    shown = next((o for o in part["checks"] if not o["hidden"] and o.get("traceback")), None)
    if shown:
        head = "\n".join(shown["traceback"].strip().splitlines()[-12:])
        lines += ["", f"Traceback (check `{shown['check']}`, last lines):", "```", head, "```"]
    if part.get("log"):
        log = part["log"]
        lines += ["", f"**Log:** {log['message']} ({_fmt(log['points'])} / {_fmt(part['log_max'])} points)"]
        if log.get("excerpt"):
            lines += ["```", *log["excerpt"][:8], "```"]
    elif part.get("log_max"):
        lines += ["", f"**Log:** no log evidence (0 / {_fmt(part['log_max'])} points)"]
    return "\n".join(lines)


def feedback_markdown(result: dict) -> str:
    """The student's feedback: the verdict and message first, then the evidence."""
    if result["score"] is None:
        head = f"**No score yet** ({result['status']}): {result['message']}"
    else:
        head = f"**Score: {_fmt(result['score'])} / {_fmt(result['max_score'])}**. {result['message']}"
    lines = [f"# Assignment 4: feedback for {result['student']}", "", head, "",
             "| part | re-run | points |", "| --- | --- | --- |"]
    for part in result["parts"].values():
        lines.append(f"| {BY_ID[part['part']].title} | {part['status']} | {_fmt(part['score'])} / {_fmt(part['max_score'])} |")
    if result["penalties"]:
        lines.append(f"| penalties | | -{_fmt(sum(result['penalties'].values()))} |")
    lines.append("")
    hidden = any(o["hidden"] for p in result["parts"].values() for o in p["checks"])
    public_ok = all(o["status"] == "passed" for p in result["parts"].values() for o in p["checks"] if not o["hidden"])
    if result["parts"] and public_ok and any(p["checks"] for p in result["parts"].values()):
        lines += ["All public checks passed." + (" Hidden checks run your code at other sizes, seeds and "
                                                 "world sizes; they are listed by name below." if hidden else ""), ""]
    for part in result["parts"].values():
        lines += [_part_markdown(part), ""]
    if result["notes"]:
        lines += ["## Notes on the hand-in", ""] + [f"- {n}" for n in result["notes"]] + [""]
    lines += ["---", f"Hand-in `{result['source']}`, sha256 `{result['sha256'][:16]}...`, graded "
              f"{result['graded_at']} by grader {result['grader_version']}."]
    return "\n".join(lines) + "\n"


def gradescope_results(result: dict) -> dict:
    """Gradescope's results.json: a test per part's re-run and per part's log evidence."""
    tests = []
    for part in result["parts"].values():
        title = f"{part['part']}: {BY_ID[part['part']].title}"
        checks = "\n".join(_check_line(o) for o in part["checks"])
        tests.append({"name": f"{title}, re-run", "score": part["rerun_points"], "max_score": part["rerun_max"],
                      "status": "passed" if part["status"] == "passed" else "failed",
                      "output": f"**{part['message']}**\n\n{checks}".strip(), "output_format": "md",
                      "visibility": "visible"})
        log = part.get("log") or {"points": 0.0, "message": "no log evidence for this part"}
        tests.append({"name": f"{title}, log evidence", "score": log["points"], "max_score": part["log_max"],
                      "status": "passed" if log["points"] >= part["log_max"] else "failed",
                      "output": log["message"], "output_format": "md", "visibility": "visible"})
    if result["score"] is None:
        for test in tests:
            test.pop("score")
    doc = {"output": feedback_markdown(result), "output_format": "md", "test_output_format": "md",
           "visibility": "visible", "stdout_visibility": "hidden", "tests": tests,
           "extra_data": {"student": result["student"], "sha256": result["sha256"], "status": result["status"],
                          "flags": result["flags"], "parts": {p: v["status"] for p, v in result["parts"].items()},
                          "grader_version": result["grader_version"], "rubric_sha256": result["rubric_sha256"]}}
    if result["score"] is not None:
        doc["score"] = result["score"]
    return doc


def write_handin(result, out: Path) -> Path:
    """Write grading.json, results.json and feedback.md of one hand-in into out/<student>/."""
    data = result.to_dict()
    folder = out / result.student
    write_json(folder / "grading.json", data, sort_keys=True)
    write_json(folder / "results.json", gradescope_results(data))
    atomic_write(folder / "feedback.md", feedback_markdown(data))
    return folder


def gradebook_view(result: dict) -> dict:
    """What grades.csv and summary.md need of a result: the batch keeps only this in memory."""
    keep_check = ("check", "hidden", "status", "message", "diagnosis", "flaky")
    parts = {p: {**{k: v for k, v in part.items() if k not in ("checks", "log")},
                 "checks": [{k: o.get(k) for k in keep_check} for o in part.get("checks", [])]}
             for p, part in result.get("parts", {}).items()}
    return {k: result.get(k) for k in ("student", "source", "status", "score", "max_score", "message", "flags")} | \
        {"parts": parts}


def grades_csv(results: list) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in sorted(results, key=lambda r: r["student"]):
        row = {"student": r["student"], "score": "" if r["score"] is None else _fmt(r["score"]),
               "max_score": _fmt(r["max_score"]), "status": r["status"], "flags": ";".join(r["flags"])}
        for part in PART_IDS:
            p = r["parts"].get(part)
            row[part] = "" if p is None or r["score"] is None else _fmt(p["score"])
        writer.writerow(row)
    return buffer.getvalue()


def summary_markdown(results: list, max_score: float) -> str:
    n = len(results)
    lines = [f"# Assignment 4: summary of {n} hand-in{'s' if n != 1 else ''}", ""]
    statuses = Counter(r["status"] for r in results)
    lines += ["| status | hand-ins |", "| --- | --- |"] + [f"| {s} | {c} |" for s, c in statuses.most_common()] + [""]
    scored = [r for r in results if r["score"] is not None]
    lines += ["## Parts", "", "| part | passed | pass rate | most common failures |", "| --- | --- | --- | --- |"]
    for part in PARTS:
        outcomes = [r["parts"][part.id] for r in scored if part.id in r["parts"]]
        passed = sum(p["status"] == "passed" for p in outcomes)
        rate = f"{100 * passed / len(outcomes):.0f}%" if outcomes else "-"
        reasons = Counter(_reason(p) for p in outcomes if p["status"] != "passed")
        common = "; ".join(f"{reason} ({count})" for reason, count in reasons.most_common(3))
        lines.append(f"| {part.title} | {passed} / {len(outcomes)} | {rate} | {common} |")
    lines += ["", "## Scores", ""]
    if scored:
        scores = sorted(r["score"] for r in scored)
        mean = sum(scores) / len(scores)
        lines.append(f"mean {mean:.1f}, median {scores[len(scores) // 2]:g}, min {scores[0]:g}, "
                     f"max {scores[-1]:g} (of {max_score:g})")
        lines += ["", "| score | hand-ins |", "| --- | --- |"]
        step = max_score / 10 or 1
        buckets = Counter(min(int(s // step), 9) for s in scores)
        for b in range(10):
            lo, hi = b * step, (b + 1) * step
            lines.append(f"| {lo:g}-{hi:g}{'' if b == 9 else ' (excl.)'} | {'#' * buckets.get(b, 0)} {buckets.get(b, 0)} |")
    flags = Counter(f for r in results for f in r["flags"])
    if flags:
        lines += ["", "## Flags", "", "| flag | hand-ins |", "| --- | --- |"] + [f"| {f} | {c} |" for f, c in flags.most_common()]
    need_look = [r for r in results if r["status"] in ("error", "infra_error", "invalid") or "flaky" in r["flags"]]
    if need_look:
        lines += ["", "## For a person to look at", ""] + [f"- {r['student']} ({r['source']}): {r['status']}, {r['message']}"
                                                          for r in need_look]
    return "\n".join(lines) + "\n"


def _reason(part: dict) -> str:
    first = next((o for o in part["checks"] if o["status"] != "passed"), None)
    if first is None:
        return part["message"]
    if first.get("diagnosis"):
        return redact(first["diagnosis"])
    return str(first["status"]) if first["status"] != "failed" else redact(first["message"])[:60]


def write_gradebook(results: list, out: Path, max_score: float) -> None:
    atomic_write(out / "grades.csv", grades_csv(results))
    atomic_write(out / "summary.md", summary_markdown(results, max_score))
