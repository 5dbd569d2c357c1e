"""`python -m grader gradebook` and `python -m grader diff`: final grades, and what a regrade moved.

    python -m grader gradebook OUT --policy POLICY.yaml [-o FINAL.csv] [--keep-stale-overrides]
                               [--lms canvas:EXPORTED.csv | moodle:WORKSHEET.csv ...] [--assignment NAME]
    python -m grader diff OLD_OUT NEW_OUT

`gradebook` reads the results in OUT (it never runs code) and the policy, and writes the final
gradebook (default OUT/final.csv), every grade computed again on every call, and OUT/report.html
again with the final grades and late days; with `--lms`, the
file to import into the LMS beside it. Exit status 2 when the policy, a file it names or OUT
cannot be used (the message says what to change). `diff` exits 1 when any score went down.
"""

import sys
from pathlib import Path

from grader.analytics.page import write_report
from grader.grades.book import GradebookError, book_csv, final_gradebook, load_results
from grader.grades.diff import diff_outs, diff_text
from grader.grades.lms import LmsError, fill
from grader.grades.policy import PolicyError, load_policy
from grader.grades.sources import read_roster, read_submissions
from grader.kit import atomic_write

ROUTINE = ("late", "extension", "no_time")   # flags that need no one's attention by themselves


def make_gradebook(out, policy_path, output=None, keep_stale: bool = False, lms=(), assignment: str = None):
    """Compute the final gradebook of `out` under the policy and write it (and the LMS files);
    return (Book, the path written, [grader.grades.lms.Filled])."""
    policy = load_policy(policy_path)
    results = load_results(out)
    roster = read_roster(policy.roster) if policy.roster else None
    book = final_gradebook(results, policy, read_submissions(policy.submissions), roster, keep_stale)
    output = Path(output) if output else Path(out) / "final.csv"
    atomic_write(output, book_csv(book))
    write_report(out, book.rows)   # report.html again, with the final grades and late days
    return book, output, [fill(spec, book, output, assignment) for spec in lms or ()]


def gradebook_command(args) -> int:
    try:
        book, output, filled = make_gradebook(args.out, args.policy, args.output, args.keep_stale_overrides,
                                              args.lms, args.assignment)
    except (PolicyError, GradebookError, LmsError) as e:
        print(f"gradebook: {e}", file=sys.stderr)
        return 2
    graded = sum(r.final is not None for r in book.rows)
    counts = {}
    for r in book.rows:
        for flag in r.flags:
            counts[flag.split(":")[0]] = counts.get(flag.split(":")[0], 0) + 1
    print(f"wrote {output}: {len(book.rows)} students, {graded} with a final grade"
          + "".join(f"; {flag} {n}" for flag, n in sorted(counts.items())))
    print(f"wrote {Path(args.out) / 'report.html'} again, with the final grades and late days")
    look = [r for r in book.rows if r.notes or [f for f in r.flags if f.split(":")[0] not in ROUTINE]]
    if look:
        print("for a person to look at:")
        for r in look:
            print(f"  {r.student}: {';'.join(r.flags) or '-'}" + "".join(f"\n    {n}" for n in r.notes))
    for f in filled:
        print(f"wrote {f.written}: {f.filled} grade(s) in '{f.column}' ({f.lms}); import it into the LMS")
        for line in f.kept:
            print(f"  left as it was: {line}")
        for student in f.not_in_export:
            print(f"  not in the {f.lms} file: {student}")
    return 0


def diff_command(args) -> int:
    try:
        moved = diff_outs(args.old, args.new)
    except GradebookError as e:
        print(f"diff: {e}", file=sys.stderr)
        return 2
    print(diff_text(moved), end="")
    lowered = [m.handin for m in moved if m.lowered]
    if lowered:
        print(f"diff: {len(lowered)} score(s) went down: {', '.join(lowered)}", file=sys.stderr)
        return 1
    return 0
