"""report.html: the batch's item analytics (grader.analytics.numbers) as one page for course staff,
and analytics.json beside it with the same numbers.

The page is one file that opens from disk: its style is inline, its plots (drawn by grader.plots)
are embedded as data: URIs, and it names no other file but the hand-ins' feedback.md and
integrity.md as relative links. It is written by `grade` and again by `gradebook` (with the final
grades and late days). Hidden checks keep their names: the page is for staff and says so first.
"""

import html
import json
from pathlib import Path

from grader import plots
from grader.analytics.numbers import Analytics, analyse, integrity_pairs
from grader.kit import atomic_write
from grader.parts import BY_ID, PART_IDS

STAFF_ONLY = ("For course staff only. Hidden checks are named here and every hand-in is linked: "
              "do not share this page, or a screenshot of it, with students.")
LOOK = "look at the check before releasing grades"
STYLE = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1b1b1b;margin:0 auto;
 max-width:62rem;padding:0 1.2rem 3rem}
h1{font-size:1.6rem;margin:1rem 0 .3rem} h2{font-size:1.2rem;margin:2rem 0 .5rem;border-bottom:1px solid #ccc}
.staff{background:#7a1010;color:#fff;padding:.6rem 1rem;font-weight:600;margin:0 -1.2rem;position:sticky;top:0}
.look{background:#fff4d6;border-left:5px solid #d08a00;padding:.5rem 1rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem} th,td{border:1px solid #ddd;padding:.25rem .5rem;
 text-align:left;vertical-align:top} th{background:#f3f3f3} td.n{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%;height:auto;display:block;margin:.5rem 0} .muted{color:#666} code{font-size:.85rem}
.bad{background:#fde2e2} .hidden{font-style:italic}
@media print{.staff{position:static;-webkit-print-color-adjust:exact;print-color-adjust:exact}
 body{max-width:none;font-size:11px} section{break-inside:avoid} a{color:inherit;text-decoration:none}
 h2{break-after:avoid}}
"""


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _pct(n: dict) -> str:
    return f"{100 * n['passed'] / n['ran']:.0f}% ({n['passed']}/{n['ran']})" if n and n["ran"] else "-"


def _table(head: list, rows: list, numeric=()) -> str:
    """An HTML table; cells are already HTML; columns in `numeric` right-aligned."""
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td{' class=n' if i in numeric else ''}>{c}</td>" for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _img(name: str, draw) -> str:
    """The plot `draw()` makes, embedded; a line saying why not when matplotlib is missing."""
    try:
        image = draw()
    except ImportError:
        return f'<p class="muted">No {name} plot: matplotlib is not installed; analytics.json has the numbers.</p>'
    return f'<img data-plot="{_e(name)}" alt="{_e(name)}" src="{plots.data_uri(image)}">'


def _scores(a: Analytics) -> str:
    step = a.max_score / 20 or 1
    bins = [i * step for i in range(21)]
    series = {"autograde": a.scores} | ({"final (after the policy)": a.final} if a.final is not None else {})
    marks, total = {}, 0.0
    for pid in PART_IDS:
        total += a.part_points.get(pid) or 0
        n = PART_IDS.index(pid) + 1
        marks["part 1" if n == 1 else f"parts 1-{n}"] = total
    plot = _img("scores", lambda: plots.histogram(series, bins, f"score (of {a.max_score:g})", marks))
    lines = [f"autograde: median {a.median:g}, mean {sum(a.scores) / len(a.scores):.1f} over {len(a.scores)} "
             f"hand-in(s) with a score" if a.scores else "no hand-in has a score"]
    if a.final is not None:
        median = sorted(a.final)[len(a.final) // 2] if a.final else None
        lines.append(f"final: median {median:g} over {len(a.final)} student(s)" if a.final else "final: none")
    points = _table(["part", "points"], [[_e(BY_ID[p].title), f"{a.part_points.get(p) or 0:g}"] for p in PART_IDS], {1})
    return f"<section><h2>Scores</h2><p>{'<br>'.join(_e(x) for x in lines)}</p>{plot}{points}</section>"


def _grid(a: Analytics) -> str:
    names = [c["check"] for c in a.checks]
    values = [[(lambda n: n["passed"] / n["ran"] if n else None)(a.pass_rates[c].get(p)) for p in PART_IDS]
              for c in names]
    labels = [f"{c['check']} ({'hidden' if c['hidden'] else 'public'}, {c['world_size']} ranks)" for c in a.checks]
    plot = _img("pass rates", lambda: plots.heatmap(values, labels, [BY_ID[p].title.split(":")[0] for p in PART_IDS],
                                                    title="pass rate per check and part")) if names else ""
    flagged = {(x["check"], x["part"]) for x in a.look_at}
    rows = []
    for c in a.checks:
        cells = [f"<span class=bad>{_pct(a.pass_rates[c['check']].get(p))}</span>"
                 if (c["check"], p) in flagged else _pct(a.pass_rates[c["check"]].get(p)) for p in PART_IDS]
        rows.append([f"<code>{_e(c['check'])}</code>" + (" <span class=hidden>hidden</span>" if c["hidden"] else ""),
                     str(c["world_size"]), *cells])
    rows.append(["<b>all public</b>", "", *[_pct(a.by_visibility[p].get("public")) for p in PART_IDS]])
    rows.append(["<b>all hidden</b>", "", *[_pct(a.by_visibility[p].get("hidden")) for p in PART_IDS]])
    table = _table(["check", "ranks", *[_e(BY_ID[p].title) for p in PART_IDS]], rows, {1, 2, 3, 4, 5})
    return (f"<section><h2>Checks x parts: pass rates</h2><p class=muted>A check that fails far more often "
            f"than its neighbours is worth reading before the grades go out.</p>{plot}{table}</section>")


def _look(a: Analytics) -> str:
    if not a.look_at:
        return ""
    rows = [[f"<code>{_e(x['check'])}</code>", _e(BY_ID[x["part"]].title), _e(x["why"]), _e(x["reference"])]
            for x in a.look_at]
    return (f'<section class="look"><h2>{_e(LOOK[0].upper() + LOOK[1:])}</h2>'
            f"<p>{len(a.look_at)} check(s) behave as a broken check would. The reference's own result at each "
            f"is beside it.</p>{_table(['check', 'part', 'why', 'the reference'], rows)}</section>")


def _links(folders: list, a: Analytics, most: int = 12) -> str:
    shown = ", ".join(f'<a href="{_e(a.feedback[f])}">{_e(f)}</a>' for f in folders[:most])
    return shown + (f" and {len(folders) - most} more" if len(folders) > most else "")


def _diagnoses(a: Analytics) -> str:
    rows = []
    for p in PART_IDS:
        found = a.diagnoses.get(p, [])
        for i, d in enumerate(found):
            head = f"<th rowspan={len(found)}>{_e(BY_ID[p].title)}</th>" if i == 0 else ""
            rows.append(f"<tr>{head}<td>{_e(d['diagnosis'])}</td><td class=n>{len(d['handins'])}</td>"
                        f"<td>{_links(d['handins'], a)}</td></tr>")
    body = ("<table><tr><th>part</th><th>diagnosis</th><th>hand-ins</th><th>feedback</th></tr>" + "".join(rows)
            + "</table>") if rows else "<p>None.</p>"
    return f"<section><h2>Diagnoses per part</h2>{body}</section>"


def _cofailure(a: Analytics) -> str:
    short = [BY_ID[p].title.split(":")[0] for p in PART_IDS]
    top = max((max(r) for r in a.cofailure["matrix"]), default=0)
    plot = _img("co-failure", lambda: plots.heatmap(a.cofailure["matrix"], short, short, fmt="{:g}", vmax=top or 1,
                                                    cmap="Reds", title="hand-ins wrong at both parts", width=4.6))
    c = a.cluster
    said = (f"<p>The biggest cluster: {c['handins']} hand-in(s) wrong at "
            f"{_e(', '.join(BY_ID[p].title for p in c['parts']))}; the usual misconception behind it "
            f"({c['with_it']} of them): <b>{_e(c['misconception'])}</b>. {_links(c['members'], a)}</p>" if c else
            "<p>No hand-in that is right at one part is wrong at two.</p>")
    checks = a.cofailure["checks"]
    by_check = _table(["wrong at both", *[f"<code>{_e(c)}</code>" for c in checks]],
                      [[f"<code>{_e(c)}</code>", *[str(n) for n in row]] for c, row in zip(checks, a.cofailure["by_check"])],
                      set(range(1, len(checks) + 1)))
    return (f"<section><h2>Co-failure</h2><p class=muted>Wrong: failed, crashed, timed out or out of memory "
            f"(a TODO left is not counted). The diagonal: hand-ins wrong at that part.</p>{plot}{said}"
            f"<h3>Checks</h3><p class=muted>Hand-ins wrong at both checks, at any part (the diagonal: wrong at "
            f"that check). A check wrong where no other is catches what the others miss.</p>{by_check}</section>")


def _counts(title: str, head: list, rows: list, empty: str) -> str:
    return f"<h3>{_e(title)}</h3>" + (_table(head, rows, {1, 2}) if rows else f"<p>{_e(empty)}</p>")


def _rest(a: Analytics) -> str:
    hangs = [[_e(BY_ID[p].title), str(h["timeout"]), str(h["crashed"]),
              _e(", ".join(f"{op} ({n})" for op, n in h["collectives"].items()) or "-")]
             for p, h in a.hangs.items() if h["timeout"] or h["crashed"]]
    parts = [_counts("Hangs and crashes per part", ["part", "timeout", "crashed", "collective (named, else called)"], hangs,
                     "No re-run hung or crashed.")]
    parts.append(_counts("Flags", ["flag", "hand-ins"], [[_e(f), str(n)] for f, n in a.flags.items()], "No flags."))
    if a.late_days is None:
        parts.append("<h3>Late days</h3><p>Known once the final gradebook is made "
                     "(<code>python -m grader gradebook OUT --policy POLICY.yaml</code>).</p>")
    else:
        parts.append(_counts("Late days", ["days late", "students"], [[d, str(n)] for d, n in a.late_days.items()],
                             "No hand-in has a submission time."))
    if a.integrity is None:
        parts.append("<h3>Integrity</h3><p>Not checked yet (<code>python -m grader integrity OUT PATH...</code>).</p>")
    else:
        link = f' (<a href="{_e(a.integrity["report"])}">integrity.md</a>)' if a.integrity["report"] else ""
        parts.append(f"<h3>Integrity</h3><p>{a.integrity['pairs']} pair(s) for a person to compare, "
                     f"{a.integrity['strong']} strong{link}: evidence to weigh, never a verdict.</p>")
    return "<section><h2>Hangs, crashes, flags, lateness, integrity</h2>" + "".join(parts) + "</section>"


def _run(a: Analytics) -> str:
    r = a.run
    s = r["seconds"]
    rows = [["grader digest", _e(", ".join(f"{d[:12]} ({n})" for d, n in r["grader_digests"].items()))],
            ["grader version", _e(", ".join(f"{v} ({n})" for v, n in r["grader_versions"].items()))],
            ["rubric digest", _e(", ".join(f"{d[:12]} ({n})" for d, n in r["rubric_digests"].items()))],
            ["torch (grading environment)", _e(r["torch"])],
            ["seconds per graded hand-in", _e(f"median {s['median']:.1f}, max {s['max']:.1f}, total {s['total']:.0f} "
                                              f"over {s['graded']}" if s["graded"] else "-")]]
    rows += [[f"isolation: {_e(k)}", _e(", ".join(f"{v} ({n})" for v, n in values.items()))]
             for k, values in r["isolation"].items()]
    return f"<section><h2>What was run</h2>{_table(['what', 'in this batch (hand-ins)'], rows)}</section>"


def report_html(a: Analytics) -> str:
    statuses = ", ".join(f"{s} {n}" for s, n in a.statuses.items()) or "none"
    made = "with the final grades" if a.final is not None else "after grading"
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>Assignment 4: batch report (staff only)</title>", f"<style>{STYLE}</style></head><body>",
        f'<div class="staff" role="note">{_e(STAFF_ONLY)}</div>',
        f"<h1>Assignment 4: batch report</h1><p class=muted>Made {_e(a.made_at)} {made} from {a.handins} "
        f"hand-in(s) ({_e(statuses)}). The numbers: <a href=\"analytics.json\">analytics.json</a>; "
        f"the grades: <a href=\"grades.csv\">grades.csv</a>.</p>",
        _look(a), _scores(a), _grid(a), _diagnoses(a), _cofailure(a), _rest(a), _run(a),
        "</body></html>", ""])


def write_report(out, final_rows=None) -> Analytics:
    """report.html and analytics.json into `out`, from every result in it (and `final_rows`, the
    final gradebook's, when there is one)."""
    out = Path(out)
    a = analyse(out, final_rows)
    atomic_write(out / "analytics.json", json.dumps(a.to_dict(), indent=1, sort_keys=True) + "\n")
    atomic_write(out / "report.html", report_html(a))
    return a


def refresh_integrity(out) -> bool:
    """report.html and analytics.json again with the integrity pairs integrity.csv lists now, every
    other number (final grades included) as analytics.json holds it; False when there is none."""
    out = Path(out)
    try:
        a = Analytics(**json.loads((out / "analytics.json").read_text()))
    except (OSError, ValueError, TypeError):
        return False
    a.integrity = integrity_pairs(out)
    atomic_write(out / "analytics.json", json.dumps(a.to_dict(), indent=1, sort_keys=True) + "\n")
    atomic_write(out / "report.html", report_html(a))
    return True
