"""The batch's outputs: grades.csv, summary.md and the staff report (report.html with its
analytics.json, grader.analytics) over every result in the output folder. (The final gradebook,
after the course policy, is `python -m grader gradebook`'s: grader.grades.)

Whatever one invocation graded (`--only`, a late folder graded into the same `--out`), these
are made from every `students/<folder>/grading.json` in OUT: a row per hand-in, its `source`
(file name) telling apart several hand-ins of one student, who are flagged `duplicate` (the final
gradebook, `python -m grader gradebook`, decides which counts), unless they are an LMS's attempts,
each with its time (Blackboard's): then the earlier ones are flagged `earlier_attempt`. A hand-in with no score (invalid,
error, infra_error) has an empty score and says why in its status.

summary.md is short: statuses, pass rates and the most common failures per part, the scores'
median, flags, and pointers to report.html (plots, item analytics) for the rest.
"For a person to look at" in summary.md lists every hand-in whose grade a person should check:
no score, a score of 0, a flag that can change a grade (any but the .err's `err_*` notes and an
unpenalised `modified_utils`), several hand-ins of one student, and the files of a download that fit no student. Every name
(ids, file names, messages that quote them) goes through grader.names (`inert` in Markdown, `cell`
in CSV): a name a student chose is never a heading, HTML, a terminal escape or a formula. Sections other commands add to
summary.md (between `<!-- NAME: begin -->` and `<!-- NAME: end -->`, e.g. the integrity note) are
kept when it is written again.
"""

import csv
import io
import json
import re
import sys
from collections import Counter
from pathlib import Path

from grader.analytics.page import write_report
from grader.analytics.triage import readable
from grader.intake.download import latest_attempt
from grader.intake.handin import id_match
from grader.kit import atomic_write
from grader.names import cell, inert, result_files, student_of
from grader.parts import BY_ID, PART_IDS, PARTS
from grader.results import ungradable

CSV_COLUMNS = ["student", "score", "max_score", "status", *PART_IDS, "flags", "source"]
MARKED = re.compile(r"<!-- ([\w-]+): begin -->.*?<!-- \1: end -->", re.S)   # other commands' sections


def gradebook_view(result: dict) -> dict:
    """What grades.csv and summary.md need of a result (its grading.json)."""
    keep_check = ("check", "hidden", "status", "message", "diagnosis", "flaky")
    parts = {p: {**{k: v for k, v in part.items() if k not in ("checks", "log")},
                 "checks": [{k: o.get(k) for k in keep_check} for o in part.get("checks", [])]}
             for p, part in result.get("parts", {}).items()}
    keep = ("student", "source", "sha256", "status", "score", "max_score", "message", "flags", "penalties")
    return {k: result.get(k) for k in keep} | {"parts": parts,
                                                 "sandbox": (result.get("isolation") or {}).get("mode", "")}


def load_views(out: Path) -> list:
    """The gradebook view of every result in `out`, in folder order: the one place the batch's
    view is built, from what the pipeline wrote (grader.pipeline.record), whichever route graded it."""
    views = []
    for path in result_files(out):
        try:
            view = gradebook_view(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue   # written atomically: only a file damaged by hand; the next run grades it again
        try:   # what the LMS download said of it: its id came from the LMS's names, not from the id pattern
            view["download"] = dict(json.loads((path.parent / "download.json").read_text()))
        except (OSError, ValueError, TypeError):
            view["download"] = {}
        view["lms"] = view["download"].get("lms", "")
        views.append(view)
    return views


def _by_student(views: list) -> dict:
    by_id = {}
    for v in views:
        by_id.setdefault(student_of(v["student"]), []).append(v)
    return by_id


def duplicates(views: list) -> dict:
    """Student id -> their results, for students with hand-ins of different bytes that are not an
    LMS's ordered attempts (Blackboard's: the latest counts, grader.intake.download.latest_attempt)."""
    return {s: vs for s, vs in _by_student(views).items() if len({v["sha256"] for v in vs}) > 1
            and latest_attempt([v.get("download") or {} for v in vs]) is None}


def earlier_attempts(views: list) -> set:
    """The (student, source) of every attempt a later attempt of the same student replaces."""
    earlier = set()
    for vs in _by_student(views).values():
        latest = latest_attempt([v.get("download") or {} for v in vs])
        earlier |= {(v["student"], v["source"]) for i, v in enumerate(vs) if latest is not None and i != latest}
    return earlier


def _fmt(points) -> str:
    return f"{points:g}" if points is not None else "-"


def grade_changing(view: dict) -> list:
    return [f for f in view["flags"] if not f.startswith("err_")
            and not (f == "modified_utils" and "modified_utils" not in (view.get("penalties") or {}))]


def look_reasons(view: dict) -> list:
    """Why a person should look at this hand-in's grade ([] when nothing)."""
    reasons = []
    if view["status"] in ("error", "infra_error", "invalid"):
        reasons.append(f"{view['status']}, {'no score' if view['score'] is None else 'scored ' + readable(view['score'])}: "
                       f"{view['message']}")
    elif view["score"] == 0:
        reasons.append(f"scored 0: {view['message']}")
    flags = grade_changing(view)
    if flags:
        reasons.append("flags " + ", ".join(flags))
    return reasons


def grades_csv(views: list) -> str:
    twice, earlier = duplicates(views), earlier_attempts(views)
    buffer = io.StringIO()
    # An optional part has its column only where some hand-in was graded on it.
    graded = [p for p in PART_IDS if not BY_ID[p].optional or any(p in r["parts"] for r in views)]
    columns = [c for c in CSV_COLUMNS if c not in PART_IDS or c in graded]
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in sorted(views, key=lambda r: (student_of(r["student"]), r["source"])):
        flags = r["flags"] + (["duplicate"] if student_of(r["student"]) in twice else []) \
            + (["earlier_attempt"] if (r["student"], r["source"]) in earlier else [])
        row = {"student": cell(student_of(r["student"])), "score": "" if r["score"] is None else _fmt(r["score"]),
               "max_score": _fmt(r["max_score"]), "status": r["status"], "flags": ";".join(flags),
               "source": cell(r["source"])}
        for part in graded:
            p = r["parts"].get(part)
            row[part] = "" if p is None or r["score"] is None else _fmt(p["score"])
        writer.writerow(row)
    return buffer.getvalue()


# A measured value: a number with a fraction or an exponent (how far off a weight was, a ratio).
MEASURED = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d+(?:e[-+]?\d+)?|\d+e[-+]?\d+)(?![\w.])")


def unmeasured(text: str) -> str:
    """`text` with its measured values as "…", so that failures that differ only in how far off
    they were count as one in summary.md's most common failures. Whole numbers (a dimension, a
    rank, a public check's sizes) are kept: a hidden check's never reach the text (grader.verdict.say)."""
    return MEASURED.sub("…", text or "")


def _reason(part: dict) -> str:
    first = next((o for o in part["checks"] if o["status"] != "passed"), None)
    if first is None:
        return part["message"]
    if first.get("diagnosis"):
        return unmeasured(first["diagnosis"])
    return str(first["status"]) if first["status"] != "failed" else unmeasured(first["message"])[:60]


def _scores(scored: list, max_score: float) -> list:
    scores = sorted(r["score"] for r in scored)
    mean = sum(scores) / len(scores)
    return [f"mean {readable(mean)}, median {readable(scores[len(scores) // 2])}, min {readable(scores[0])}, "
            f"max {readable(scores[-1])} (of {readable(max_score)}); every hand-in's row, the distribution, pass "
            f"rates per check and co-failure are in [report.html](report.html)"]


def summary_markdown(views: list, max_score: float, pattern: str = r"(?P<id>.+)", replaced=(), strays=(),
                     blocked: str = "") -> str:
    """summary.md of `views`; `replaced` and `strays` are sentences of this invocation's (results set
    aside by a newer hand-in; files of a download that fit no student); `blocked`: why nothing in
    the batch could be graded (grader.results.ungradable), said first."""
    n = len(views)
    lines = [f"# Assignment 4: summary of {n} hand-in{'s' if n != 1 else ''}", ""]
    if blocked:
        lines += [f"> **{inert(blocked)}**", ""]
    unsandboxed = sum(r.get("sandbox") == "off" for r in views)
    if unsandboxed:
        lines += [f"> **Warning:** {unsandboxed} hand-in(s) were graded with `--sandbox off`: their code ran "
                  f"with the grader's user's rights and network (`isolation` in their grading.json).", ""]
    lines += ["For staff: a row per hand-in (worst first, each part lost and why, linked to its feedback), pass "
              "rates per check (hidden ones named), diagnoses, co-failure and what was run are in "
              "[report.html](report.html) (numbers: analytics.json).", ""]
    statuses = Counter(r["status"] for r in views)
    lines += ["| status | hand-ins |", "| --- | --- |"] + [f"| {s} | {c} |" for s, c in statuses.most_common()] + [""]
    scored = [r for r in views if r["score"] is not None]
    lines += ["## Parts", "", "| part | passed | pass rate | most common failures |", "| --- | --- | --- | --- |"]
    for part in PARTS:
        outcomes = [r["parts"][part.id] for r in scored if part.id in r["parts"]]
        if part.optional and not any(part.id in r["parts"] for r in views):
            continue   # a part this course leaves off
        passed = sum(p["status"] == "passed" for p in outcomes)
        rate = f"{100 * passed / len(outcomes):.0f}%" if outcomes else "-"
        reasons = Counter(_reason(p) for p in outcomes if p["status"] != "passed")
        common = "; ".join(f"{inert(reason)} ({count})" for reason, count in reasons.most_common(3))
        lines.append(f"| {part.title} | {passed} / {len(outcomes)} | {rate} | {common} |")
    lines += ["", "## Scores", ""] + (_scores(scored, max_score) if scored else [])
    flags = Counter(f for r in views for f in r["flags"])
    if flags:
        lines += ["", "## Flags", "", "| flag | hand-ins |", "| --- | --- |"]
        lines += [f"| {f} | {c} |" for f, c in flags.most_common()]
    look = [f"- {inert(student_of(r['student']))} ({inert(r['source'])}): {inert('; '.join(why))}"
            for r in sorted(views, key=lambda r: r["student"]) if (why := look_reasons(r))]
    for student, vs in sorted(duplicates(views).items()):
        shown = ", ".join(f"{inert(v['source'])} ({_fmt(v['score'])})" for v in vs)
        look.append(f"- {inert(student)}: {len(vs)} hand-ins, {shown}: the final gradebook counts the latest by "
                    f"submission time when each has one, else the one its policy's `handins` names")
    look += [f"- not graded, fits no student: {inert(stray)}" for stray in strays]
    if look:
        lines += ["", "## For a person to look at", ""] + look
    unmatched = sorted({r["source"] for r in views if not r.get("lms") and id_match(r["source"], pattern) is None})
    if unmatched:
        lines += ["", "## Names the student id pattern does not match", "",
                  f"Their whole name became the id (`files.student_id_pattern`: `{pattern}`):", ""]
        lines += [f"- {inert(name)}" for name in unmatched]
    if replaced:
        lines += ["", "## Results replaced by a newer hand-in of the same name", ""] + [f"- {inert(r)}" for r in replaced]
    return "\n".join(lines) + "\n"


def write_outputs(views: list, out: Path, max_score: float, pattern: str = r"(?P<id>.+)", replaced=(),
                    strays=()) -> None:
    """grades.csv, summary.md, report.html and analytics.json into `out`."""
    atomic_write(out / "grades.csv", grades_csv(views))
    text = summary_markdown(views, max_score, pattern, replaced, strays, ungradable(out))
    try:
        kept = [m.group(0) for m in MARKED.finditer((out / "summary.md").read_text())]
    except OSError:
        kept = []
    atomic_write(out / "summary.md", text + "".join(f"\n{section}\n" for section in kept))
    try:
        write_report(out)
    except Exception as e:  # noqa: BLE001 - the grades are written: a report that cannot be drawn must not lose them
        print(f"grader: report.html not written ({type(e).__name__}: {e}); grades.csv and summary.md are",
              file=sys.stderr)

