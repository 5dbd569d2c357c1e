"""The student tools: check your work, then package your hand-in.

    python -m grader check [PATH] [--log FILE] [--err FILE]
    python -m grader package [PATH] [--log FILE] [--err FILE] [-o ZIP]

Run them from the kit's top folder. Exit status: 0 when every public check passes; 1 when
something does not (`package` has then still written the zip); 2 when there is nothing to check
or the hand-in cannot be packaged (the message says what to do).
"""

import argparse
import sys

from grader.rubric import RubricError

PATH_HELP = ("the folder with your assignment4.py (default: assignment_4/, else the current folder), "
             "or the file itself")
LOG_HELP = "the run's .log (default: the newest in PATH's folder or the current folder)"
ERR_HELP = "the run's .err (default: the one beside the .log)"


def _check(args) -> int:
    from grader.selfcheck import CheckError, check, format_report
    try:
        report = check(args.path, log=args.log, err=args.err)
    except (CheckError, RubricError) as e:
        print(f"check: {e}", file=sys.stderr)
        return 2
    print(format_report(report), end="")
    return 0 if report.passed else 1


def _package(args) -> int:
    from grader.package import PackageError, package, show
    from grader.selfcheck import CheckError, check, format_report
    try:
        done = package(args.path, log=args.log, err=args.err, out=args.output)
    except PackageError as e:
        print(f"package: refused: {e}", file=sys.stderr)
        return 2
    run = done.job.get("id") or done.sources.log.stem
    print(f"code:  {show(done.sources.code)}\nutils: {show(done.sources.utils)}\n"
          f"run:   {show(done.sources.log)} and {show(done.sources.err)} (job {run}, world size "
          f"{done.world_size}, finished, written by this very assignment4.py)")
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


def add_commands(commands) -> None:
    """Add `check` and `package` to the sub-command parsers `commands`."""
    p = commands.add_parser("check", help="re-run every part at the public checks and check the run's .log",
                            description="Grade your hand-in as the graders will, at the public checks: "
                                        "every part re-run on the CPU on 4, 1 and 2 ranks, and the run's "
                                        ".log and .err.")
    p.add_argument("path", nargs="?", metavar="PATH", help=PATH_HELP + "; or the hand-in zip")
    p.add_argument("--log", metavar="FILE", help=LOG_HELP)
    p.add_argument("--err", metavar="FILE", help=ERR_HELP)
    p.set_defaults(run=_check)

    p = commands.add_parser("package", help="build the hand-in zip, then check it",
                            description="Zip assignment4.py, utils.py and the newest run's .log and .err, "
                                        "refusing a run that did not finish or ran other code; then check "
                                        "the zip.")
    p.add_argument("path", nargs="?", metavar="PATH", help=PATH_HELP)
    p.add_argument("--log", metavar="FILE", help=LOG_HELP)
    p.add_argument("--err", metavar="FILE", help=ERR_HELP)
    p.add_argument("-o", "--output", metavar="ZIP", help="the zip to write (default: assignment4-handin.zip)")
    p.set_defaults(run=_package)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)
