"""Command line: parses arguments and calls the plain functions that do the work.

    python -m grader skeleton [--check]
"""

import argparse
import sys

from grader import skeleton


def _skeleton(args) -> int:
    if args.check:
        if skeleton.skeleton_is_current():
            print(f"{skeleton.SKELETON.relative_to(skeleton.ROOT)} is generated from the reference: up to date")
            return 0
        print(f"{skeleton.SKELETON.relative_to(skeleton.ROOT)} differs from what the reference generates; "
              f"run `python -m grader skeleton` (or `make skeleton`) and commit the result", file=sys.stderr)
        return 1
    changed = skeleton.write_skeleton()
    state = "written" if changed else "already up to date"
    print(f"{skeleton.SKELETON.relative_to(skeleton.ROOT)} {state}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser("skeleton", help="generate assignment_4/assignment4.py from the reference")
    p.add_argument("--check", action="store_true", help="only check that the committed skeleton is current")
    p.set_defaults(run=_skeleton)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)
