"""`python -m grader integrity OUT [PATH...] [--base FILE]`: the integrity report of a graded batch.

`run_integrity` reads every OUT/students/<student>/grading.json, finds the hand-ins again among the PATHs
(the same ones given to `grade`), reads each one's evidence (grader.integrity.facts), pairs them
(grader.integrity.evidence) and writes OUT/integrity.csv and OUT/integrity.md (and the count of
pairs into OUT/report.html, grader.analytics). It re-runs nothing. The code's base is the kit's
skeleton, reference and utils.py; `--base FILE` adds code a course gave its students otherwise
(its own handout's code, say), so that what every hand-in took from it counts for nothing.
"""

import math
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from grader.analytics.page import refresh_integrity
from grader.integrity.code import Base
from grader.integrity.evidence import find_pairs
from grader.integrity.facts import load_results, match_handins, read_facts
from grader.integrity.report import IntegrityReport, write_report
from grader.rubric import RubricError, load_rubric

COMMON_SHARE = 0.02   # by default, evidence more than 2% of the hand-ins share is common ...
COMMON_MIN = 5        # ... and never fewer than 5


class IntegrityError(ValueError):
    """OUT is not a graded batch; the message says what to do."""


def default_common(handins: int) -> int:
    return max(COMMON_MIN, math.ceil(COMMON_SHARE * handins))


def _wrong_checks(results: list) -> tuple:
    """(checks failed on a wrong weight, those with a weight_digest) over every result."""
    wrong = digests = 0
    for r in results:
        for part in (r.get("parts") or {}).values():
            for o in part.get("checks") or []:
                if o.get("status") == "failed" and o.get("diagnosis"):
                    wrong += 1
                    digests += bool(o.get("weight_digest"))
    return wrong, digests


def course_base(files=()) -> Base:
    """The code every hand-in may hold: the kit's skeleton, reference and utils.py, and `files` (the
    code a course gave its students where it is not the kit's skeleton, such as its own handout)."""
    for path in map(Path, files):
        if not path.is_file():
            raise IntegrityError(f"--base {path}: no such file; give the code the students were given (a .py file)")
        if path.suffix != ".py":
            raise IntegrityError(f"--base {path}: not a .py file; give the code the students were given")
    return Base.from_files(extra=files)


def run_integrity(out, paths=(), rubric_path=None, common: int = None, base: Base = None,
                  base_files=()) -> IntegrityReport:
    """The integrity report of the batch graded into `out`, written there; see the module docstring.
    `common`: evidence shared by more hand-ins than this is common, not listed (default_common).
    `base_files`: code the students were given besides the kit's (course_base)."""
    started = time.monotonic()
    out = Path(out)
    if not out.is_dir():
        raise IntegrityError(f"{out}: no such folder; give the folder `python -m grader grade --out` wrote")
    base = base or course_base(base_files)
    rubric = load_rubric(rubric_path)
    results, notes = load_results(out)
    if not results:
        raise IntegrityError(f"{out}: no students/*/grading.json in it; grade the hand-ins first "
                             f"(python -m grader grade PATH... --out {out})")
    pattern = rubric.files.student_id_pattern
    matched, found_notes = match_handins(results, list(paths), pattern)
    facts = [read_facts(r, matched.get(r["student"]), base, rubric) for r in results]
    read = time.monotonic()
    report = IntegrityReport(out=str(out), handins=len(facts), found=sum(f.found for f in facts),
                             paths_given=bool(paths), common=common or default_common(len(facts)),
                             notes=notes + found_notes, base=base.files)
    report.wrong_checks, report.weight_digests = _wrong_checks(results)
    if paths:
        report.not_found = [f"{f.student} ({f.source or 'no hand-in'}): {f.problem}" for f in facts
                            if not f.found and f.problem and f.status != "invalid"]
    report.pairs, report.commons = find_pairs(facts, report.common, base)
    paired = time.monotonic()
    report.seconds = round(paired - started, 2)
    report.made_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_report(report, out)
    refresh_integrity(out)   # the staff report's count of pairs and its link
    report.timings = {"read": round(read - started, 3), "pairs": round(paired - read, 3),
                      "write": round(time.monotonic() - paired, 3)}
    return report


def integrity_command(args) -> int:
    try:
        report = run_integrity(args.out, args.paths, rubric_path=args.rubric, common=args.common,
                               base_files=args.base or ())
    except (IntegrityError, RubricError) as e:
        print(f"integrity: {e}", file=sys.stderr)
        return 2
    read = f"{report.found} read from the hand-ins given" if args.paths else "no hand-ins given"
    print(f"compared {report.handins} graded hand-in(s) ({read}) in "
          f"{report.seconds:g} s: {len(report.pairs)} pair(s) for a person to compare, {report.strong} strong")
    print(f"wrote {report.out}/integrity.csv and {report.out}/integrity.md (evidence to weigh, never a verdict)")
    if report.not_found:
        print(f"{len(report.not_found)} hand-in(s) named in {report.out} were not read (their .log, .err and code "
              f"were not compared): " + "; ".join(report.not_found[:5])
              + (" ..." if len(report.not_found) > 5 else ""), file=sys.stderr)
    if not args.paths:
        print("no PATH given: only what grading.json holds was compared; give the hand-ins graded into "
              f"{report.out} to compare their logs and code too", file=sys.stderr)
    return 0
