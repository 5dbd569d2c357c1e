"""The batch's item analytics, as numbers: what report.html draws and analytics.json holds.

Read from every result in OUT (grader.names.result_files), never from a re-run, over the parts
the batch graded (`parts`: a part the course turns off is in no result, so in no number):

- one row per hand-in, worst first (grader.analytics.triage), and why the batch could not be
  graded at all when it could not (grader.results.ungradable: the canary's cause);
- pass rates per check x part (an outcome passes when its status is `passed`; every outcome that
  was attempted counts, a TODO left as `not_implemented` too), and per part over its public and
  its hidden checks;
- checks to look at before releasing grades: a check nobody passes at a part (of at least
  MIN_RAN hand-ins), or one whose wrong outcomes at a part all lie in hand-ins that are wrong at
  another part too (at least MIN_RAN of them, hand-ins wrong at every part they ran left out):
  it may measure that other part. Beside each, the reference's own result at that check: the
  canary's (grader.batch.local re-runs the reference at every check before grading; had it failed
  anywhere, every hand-in would be infra_error with no score), so "passed" whenever the batch
  holds a graded result of that grader;
- diagnoses per part, most common first, with the hand-ins that have them (a hand-in's diagnosis
  at a part is that of its first check with one: the public check's, with its numbers);
- co-failure: for parts P and Q, the hand-ins wrong at both (the diagonal: wrong at P), and the
  same for checks C and D (wrong at each, at any part), where
  wrong is failed, crashed, timeout or oom (a TODO left is not a misconception); the biggest
  cluster is the most common set of two or more wrong parts among hand-ins right at one part at
  least (code that does not load is wrong everywhere and says nothing), with its most common
  diagnosis;
- hangs (timeout) and crashes per part, by the collective the re-run names (else the collectives
  its ranks had called);
- flags, late days (from the final gradebook, when there is one), integrity pairs (integrity.csv);
- what was run: grader and rubric digests, isolation layers, torch, seconds per hand-in.
"""

import csv
import io
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from grader.analytics import triage
from grader.parts import BY_ID, PART_IDS
from grader.names import result_files
from grader.results import ToDict, ungradable

MIN_RAN = 2          # a check is flagged only over at least this many hand-ins
WRONG = ("failed", "crashed", "timeout", "oom")   # ran and was wrong (not a TODO, not infra)
COLLECTIVE = re.compile(r"\b(all_reduce|all_gather(?:_into_tensor|_object)?|reduce_scatter(?:_tensor)?|broadcast"
                        r"|all_to_all|barrier)\b")
REFERENCE_PASSED = "passed (the canary, run before grading)"
REFERENCE_UNKNOWN = "not known (no graded hand-in in this batch)"


@dataclass
class Analytics(ToDict):
    """Every number of report.html; `to_dict()` is analytics.json."""
    made_at: str = ""
    handins: int = 0
    ungradable: str = ""                                # why no hand-in has a score (grader.results.ungradable)
    parts: list = field(default_factory=list)           # the parts this batch graded (a part turned off: none)
    students: list = field(default_factory=list)        # triage rows, worst first (grader.analytics.triage)
    statuses: dict = field(default_factory=dict)        # status -> hand-ins
    max_score: float = 0.0
    part_points: dict = field(default_factory=dict)     # part -> its points (log + re-run)
    scores: list = field(default_factory=list)          # autograde scores of hand-ins with a score
    final: list = None                                  # final grades (after policy), when a gradebook was made
    checks: list = field(default_factory=list)          # [{check, hidden, world_size}] in rubric order
    pass_rates: dict = field(default_factory=dict)      # check -> part -> {passed, ran}
    by_visibility: dict = field(default_factory=dict)   # part -> {public|hidden: {passed, ran}}
    look_at: list = field(default_factory=list)         # [{check, part, why, reference}]
    diagnoses: dict = field(default_factory=dict)       # part -> [{diagnosis, handins: [folder]}], most first
    cofailure: dict = field(default_factory=dict)       # {parts: [...], matrix: [[n]], checks: [...], by_check: [[n]]}
    cluster: dict = field(default_factory=dict)         # {parts, handins, misconception, with_it}
    hangs: dict = field(default_factory=dict)           # part -> {timeout, crashed, collectives: {op: n}}
    flags: dict = field(default_factory=dict)           # flag -> hand-ins
    late_days: dict = None                              # days late -> students (final gradebook only)
    integrity: dict = None                              # {pairs, strong, report} when integrity.csv exists
    run: dict = field(default_factory=dict)             # what was run: digests, isolation, torch, seconds

    @property
    def median(self):
        return _median(self.scores)


def _median(values: list):
    return sorted(values)[len(values) // 2] if values else None


def _rate(passed: int, ran: int) -> dict:
    return {"passed": passed, "ran": ran}


def load(out) -> dict:
    """a result's key (its folder's name) -> its grading.json, for every result in `out`."""
    results = {}
    for path in result_files(out):
        try:
            results[path.parent.name] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue   # written atomically: only a file damaged by hand
    return results


def _grid(results: dict, a: Analytics) -> None:
    seen = {}
    for r in results.values():
        for part in r.get("parts", {}).values():
            for o in part.get("checks") or []:
                seen.setdefault(o["check"], {"check": o["check"], "hidden": bool(o.get("hidden")),
                                             "world_size": o.get("world_size")})
    a.checks = list(seen.values())
    counts = {c: {p: [0, 0] for p in a.parts} for c in seen}
    visible = {p: {"public": [0, 0], "hidden": [0, 0]} for p in a.parts}
    for r in results.values():
        for pid, part in r.get("parts", {}).items():
            for o in part.get("checks") or [] if pid in a.parts else []:
                if o["status"] in ("not_run", "infra_error"):
                    continue
                ok = o["status"] == "passed"
                for cell in (counts[o["check"]][pid], visible[pid]["hidden" if o.get("hidden") else "public"]):
                    cell[0] += ok
                    cell[1] += 1
    a.pass_rates = {c: {p: _rate(*n) for p, n in parts.items() if n[1]} for c, parts in counts.items()}
    a.by_visibility = {p: {k: _rate(*n) for k, n in v.items() if n[1]} for p, v in visible.items()}


def _wrong_sets(results: dict) -> dict:
    """(check, part) -> the folders wrong there."""
    wrong = {}
    for folder, r in results.items():
        for pid, part in r.get("parts", {}).items():
            for o in part.get("checks") or []:
                if o["status"] in WRONG:
                    wrong.setdefault((o["check"], pid), set()).add(folder)
    return wrong


def _look_at(results: dict, a: Analytics) -> None:
    graded = [r for r in results.values() if r.get("status") == "graded"]
    reference = REFERENCE_PASSED if graded else REFERENCE_UNKNOWN
    for c in a.checks:
        for pid, n in a.pass_rates[c["check"]].items():
            if n["ran"] >= MIN_RAN and n["passed"] == 0:
                a.look_at.append({"check": c["check"], "part": pid, "reference": reference,
                                  "why": f"nobody passes it: 0 of {n['ran']} hand-ins"})
    wrong = _wrong_sets(results)
    wrong_parts = {}
    for (check, pid), folders in wrong.items():
        for f in folders:
            wrong_parts.setdefault(f, set()).add(pid)
    ran_parts = {f: {pid for pid, p in r.get("parts", {}).items() if p.get("checks")} for f, r in results.items()}
    telling = {f for f, parts in wrong_parts.items() if parts != ran_parts.get(f)}   # right somewhere
    flagged = {(x["check"], x["part"]) for x in a.look_at}
    for (check, pid), folders in sorted(wrong.items()):
        mine = folders & telling
        if len(mine) < MIN_RAN or (check, pid) in flagged:
            continue
        for other in a.parts:
            if other != pid and all(other in wrong_parts[f] for f in mine):
                a.look_at.append({"check": check, "part": pid, "reference": reference,
                                  "why": f"wrong only in hand-ins wrong at {BY_ID[other].title} too "
                                         f"({len(mine)} of them): it may measure that part"})
                break


def _diagnoses(results: dict, a: Analytics) -> None:
    for pid in a.parts:
        found = {}
        for folder, r in results.items():
            part = r.get("parts", {}).get(pid) or {}
            said = next((o["diagnosis"] for o in part.get("checks") or []
                         if o.get("diagnosis") and o["status"] != "passed"), None)
            if said:   # the first check's: a hidden check says the same mistake without its numbers
                found.setdefault(said, []).append(folder)
        a.diagnoses[pid] = [{"diagnosis": d, "handins": sorted(fs)}
                            for d, fs in sorted(found.items(), key=lambda kv: (-len(kv[1]), kv[0]))]


def _cofailure(results: dict, a: Analytics) -> None:
    wrong = {f: {pid for pid, p in r.get("parts", {}).items() if p.get("status") in WRONG}
             for f, r in results.items() if r.get("score") is not None}
    a.cofailure = {"parts": list(a.parts),
                   "matrix": [[sum(p in w and q in w for w in wrong.values()) for q in a.parts] for p in a.parts]}
    by_check = {}   # folder -> the checks it is wrong at, at any part
    for (check, _), folders in _wrong_sets(results).items():
        for f in folders:
            by_check.setdefault(f, set()).add(check)
    checks = [c["check"] for c in a.checks]
    a.cofailure |= {"checks": checks, "by_check": [[sum(c in w and d in w for f, w in by_check.items() if f in wrong)
                                                    for d in checks] for c in checks]}
    ran = {f: {pid for pid, p in results[f].get("parts", {}).items() if p.get("checks")} for f in wrong}
    patterns = Counter(tuple(p for p in a.parts if p in w) for f, w in wrong.items()
                       if len(w) >= 2 and w != ran[f])   # right at one part at least: code that ran
    if not patterns:
        a.cluster = {}
        return
    parts, n = min(patterns.items(), key=lambda kv: (-kv[1], kv[0]))
    members = [f for f, w in wrong.items() if tuple(p for p in a.parts if p in w) == parts and w != ran[f]]
    said = Counter(d for f in members for p in parts
                   for d in {o["diagnosis"] for o in results[f]["parts"][p].get("checks") or [] if o.get("diagnosis")})
    misconception, count = said.most_common(1)[0] if said else ("no diagnosis: the parts crashed or hung", 0)
    a.cluster = {"parts": list(parts), "handins": n, "misconception": misconception, "with_it": count,
                 "members": sorted(members)}


def _collective(outcome: dict) -> str:
    """The collective a hung or crashed re-run names; else those its ranks had called."""
    named = COLLECTIVE.findall(f"{outcome.get('message', '')} {outcome.get('error', '')}")
    if named:
        return named[0]
    called = sorted(outcome.get("collectives") or {})
    return f"after {' and '.join(called)}" if called else "before any collective"


def _hangs(results: dict, a: Analytics) -> None:
    for pid in a.parts:
        row = {"timeout": 0, "crashed": 0, "collectives": Counter()}
        for r in results.values():
            outcomes = [o for o in (r.get("parts", {}).get(pid) or {}).get("checks") or []
                        if o["status"] in ("timeout", "crashed")]
            for status in {o["status"] for o in outcomes}:
                row[status] += 1
            for o in outcomes[:1]:
                row["collectives"][_collective(o)] += 1
        row["collectives"] = dict(row["collectives"].most_common())
        a.hangs[pid] = row


def integrity_pairs(out: Path):
    """What integrity.csv in `out` lists (None when there is none)."""
    try:
        rows = list(csv.DictReader(io.StringIO((out / "integrity.csv").read_text())))
    except (OSError, csv.Error):
        return None
    return {"pairs": len(rows), "strong": sum(r.get("strength") == "strong" for r in rows),
            "report": "integrity.md" if (out / "integrity.md").exists() else ""}


def _run(results: dict) -> dict:
    seconds = [float(r.get("seconds") or 0) for r in results.values() if r.get("status") == "graded"]
    isolation = {}
    for r in results.values():
        for key, value in (r.get("isolation") or {}).items():
            shown = f"{len(value)} problem(s)" if isinstance(value, list) else str(value)
            isolation.setdefault(key, Counter())[shown] += 1
    graded = Counter(r.get("torch") for r in results.values() if r.get("torch"))   # what graded them
    try:
        here = f"{metadata.version('torch')} (this environment's; the results do not say)"
    except metadata.PackageNotFoundError:
        here = "not installed"
    torch = ", ".join(f"{build}" + (f" ({n} hand-ins)" if len(graded) > 1 else "") for build, n in graded.items())
    return {"grader_digests": dict(Counter(r.get("grader_digest", "") for r in results.values())),
            "grader_versions": dict(Counter(r.get("grader_version", "") for r in results.values())),
            "rubric_digests": dict(Counter(r.get("rubric_sha256", "") for r in results.values())),
            "isolation": {k: dict(v) for k, v in isolation.items()}, "torch": torch or here,
            "seconds": {"median": _median(seconds), "max": max(seconds, default=None),
                        "total": round(sum(seconds), 2), "graded": len(seconds)}}


def analyse(out, final_rows=None) -> Analytics:
    """The analytics of every result in `out`; `final_rows` (grader.grades.book.Row or dicts with
    `final` and `late_days`) add the final grades and late days."""
    out = Path(out)
    results = load(out)
    a = Analytics(made_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), handins=len(results))
    a.statuses = dict(Counter(r.get("status") for r in results.values()).most_common())
    a.max_score = max((r.get("max_score") or 0 for r in results.values()), default=0.0)
    for r in results.values():
        for pid, part in r.get("parts", {}).items():
            a.part_points.setdefault(pid, part.get("max_score"))   # a part turned off is in no result
    a.scores = sorted(r["score"] for r in results.values() if r.get("score") is not None)
    a.parts = [p for p in PART_IDS if any(p in (r.get("parts") or {}) for r in results.values())]
    a.students = triage.rows(results, out)
    a.ungradable = ungradable(out)
    _grid(results, a)
    _look_at(results, a)
    _diagnoses(results, a)
    _cofailure(results, a)
    _hangs(results, a)
    a.flags = dict(Counter(flag for r in results.values() for flag in r.get("flags") or []).most_common())
    a.integrity = integrity_pairs(out)
    a.run = _run(results)
    if final_rows is not None:
        rows = [r if isinstance(r, dict) else r.to_dict() for r in final_rows]
        a.final = sorted(r["final"] for r in rows if r.get("final") is not None)
        a.late_days = {str(d): n for d, n in sorted(Counter(r["late_days"] for r in rows
                                                           if r.get("late_days") is not None).items())}
        triage.with_final(a.students, rows)
    return a
