"""Command line: parses arguments and calls the plain functions that do the work.

    python -m grader grade PATH... --out DIR [--jobs N] [--rubric FILE] [--force] [--only ID ...]
    python -m grader gradescope [--submission DIR] [--results FILE]
    python -m grader gradescope-bundle [-o ZIP] [--rubric FILE]
    python -m grader skeleton [--check]
    python -m grader release --out DIR
    python -m grader check [PATH] [--log FILE] [--err FILE]            (the student tools: see
    python -m grader package [PATH] [--log FILE] [--err FILE] [-o ZIP]  grader/student_cli.py)
"""

import argparse
import sys

from grader import gradescope, skeleton, student_cli
from grader.executor import EXECUTORS
from grader.rubric import RubricError
from grader.scale import ScaleError


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


def _grade(args) -> int:
    from grader.batch import grade_batch
    try:
        summary = grade_batch(args.paths, args.out, jobs=args.jobs, rubric_path=args.rubric, force=args.force,
                              only=args.only, executor=args.executor, sandbox=args.sandbox,
                              progress=not args.quiet,
                              slurm={"partition": args.partition, "array_parallelism": args.array_parallelism,
                                     "chunk": args.chunk, "time_min": args.slurm_time, "mem_gb": args.slurm_mem_gb,
                                     "cluster": None if args.slurm_cluster == "auto" else args.slurm_cluster})
    except (RubricError, ScaleError) as e:
        print(f"grader: {e}", file=sys.stderr)
        return 2
    counts = ", ".join(f"{s} {n}" for s, n in sorted(summary.statuses.items())) or "no hand-ins found"
    print(f"graded {summary.graded} hand-in(s) and reused {summary.cached} earlier result(s) "
          f"in {summary.seconds:g} s; by status: {counts}")
    print(f"wrote {summary.out}/grades.csv, {summary.out}/summary.md and a folder per student")
    if summary.trouble:
        print(f"{summary.trouble} hand-in(s) could not be graded (error or infra_error): see summary.md",
              file=sys.stderr)
        return 1
    return 0


def _gradescope_bundle(args) -> int:
    from grader.release import build_bundle
    try:
        path = build_bundle(args.output, args.rubric)
    except RubricError as e:
        print(f"grader: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}: upload it as the autograder of a Gradescope programming assignment")
    return 0


def _release(args) -> int:
    from grader.release import ReleaseError, build_release
    try:
        summary = build_release(args.out)
    except (ReleaseError, RubricError) as e:
        print(f"release: refused: {e}", file=sys.stderr)
        return 2
    print(f"wrote the student release to {summary.out}: {len(summary.files)} files "
          f"(grader modules: {', '.join(summary.modules)})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser("grade", help="grade a folder of hand-in zips")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="hand-in zips, folders of zips, a zip of zips (LMS bulk download) or unpacked folders")
    p.add_argument("--out", required=True, metavar="DIR", help="where grades.csv, summary.md and per-student folders go")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="hand-ins graded at once (default 1)")
    p.add_argument("--rubric", metavar="FILE", help="rubric YAML (default grader/rubric.yaml)")
    p.add_argument("--force", action="store_true", help="grade again even hand-ins already graded in DIR")
    p.add_argument("--only", nargs="+", metavar="ID", help="grade only these student ids")
    p.add_argument("--executor", choices=EXECUTORS + ("slurm",), default="warm",
                   help="warm: fork ranks from a process that imported torch once (default); "
                        "torchrun: torchrun per world (slow, the baseline); slurm: a job array, each "
                        "task grading a chunk of hand-ins on its node (DIR on a shared file system)")
    slurm = p.add_argument_group("with --executor slurm")
    slurm.add_argument("--partition", help="Slurm partition of the array tasks")
    slurm.add_argument("--array-parallelism", type=int, default=16, metavar="K", help="tasks running at once (16)")
    slurm.add_argument("--chunk", type=int, default=10, metavar="N", help="hand-ins per task (10)")
    slurm.add_argument("--slurm-time", type=int, metavar="MIN", help="time limit of a task (default from --chunk)")
    slurm.add_argument("--slurm-mem-gb", type=int, metavar="GB",
                       help="memory of a task (default: the partition's; a task needs about jobs x 4 GB)")
    slurm.add_argument("--slurm-cluster", choices=("auto", "slurm", "local"), default="auto",
                       help="local: run the array on this machine through submitit's local executor")
    p.add_argument("--sandbox", choices=("auto", "strict", "off"), default="auto",
                   help="auto: every isolation layer this machine allows (default); strict: all of them "
                        "or infra_error; off: resource limits only")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_grade)

    p = commands.add_parser("gradescope", help="grade one submission inside Gradescope's autograder")
    gradescope.add_arguments(p)
    p.set_defaults(run=gradescope.run)

    p = commands.add_parser("gradescope-bundle", help="build the autograder zip for Gradescope")
    p.add_argument("-o", "--output", default="autograder.zip", metavar="ZIP")
    p.add_argument("--rubric", metavar="FILE", help="rubric YAML to bundle (default grader/rubric.yaml)")
    p.set_defaults(run=_gradescope_bundle)

    p = commands.add_parser("skeleton", help="generate assignment_4/assignment4.py from the reference")
    p.add_argument("--check", action="store_true", help="only check that the committed skeleton is current")
    p.set_defaults(run=_skeleton)

    p = commands.add_parser("release", help="write the tree students receive: skeleton, utils, handout, "
                                            "Slurm jobs, check and package")
    p.add_argument("--out", required=True, metavar="DIR", help="a new or empty folder")
    p.set_defaults(run=_release)

    student_cli.add_commands(commands)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)
