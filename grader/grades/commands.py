"""`python -m grader gradebook` and `python -m grader diff`: final grades, and what a regrade moved.

    python -m grader gradebook OUT --policy POLICY.yaml [-o FINAL.csv] [--keep-stale-overrides]
                               [--lms LMS:FILE ...] [--assignment NAME] [--feedback]
                               [--canvas ASSIGNMENT_URL [--canvas-token TOKEN]] [--allow-infra-error]
    python -m grader diff OLD_OUT NEW_OUT

`gradebook` reads the results in OUT (it never runs code) and the policy, and writes the final
gradebook (default OUT/final.csv), every grade computed again on every call, and OUT/report.html
again with the final grades and late days; with `--lms`, each LMS's import beside the final
gradebook, named by it (grader.grades.lms.imports: FINAL-canvas-import.csv ...; an earlier file of
that name with other content is kept under its time, and said); with `--feedback`,
OUT/feedback-upload/ for each LMS's bulk upload of feedback (grader.grades.feedback), every file
headed by the grade its LMS shows. Submission times come from the policy's files, the LMS files
given (Moodle's worksheet, Gradescope's grades) and, with `--canvas`, Canvas's API. Students
without a submission time are listed first when the policy has a deadline.

A batch with `infra_error` results (the grading machine failed: not the students') writes no LMS
file unless `--allow-infra-error` (then their cells are left as they were): the refusal says the
cause in one line. Exit status: 0; 1 when the final gradebook was written but some hand-ins are
`infra_error` (grade them again); 2 when the policy, a file it names, an LMS file or OUT cannot be
used, or the LMS files were refused (the message says what to change). `diff` exits 1 when any
score went down.
"""

import os
import sys
from collections import Counter
from pathlib import Path

from grader.analytics.page import write_report
from grader.grades.book import GradebookError, book_csv, final_gradebook, load_results
from grader.grades.diff import diff_outs, diff_text
from grader.grades.feedback import counted, part_lines, write_uploads
from grader.grades.lms import imports
from grader.grades.lms.canvas import TOKEN_ENV, api_times
from grader.grades.lms.sheet import LmsError
from grader.grades.policy import PolicyError, load_policy
from grader.grades.sources import read_roster, read_submissions
from grader.kit import atomic_write
from grader.lmss import LMSS
from grader.names import plain

ROUTINE = ("late", "extension", "no_time")   # flags that need no one's attention by themselves
ALLOW = "--allow-infra-error"
ALLOW_NO_TIME = "--allow-no-time"

NO_TIME = ("a submission time: the policy's `submissions:` (a CSV student,submitted_at[,source], Gradescope's "
           "submission_metadata.json, or Canvas's submissions page saved from the browser), "
           + " or ".join(f"`--lms {lms.name}:{lms.export}`" for lms in LMSS.values() if lms.times) + ", or "
           f"`--canvas ASSIGNMENT_URL` with {TOKEN_ENV}; Gradescope's export and Blackboard's attempts carry "
           "theirs when graded from the download; Canvas's download carries only its LATE marker")


class Refused(GradebookError):
    """LMS files asked of a batch the grading machine could not grade; the message says the cause."""


CAUSE_CHARS = 1200   # the most of a cause a refusal quotes (grader.results.ungradable quotes as much)


def infra_cause(results: list) -> str:
    """The infra_error results' cause, in one line ("" when there are none): the canary's (the
    reference is wrong, the rubric's limits are too small for it, or the machine cannot run a world)
    with its fix, or the machinery's."""
    broken = [r for r in results if r.get("status") == "infra_error"]
    if not broken:
        return ""
    messages = Counter(" ".join(plain(r.get("message") or "").split()) for r in broken)
    cause, _ = messages.most_common(1)[0]
    cause = cause.removeprefix("not graded: ").removesuffix("; grade it again") or "no message"
    if len(cause) > CAUSE_CHARS:   # cut between words, never inside one
        cause = cause[:CAUSE_CHARS].rsplit(" ", 1)[0] + " ..."
    return f"{len(broken)} of {len(results)} hand-in(s) were not graded, through no fault of the students: {cause}"


def _times(policy, lms, canvas, token) -> list:
    submissions = read_submissions(policy.submissions) + imports.times(lms, policy.deadline.tzinfo)
    return submissions + (api_times(canvas, token or os.environ.get(TOKEN_ENV, "")) if canvas else [])


def untimed(book) -> list:
    """The students with a grade but no submission time: the deadline could not be held against them."""
    return [r.student for r in book.rows if "no_time" in r.flags and r.final is not None]


def _no_time_refusal(students: list) -> str:
    shown = ", ".join(students[:20]) + (" ..." if len(students) > 20 else "")
    return (f"no LMS file written: {len(students)} student(s) with a grade have no submission time, so the "
            f"deadline could not be held against them and their grades would go out without a late penalty "
            f"({shown}). Give {NO_TIME}; or give {ALLOW_NO_TIME} to write the LMS files with those grades unpenalised")


def make_gradebook(out, policy_path, output=None, keep_stale: bool = False, lms=(), assignment: str = None,
                   feedback: bool = False, canvas: str = None, canvas_token: str = None, allow_infra: bool = False,
                   allow_no_time: bool = False):
    """Compute the final gradebook of `out` under the policy and write it (and the LMS files, and
    with `feedback` the feedback uploads); return (Book, the path written, [grader.grades.lms.sheet.Filled],
    grader.grades.feedback.Uploads or None). Refused (nothing written) when LMS files are asked of
    a batch with infra_error results, unless `allow_infra`, or with graded students whose submission
    time is unknown (the policy always has a deadline), unless `allow_no_time`."""
    policy = load_policy(policy_path)
    results = load_results(out)
    specs = imports.parse(lms)
    cause = infra_cause(results)
    if cause and (specs or feedback) and not allow_infra:
        raise Refused(f"no LMS file written: {cause}. Grade them again (python -m grader grade ... --out {out}), "
                      f"or give {ALLOW} to write the LMS files with their cells left as they are")
    roster = read_roster(policy.roster) if policy.roster else None
    book = final_gradebook(results, policy, _times(policy, lms, canvas, canvas_token), roster, keep_stale)
    if untimed(book) and (specs or feedback) and not allow_no_time:
        raise Refused(_no_time_refusal(untimed(book)))
    output = Path(output) if output else Path(out) / "final.csv"
    atomic_write(output, book_csv(book))
    write_report(out, book.rows)   # report.html again, with the final grades and late days
    chosen = counted(book, results)
    details = {s: part_lines(r) for s, r in chosen.items()} if feedback else None
    filled = [imports.fill(name, path, book, output, assignment, details) for name, path in specs]
    for f in filled:   # a batch of several LMSs' downloads: each file misses only its own students
        f.not_in_export = [s for s in f.not_in_export if (chosen[s].get("download") or {}).get("lms", "")
                           in ("", f.lms)] if len(specs) > 1 else f.not_in_export
    uploads = write_uploads(out, book, results, {f.lms: f for f in filled}) if feedback else None
    return book, output, filled, uploads


def _report(book, output, out) -> None:
    graded = sum(r.final is not None for r in book.rows)
    counts = Counter(flag.split(":")[0] for r in book.rows for flag in r.flags)
    print(f"wrote {output}: {len(book.rows)} students, {graded} with a final grade"
          + "".join(f"; {flag} {n}" for flag, n in sorted(counts.items())))
    print(f"wrote {Path(out) / 'report.html'} again, with the final grades and late days")
    untimed = [r for r in book.rows if "no_time" in r.flags]
    look = [r for r in book.rows if r not in untimed and (r.notes or [f for f in r.flags
                                                                      if f.split(":")[0] not in ROUTINE])]
    if untimed or look:
        print("for a person to look at:")
    if untimed:
        print(f"  {len(untimed)} student(s) have no submission time, so no late penalty could be computed for "
              f"them: {', '.join(r.student for r in untimed[:20])}{' ...' if len(untimed) > 20 else ''}")
        print(f"    give {NO_TIME}")
    for r in untimed + look:
        said = ";".join(r.flags) or (f"final grade {r.final:g}" if r.final is not None else "no final grade")
        print(f"  {r.student}: {said}" + "".join(f"\n    {n}" for n in r.notes))


def _report_files(filled, uploads) -> None:
    """Each file written, with its LMS's one sentence of what to do with it (docs/tas.md's table)."""
    for f in filled:
        print(f"wrote {f.written}: {f.filled} grade(s) in '{f.column}' ({f.lms}); {LMSS[f.lms].grades_go}")
        if f.earlier:
            print(f"  kept the earlier file of that name as {f.earlier}")
        for line in f.notes + [f"left as it was: {k}" for k in f.kept] + [f"not in the {f.lms} file: {s}"
                                                                            for s in f.not_in_export]:
            print(f"  {line}")
    if uploads is not None:
        for lms, path in uploads.written.items():
            print(f"wrote {path}: {uploads.counts[lms]} feedback file(s); {LMSS[lms].feedback_goes}")
        for line in uploads.notes + [f"no feedback file for the LMS: {line}" for line in uploads.left_out]:
            print(f"  {line}")


def gradebook_command(args) -> int:
    try:
        book, output, filled, uploads = make_gradebook(
            args.out, args.policy, args.output, args.keep_stale_overrides, args.lms, args.assignment, args.feedback,
            args.canvas, args.canvas_token, args.allow_infra_error, args.allow_no_time)
    except (PolicyError, GradebookError, LmsError) as e:
        print(f"gradebook: {e}", file=sys.stderr)
        return 2
    cause = infra_cause(load_results(args.out))
    if cause:
        print(f"gradebook: {cause}; grade them again", file=sys.stderr)
    _report(book, output, args.out)
    _report_files(filled, uploads)
    return 1 if cause else 0


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
