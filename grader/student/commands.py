"""The student tools' commands: check your work, then package your hand-in.

    python -m grader check [PATH] [--log FILE] [--err FILE]
    python -m grader package [PATH] [--log FILE] [--err FILE] [-o ZIP]

Run them from the kit's top folder. Exit status: 0 when every public check passes; 1 when
something does not (`package` has then still written the zip); 2 when there is nothing to check
or the hand-in cannot be packaged (the message says what to do).
"""

import sys

from grader.rubric import RubricError


def check_command(args) -> int:
    from grader.student.check import CheckError, check, format_report
    try:
        report = check(args.path, log=args.log, err=args.err)
    except (CheckError, RubricError) as e:
        print(f"check: {e}", file=sys.stderr)
        return 2
    print(format_report(report), end="")
    return 0 if report.passed else 1


def package_command(args) -> int:
    from grader.student.package import PackageError, package, show
    from grader.student.check import CheckError, check, format_report
    try:
        done = package(args.path, log=args.log, err=args.err, out=args.output)
    except PackageError as e:
        print(f"package: refused: {e}", file=sys.stderr)
        return 2
    run, src = done.job.get("id") or done.sources.log.stem, done.sources
    files = (f"{show(src.log)} (stdout and stderr in one file)" if src.err == src.log
             else f"{show(src.log)} and {show(src.err)}")
    print(f"code:  {show(src.code)}\nutils: {show(src.utils)}\n"
          f"run:   {files} (job {run}, world size {done.world_size}, finished, written by this very assignment4.py)")
    if src.note:
        print(f"       {src.note}")
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
    print(f"\n{show(done.zip)} is written, but it does not pass every public check yet (see above).")
    return 1
