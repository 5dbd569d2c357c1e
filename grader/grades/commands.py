"""`python -m grader gradebook` and `python -m grader diff`: final grades, and what a regrade moved.

    python -m grader gradebook OUT --policy POLICY.yaml [-o FINAL.csv] [--keep-stale-overrides]
                               [--lms canvas:EXPORTED.csv | moodle:WORKSHEET.csv ...] [--assignment NAME]
                               [--feedback]
    python -m grader diff OLD_OUT NEW_OUT

`gradebook` reads the results in OUT (it never runs code) and the policy, and writes the final
gradebook (default OUT/final.csv), every grade computed again on every call, and OUT/report.html again with the final grades and
late days; with `--lms`, the
file to import into the LMS beside it (a Moodle worksheet's `Last modified (submission)` gives the
submission times the policy's files do not); with `--feedback`, OUT/feedback-upload/ for the LMS's
bulk upload of feedback files (grader.grades.feedback) and the Moodle worksheet's feedback
comments. Students without a submission time are listed first when the policy has a deadline.
Exit status 2 when the policy, a file it names or OUT cannot be used (the message says what to
change). `diff` exits 1 when any score went down.
"""

import sys
from pathlib import Path

from grader.analytics.page import write_report
from grader.grades.book import GradebookError, book_csv, final_gradebook, load_results
from grader.grades.diff import diff_outs, diff_text
from grader.grades.feedback import short_text, write_uploads
from grader.grades.lms import LmsError, fill, read_moodle_times
from grader.grades.policy import PolicyError, load_policy
from grader.grades.sources import read_roster, read_submissions
from grader.kit import atomic_write

ROUTINE = ("late", "extension", "no_time")   # flags that need no one's attention by themselves


NO_TIME = ("a submission time: the policy's `submissions:` (a CSV student,submitted_at[,source], or "
           "Gradescope's submission_metadata.json), or `--lms moodle:WORKSHEET.csv` (its Last modified "
           "(submission)); Gradescope's export and Blackboard's attempts carry theirs when graded from the "
           "download; Canvas's download carries only its LATE marker")


def _worksheets(lms) -> list:
    return [Path(spec.partition(":")[2]) for spec in lms or () if spec.startswith("moodle:")]


def make_gradebook(out, policy_path, output=None, keep_stale: bool = False, lms=(), assignment: str = None,
                   feedback: bool = False):
    """Compute the final gradebook of `out` under the policy and write it (and the LMS files, and
    with `feedback` the feedback uploads); return (Book, the path written, [grader.grades.lms.Filled],
    grader.grades.feedback.Uploads or None)."""
    policy = load_policy(policy_path)
    results = load_results(out)
    roster = read_roster(policy.roster) if policy.roster else None
    submissions = read_submissions(policy.submissions)
    for worksheet in _worksheets(lms):
        submissions += read_moodle_times(worksheet, policy.deadline.tzinfo)
    book = final_gradebook(results, policy, submissions, roster, keep_stale)
    output = Path(output) if output else Path(out) / "final.csv"
    atomic_write(output, book_csv(book))
    write_report(out, book.rows)   # report.html again, with the final grades and late days
    uploads = write_uploads(out, book, results) if feedback else None
    texts = {row.student: short_text(row, book.max_score) for row in book.rows} if feedback else None
    return book, output, [fill(spec, book, output, assignment, texts) for spec in lms or ()], uploads


def gradebook_command(args) -> int:
    try:
        book, output, filled, uploads = make_gradebook(args.out, args.policy, args.output, args.keep_stale_overrides,
                                                       args.lms, args.assignment, args.feedback)
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
    untimed = [r for r in book.rows if "no_time" in r.flags]
    look = [r for r in book.rows if r not in untimed and (r.notes or [f for f in r.flags
                                                                      if f.split(":")[0] not in ROUTINE])]
    if untimed or look:
        print("for a person to look at:")
    if untimed:
        print(f"  {len(untimed)} student(s) have no submission time, so no late penalty could be computed for "
              f"them: {', '.join(r.student for r in untimed[:20])}{' ...' if len(untimed) > 20 else ''}")
        print(f"    give {NO_TIME}")
        for r in untimed:
            print(f"  {r.student}: {';'.join(r.flags)}" + "".join(f"\n    {n}" for n in r.notes))
    if look:
        for r in look:
            print(f"  {r.student}: {';'.join(r.flags) or '-'}" + "".join(f"\n    {n}" for n in r.notes))
    for f in filled:
        print(f"wrote {f.written}: {f.filled} grade(s) in '{f.column}' ({f.lms}); import it into the LMS")
        for line in f.kept:
            print(f"  left as it was: {line}")
        for student in f.not_in_export:
            print(f"  not in the {f.lms} file: {student}")
    if uploads is not None:
        for lms, path in uploads.written.items():
            print(f"wrote {path}: {uploads.counts[lms]} feedback file(s) for {lms.capitalize()}'s bulk upload")
        for line in uploads.left_out:
            print(f"  no feedback file for the LMS: {line}")
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
