"""report.html: the batch for course staff, triage first, from the Jinja2 template
templates/report.html (autoescape: every name and message is escaped there); analytics.json beside
it with the same numbers (grader.analytics.numbers).

What a TA sees, top down:
- the staff-only banner; when nothing in the batch could be graded, the cause and what to do
  (grader.results.ungradable) instead of any statistics;
- one row per hand-in, worst first (grader.analytics.triage): score, status, each part that lost
  points with its one-line reason, flags, and a link to the hand-in's feedback page;
- the checks to look at before releasing grades, then statistics sized to the class: a score
  histogram from PLOTS_FROM scored hand-ins (below: the numbers alone), the pass-rate heatmap and
  the co-failure matrices from MATRICES_FROM hand-ins (below: the TOP_PAIRS pairs wrong together,
  as sentences), diagnoses per part, hangs and crashes, flags, lateness, integrity, what was run.

Parts a course turns off are in no result, so in no table. Numbers are rounded for reading
(triage.readable); grades.csv keeps the scores the LMS takes. The page is one file that opens from
disk: its style is inline, its plots (grader.plots) data: URIs, and its only links are relative:
the feedback pages, integrity.md, analytics.json and grades.csv. It is written by `grade` and again
by `gradebook` (with the final grades and late days); hidden checks keep their names.
"""

import dataclasses
import json
from pathlib import Path

from grader import plots
from grader.analytics.numbers import Analytics, analyse, integrity_pairs
from grader.analytics.triage import readable
from grader.kit import atomic_write, page_template
from grader.parts import BY_ID

TEMPLATE = Path(__file__).parent / "templates" / "report.html"   # its page, escaped by autoescape

STAFF_ONLY = ("For course staff only. Hidden checks are named here and every hand-in is linked: "
              "do not share this page, or a screenshot of it, with students.")
LOOK = "look at the check before releasing grades"
PLOTS_FROM = 10      # scored hand-ins before the score histogram is drawn
MATRICES_FROM = 20   # hand-ins before the pass-rate heatmap and the co-failure matrices
TOP_PAIRS = 5        # pairs wrong together said in words below MATRICES_FROM


def _img(name: str, draw) -> dict:
    """The plot `draw()` makes, as an <img>'s data; a note instead when matplotlib is missing."""
    try:
        return {"name": name, "src": plots.data_uri(draw())}
    except ImportError:
        return {"name": name, "missing": f"No {name} plot: matplotlib is not installed; analytics.json has the numbers."}


def _rate(n: dict) -> str:
    return f"{100 * n['passed'] / n['ran']:.0f}% ({n['passed']}/{n['ran']})" if n and n["ran"] else "-"


def _short(pid: str) -> str:
    return BY_ID[pid].title.split(":")[0]


def _scores(a: Analytics) -> dict:
    if not a.scores:
        return {"lines": ["no hand-in has a score"], "plot": None}
    mean = sum(a.scores) / len(a.scores)
    lines = [f"autograde: median {readable(a.median)}, mean {readable(mean)}, min {readable(a.scores[0])}, max "
             f"{readable(a.scores[-1])} (of {readable(a.max_score)}) over {len(a.scores)} hand-in(s) with a score"]
    series = {"autograde": a.scores}
    if a.final is not None:
        lines.append(f"final: median {readable(sorted(a.final)[len(a.final) // 2])} over {len(a.final)} student(s)"
                     if a.final else "final: none")
        series["final (after the policy)"] = a.final or []
    plot = None
    if len(a.scores) >= PLOTS_FROM:
        step = a.max_score / 20 or 1
        marks, total = {}, 0.0
        for n, pid in enumerate(a.parts, start=1):
            total += a.part_points.get(pid) or 0
            marks["part 1" if n == 1 else f"parts 1-{n}"] = total
        plot = _img("scores", lambda: plots.histogram(series, [i * step for i in range(21)],
                                                      f"score (of {a.max_score:g})", marks))
    return {"lines": lines, "plot": plot}


def _grid(a: Analytics) -> dict:
    flagged = {(x["check"], x["part"]) for x in a.look_at}
    rows = [{"check": c["check"], "hidden": c["hidden"], "ranks": c["world_size"],
             "cells": [{"text": _rate(a.pass_rates[c["check"]].get(p)), "bad": (c["check"], p) in flagged}
                       for p in a.parts]} for c in a.checks]
    totals = [(f"all {v}", [_rate(a.by_visibility[p].get(v)) for p in a.parts]) for v in ("public", "hidden")]
    plot = None
    if a.checks and a.handins >= MATRICES_FROM:
        values = [[(lambda n: n["passed"] / n["ran"] if n else None)(a.pass_rates[c["check"]].get(p))
                   for p in a.parts] for c in a.checks]
        labels = [f"{c['check']} ({'hidden' if c['hidden'] else 'public'}, {c['world_size']} ranks)" for c in a.checks]
        plot = _img("pass rates", lambda: plots.heatmap(values, labels, [_short(p) for p in a.parts],
                                                        title="pass rate per check and part"))
    return {"rows": rows, "totals": totals, "plot": plot}


def _pairs(names: list, matrix: list, label) -> list:
    """The TOP_PAIRS pairs (off the diagonal) most hand-ins are wrong at together, as sentences."""
    pairs = sorted(((matrix[i][j], i, j) for i in range(len(names)) for j in range(i + 1, len(names))
                    if matrix[i][j]), key=lambda t: (-t[0], t[1], t[2]))
    return [f"{label(names[i])} and {label(names[j])}: {n} hand-in(s) wrong at both" for n, i, j in pairs[:TOP_PAIRS]]


def _cofailure(a: Analytics) -> dict:
    parts, checks = a.cofailure.get("parts", []), a.cofailure.get("checks", [])
    said = {"cluster": a.cluster or None, "cluster_parts": ", ".join(BY_ID[p].title for p in (a.cluster or {}).get("parts", []))}
    if a.handins < MATRICES_FROM:
        return said | {"part_pairs": _pairs(parts, a.cofailure.get("matrix", []), lambda p: BY_ID[p].title),
                       "check_pairs": _pairs(checks, a.cofailure.get("by_check", []), lambda c: f"check '{c}'")}
    top = max((max(r) for r in a.cofailure["matrix"]), default=0)
    short = [_short(p) for p in parts]
    plot = _img("co-failure", lambda: plots.heatmap(a.cofailure["matrix"], short, short, fmt="{:g}", vmax=top or 1,
                                                    cmap="Reds", title="hand-ins wrong at both parts", width=4.6))
    return said | {"plot": plot, "checks": checks, "by_check": list(zip(checks, a.cofailure["by_check"]))}


def _run(a: Analytics) -> list:
    r, s = a.run, a.run["seconds"]
    rows = [("grader digest", ", ".join(f"{d[:12]} ({n})" for d, n in r["grader_digests"].items())),
            ("grader version", ", ".join(f"{v} ({n})" for v, n in r["grader_versions"].items())),
            ("rubric digest", ", ".join(f"{d[:12]} ({n})" for d, n in r["rubric_digests"].items())),
            ("torch that graded (version, build)", r["torch"]),
            ("seconds per graded hand-in", f"median {s['median']:.1f}, max {s['max']:.1f}, total {s['total']:.0f} "
                                           f"over {s['graded']}" if s["graded"] else "-")]
    return rows + [(f"isolation: {k}", ", ".join(f"{v} ({n})" for v, n in values.items()))
                   for k, values in r["isolation"].items()]


def report_html(a: Analytics) -> str:
    hangs = [(BY_ID[p].title, h["timeout"], h["crashed"], ", ".join(f"{op} ({n})" for op, n in h["collectives"].items())
              or "-") for p, h in a.hangs.items() if h["timeout"] or h["crashed"]]
    return page_template(TEMPLATE).render(
        a=a, staff_only=STAFF_ONLY, look_title=LOOK[0].upper() + LOOK[1:], titles={p: BY_ID[p].title for p in a.parts},
        made="with the final grades" if a.final is not None else "after grading",
        statuses=", ".join(f"{s} {n}" for s, n in a.statuses.items()) or "none",
        scores=None if a.ungradable else _scores(a), grid=_grid(a), cofailure=_cofailure(a), hangs=hangs,
        points=[(BY_ID[p].title, readable(a.part_points.get(p) or 0)) for p in a.parts], run=_run(a),
        diagnosed=any(a.diagnoses.get(p) for p in a.parts), matrices_from=MATRICES_FROM, plots_from=PLOTS_FROM, shown=lambda folders, most=12: folders[:most])


def _write(out: Path, a: Analytics) -> None:
    atomic_write(out / "analytics.json", json.dumps(a.to_dict(), indent=1, sort_keys=True) + "\n")
    atomic_write(out / "report.html", report_html(a))


def write_report(out, final_rows=None) -> Analytics:
    """report.html and analytics.json into `out`, from every result in it (and `final_rows`, the
    final gradebook's, when there is one)."""
    a = analyse(Path(out), final_rows)
    _write(Path(out), a)
    return a


def refresh_integrity(out) -> bool:
    """report.html and analytics.json again with the integrity pairs integrity.csv lists now, every
    other number (final grades included) as analytics.json holds it; False when there is none."""
    out = Path(out)
    known = {f.name for f in dataclasses.fields(Analytics)}
    try:
        a = Analytics(**{k: v for k, v in json.loads((out / "analytics.json").read_text()).items() if k in known})
    except (OSError, ValueError, TypeError, AttributeError):
        return False
    a.integrity = integrity_pairs(out)
    _write(out, a)
    return True
