"""`python -m grader grade`: the batch's command, between the command line and grade_batch."""

import sys

from grader.batch.array import ScaleError
from grader.batch.run import InputError, grade_batch
from grader.names import plain
from grader.rerun.executor import CannotGrade
from grader.rubric import RubricError


def _counts(statuses: dict) -> str:
    """"graded 3, timeout 1": statuses by count, most first."""
    return ", ".join(f"{s} {n}" for s, n in sorted(statuses.items(), key=lambda sn: (-sn[1], sn[0])))


def grade_command(args) -> int:
    """Exit 0: every hand-in graded; 1: some could not be (error, infra_error); 2: the command was
    refused (nothing graded); 3: the batch could not be graded at all (grader.results.ungradable)."""
    try:
        summary = grade_batch(args.paths, args.out, jobs=args.jobs, rubric_path=args.rubric, force=args.force,
                              only=args.only, executor=args.executor, sandbox=args.sandbox,
                              progress=not args.quiet, lms=args.lms,
                              slurm={"partition": args.partition, "array_parallelism": args.array_parallelism,
                                     "chunk": args.chunk, "time_min": args.slurm_time, "mem_gb": args.slurm_mem_gb,
                                     "cluster": None if args.slurm_cluster == "auto" else args.slurm_cluster})
    except (RubricError, ScaleError, CannotGrade) as e:
        print(f"grader: {e}", file=sys.stderr)
        return 2
    except InputError as e:
        for line in str(e).splitlines():
            print(f"grader: {line}", file=sys.stderr)
        print("grader: nothing was graded", file=sys.stderr)
        return 2
    for line in summary.shapes:
        print(f"read {line}")
    for line in summary.strays:
        print(f"not graded, fits no student: {plain(line)}", file=sys.stderr)
    ran = f"; by status: {_counts(summary.ran)}" if summary.ran else ""
    print(f"graded {summary.graded} hand-in(s) and reused {summary.cached} earlier result(s) in {summary.seconds:g} s{ran}")
    print(f"{summary.out} holds {sum(summary.statuses.values())} result(s): {_counts(summary.statuses) or 'none'}")
    print(f"wrote {summary.out}/grades.csv, {summary.out}/summary.md (every result in it) and a folder per "
          f"hand-in in {summary.out}/students/")
    print(f"staff report: {summary.out}/report.html (plots, pass rates per check, diagnoses; numbers in analytics.json)")
    for line in summary.replaced:
        print(f"replaced: {plain(line)}")
    if summary.duplicates:
        print(f"{summary.duplicates} student(s) have several hand-ins (flagged duplicate): see summary.md")
    if summary.ungradable:
        print(f"grader: {summary.ungradable}", file=sys.stderr)
        return 3
    if summary.trouble:
        print(f"{summary.trouble} hand-in(s) could not be graded (error or infra_error): see summary.md",
              file=sys.stderr)
        return 1
    return 0
