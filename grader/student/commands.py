"""The student tools' commands: check your work, then package your hand-in.

    python -m grader check [PATH] [--log FILE] [--err FILE]
    python -m grader package [PATH] [--log FILE] [--err FILE] [-o ZIP] [--partial]

Run them from the kit's top folder. Exit status: 0 when every public check passes; 1 when
something does not (`package` has then still written the zip); 2 when there is nothing to check
or the hand-in cannot be packaged (the message says what to do).
"""

import sys

from grader.parts import BY_ID
from grader.rerun.executors import prelaunched
from grader.rubric import RubricError


def check_command(args) -> int:
    with prelaunched("best"):   # the re-runs' helper imports torch while this process does (check's executor)
        return _check(args)


def _check(args) -> int:
    from grader.student.check import CheckError, check, format_report
    try:
        report = check(args.path, log=args.log, err=args.err)
    except (CheckError, RubricError) as e:
        print(f"check: {e}", file=sys.stderr)
        return 2
    print(format_report(report), end="")
    return 0 if report.passed else 1


def package_command(args) -> int:
    with prelaunched("best"):
        return _package(args)


def _package(args) -> int:
    from grader.student.package import PackageError, package, show
    from grader.student.check import CheckError, check, format_report
    try:
        done = package(args.path, log=args.log, err=args.err, out=args.output, partial=args.partial)
    except PackageError as e:
        print(f"package: refused: {e}", file=sys.stderr)
        return 2
    run, src = done.job.get("id") or done.sources.log.stem, done.sources
    files = (f"{show(src.log)} (stdout and stderr in one file)" if src.err == src.log
             else f"{show(src.log)} and {show(src.err)}")
    state = "did not finish" if done.unfinished else "finished"
    print(f"code:  {show(src.code)}\nutils: {show(src.utils)}\n"
          f"run:   {files} (job {run}, world size {done.world_size}, {state}, made by {done.command}, written by "
          f"this very assignment4.py)")
    if src.note:
        print(f"       {src.note}")
    if done.unfinished:
        matched = ", ".join(BY_ID[p].title.split(":")[0] for p in done.matched) or "no part"
        print(f"       what did not finish: {done.unfinished}\n"
              f"       handed in as partial work (--partial): the log shows {matched} matching on every rank, "
              f"which earn{'s' if len(done.matched) == 1 else ''} log points; the grader re-runs every part")
    print(f"wrote {show(done.zip)}: {', '.join(done.members)}\n")
    try:
        report = check(done.zip)
    except (CheckError, RubricError) as e:
        print(f"package: the zip was written but could not be checked: {e}", file=sys.stderr)
        return 2
    print(format_report(report), end="")
    if report.passed:
        print(f"\n{show(done.zip)} is ready to hand in.")
        return 0
    if done.unfinished:
        print(f"\n{show(done.zip)} is written as partial work: hand it in as it is, or fix the run, run it again "
              f"({done.command}) and package again.")
        return 1
    print(f"\n{show(done.zip)} is written, but it does not pass every public check yet (see above).")
    return 1
