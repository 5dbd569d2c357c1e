"""Command line: parses arguments and hands them to the command's room, imported only then.

    python -m grader grade PATH... --out DIR [--lms canvas|moodle|gradescope|blackboard] [--jobs N]
                                   [--rubric FILE] [--force] [--only ID ...]
    python -m grader gradescope [--submission DIR] [--results FILE]
    python -m grader gradescope-bundle [-o ZIP] [--rubric FILE]
    python -m grader skeleton [--check]
    python -m grader release --out DIR [--replace]
    python -m grader public-rubric [--rubric FILE] [-o FILE]
    python -m grader check [PATH] [--log FILE] [--err FILE]
    python -m grader package [PATH] [--log FILE] [--err FILE] [-o ZIP]
    python -m grader integrity OUT [PATH...] [--common N] [--rubric FILE]

A tree that lacks a command's room (the student release, the Gradescope bundle) does not offer it.
Nothing here imports torch: `--help` and `skeleton` start at once.
"""

import argparse
import importlib
import os
import sys
import traceback
from pathlib import Path

from grader import kit
from grader.limits import slurm_task

HERE = Path(__file__).resolve().parent
EXECUTOR_CHOICES = ("warm", "torchrun", "slurm")   # grader.rerun.executors.EXECUTORS and the job array
PATH_HELP = ("the folder with your assignment4.py (default: assignment_4/, else the current folder), "
             "or the file itself")
LOG_HELP = ("the run's stdout, whatever its name (.log, Slurm's slurm-<id>.out, .txt ...; default: the best run "
            "in PATH's folder or the current folder)")
ERR_HELP = "the run's stderr (default: the one beside the stdout, or the stdout itself when it holds both)"


def _handler(target: str):
    """`module:function`, imported when the command runs."""
    def run(args):
        module, function = target.split(":")
        try:
            imported = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != "torch":
                raise
            print(f"grader: `{args.command}` re-runs code and needs torch, which this Python "
                  f"({sys.version.split()[0]}, {sys.executable}) does not have: install the kit's "
                  f"requirements (README.md, Install) into it, or use the Python that has them. "
                  f"Commands that only read results (gradebook, diff, integrity, public-rubric) run without it.",
                  file=sys.stderr)
            return 2
        except (ImportError, RuntimeError, OSError, MemoryError) as e:
            if not any(f.filename.endswith(f"torch{os.sep}__init__.py") for f in traceback.extract_tb(e.__traceback__)):
                raise
            print(f"grader: `{args.command}` needs torch, and this Python could not import it "
                  f"({type(e).__name__}: {e}){_address_space_hint()}", file=sys.stderr)
            return 2
        return getattr(imported, function)(args)
    return run


def _address_space_hint() -> str:
    """Where `ulimit -v` caps the address space: torch's CUDA build maps about 3 GB at import."""
    import resource
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return ""
    return (f"; `ulimit -v` allows this Python {soft >> 20} MB of address space, and torch's CUDA build maps about "
            f"3 GB at import: raise it (ulimit -v unlimited)")


def _grade_arguments(p) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="an LMS download (Canvas, Moodle, Gradescope, Blackboard; zipped or unzipped), a folder "
                        "of hand-in zips (or that folder zipped), hand-in zips or unpacked hand-in folders")
    p.add_argument("--lms", choices=("canvas", "moodle", "gradescope", "blackboard"),
                   help="the LMS the download comes from (default: recognised from its file names)")
    p.add_argument("--out", required=True, metavar="DIR", help="where grades.csv, summary.md and per-student folders go")
    p.add_argument("--jobs", type=int, default=kit.JOBS, metavar="N",
                   help="hand-ins graded at once: here, or in each array task (default %(default)s)")
    p.add_argument("--rubric", metavar="FILE", help="rubric YAML (default grader/rubric.yaml)")
    p.add_argument("--force", action="store_true", help="grade again even hand-ins already graded in DIR")
    p.add_argument("--only", nargs="+", metavar="ID", help="grade only these student ids")
    p.add_argument("--executor", choices=EXECUTOR_CHOICES, default="warm",
                   help="warm: fork ranks from a process that imported torch once (default); "
                        "torchrun: torchrun per world (slow, the baseline); slurm: a job array, each "
                        "task grading a chunk of hand-ins on its node (DIR on a shared file system)")
    slurm = p.add_argument_group("with --executor slurm")
    slurm.add_argument("--partition", help="Slurm partition of the array tasks")
    slurm.add_argument("--array-parallelism", type=int, default=kit.ARRAY_PARALLELISM, metavar="K",
                       help="tasks running at once (default %(default)s)")
    slurm.add_argument("--chunk", type=int, default=kit.ARRAY_CHUNK, metavar="N", help="hand-ins per task (default %(default)s)")
    task = slurm_task(kit.ARRAY_CHUNK, kit.JOBS)
    slurm.add_argument("--slurm-time", type=int, metavar="MIN",
                       help=f"time limit of a task (default: every hand-in of its chunk may run out the rubric's "
                            f"timeouts.handin, --jobs at once, after the canary; a task asks for {task} with the "
                            f"stock rubric and the default --chunk and --jobs)")
    slurm.add_argument("--slurm-mem-gb", type=int, metavar="GB",
                       help=f"memory of a task (default: --jobs worlds at the rubric's limits.memory_mb, a helper "
                            f"each and the grader: {task.mem_gb} GB with the stock rubric and the default --jobs)")
    slurm.add_argument("--slurm-cluster", choices=("auto", "slurm", "local"), default="auto",
                       help="local: run the array on this machine through submitit's local executor")
    p.add_argument("--sandbox", choices=("auto", "off"), default="auto",
                   help="auto: run hand-in code only inside the sandbox (bubblewrap), and refuse to grade "
                        "where it cannot start (default); off: no sandbox, resource limits only (hand-in "
                        "code runs with your rights and network; results and summary.md say so)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _gradescope_arguments(p) -> None:
    p.add_argument("--submission", default=kit.GRADESCOPE_SUBMISSION, metavar="DIR",
                   help="the student's files (default: Gradescope's %(default)s)")
    p.add_argument("--results", default=kit.GRADESCOPE_RESULTS, metavar="FILE",
                   help="where results.json goes (default: Gradescope's %(default)s)")
    p.add_argument("--metadata", default=kit.GRADESCOPE_METADATA, metavar="FILE",
                   help="Gradescope's submission metadata, for the student's id")
    p.add_argument("--rubric", metavar="FILE", help="rubric YAML (default grader/rubric.yaml)")
    p.add_argument("--protect", action="store_true",
                   help="as root: make the grader's folder and the submission readable to root only "
                        "before hand-in code runs (run_autograder passes it)")


def _doctor_arguments(p) -> None:
    p.add_argument("--sandbox", choices=("auto", "off", "best"), default="auto",
                   help="the mode to try, as grade would (default auto)")
    p.add_argument("--rubric", metavar="FILE", help="rubric YAML whose limits and largest check the world runs "
                                                    "under, as grade's --rubric (default grader/rubric.yaml)")


def _bundle_arguments(p) -> None:
    p.add_argument("-o", "--output", default="autograder.zip", metavar="ZIP", help="the zip to write")
    p.add_argument("--rubric", metavar="FILE", help="rubric YAML to bundle (default grader/rubric.yaml)")


def _skeleton_arguments(p) -> None:
    p.add_argument("--check", action="store_true", help="only check that the committed skeleton is current")


def _release_arguments(p) -> None:
    p.add_argument("--out", required=True, metavar="DIR", help="a new or empty folder")
    p.add_argument("--replace", action="store_true",
                   help="DIR may hold an earlier release: it is replaced once the new one is complete")


def _public_rubric_arguments(p) -> None:
    p.add_argument("--rubric", metavar="FILE", help="rubric YAML read on top of grader/rubric.yaml (as grade's --rubric)")
    p.add_argument("-o", "--output", metavar="FILE", help="write it to FILE (default: print it)")


def _check_arguments(p) -> None:
    p.add_argument("path", nargs="?", metavar="PATH", help=PATH_HELP + "; or the hand-in zip")
    p.add_argument("--log", metavar="FILE", help=LOG_HELP)
    p.add_argument("--err", metavar="FILE", help=ERR_HELP)


def _package_arguments(p) -> None:
    _check_arguments(p)
    p.add_argument("-o", "--output", metavar="ZIP", help="the zip to write (default: assignment4-handin.zip)")


def _gradebook_arguments(p) -> None:
    p.add_argument("out", metavar="OUT", help="the --out folder of python -m grader grade")
    p.add_argument("--policy", required=True, metavar="POLICY.yaml",
                   help="deadline, late penalty, extensions, overrides, submission times, roster")
    p.add_argument("-o", "--output", metavar="FINAL.csv", help="the final gradebook (default OUT/final.csv)")
    p.add_argument("--keep-stale-overrides", action="store_true",
                   help="apply overrides made for other bytes than the hand-in graded now (flagged override_stale)")
    p.add_argument("--lms", action="append", metavar="canvas:FILE|moodle:FILE",
                   help="fill the final grades into Canvas's gradebook export or Moodle's grading worksheet; "
                        "writes FILE's name + -import.csv beside the final gradebook")
    p.add_argument("--assignment", metavar="NAME", help="Canvas: the assignment column to fill (part of its name)")
    p.add_argument("--feedback", action="store_true",
                   help="also write OUT/feedback-upload/: each LMS's zip of feedback files for its bulk upload "
                        "(Moodle's feedback files, Canvas's submission re-upload); with --lms moodle:FILE the "
                        "worksheet's Feedback comments get a short text")


def _diff_arguments(p) -> None:
    p.add_argument("old", metavar="OLD_OUT", help="the results before the regrade")
    p.add_argument("new", metavar="NEW_OUT", help="the results after it")


def _integrity_arguments(p) -> None:
    p.add_argument("out", metavar="OUT", help="the folder `grade --out` wrote (its grading.json files; nothing is re-run)")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="the hand-ins given to `grade`, to compare their .log, .err and code too")
    p.add_argument("--common", type=int, metavar="N",
                   help="evidence shared by more than N hand-ins is common, counted but not listed "
                        "(default: 2%% of the hand-ins, at least 3)")
    p.add_argument("--rubric", metavar="FILE", help="the rubric given to `grade` (for its student id pattern)")


# command: (room, handler, arguments, help, description)
COMMANDS = {
    "grade": ("batch", "grader.batch.commands:grade_command", _grade_arguments,
              "grade a folder of hand-in zips", None),
    "gradebook": ("grades", "grader.grades.commands:gradebook_command", _gradebook_arguments,
                  "the final gradebook: autograde results, late policy, extensions, overrides, roster, LMS file",
                  "Compute every final grade from the graded results in OUT and the course policy (never "
                  "re-running code), and write the final gradebook and, with --lms, the file to import."),
    "diff": ("grades", "grader.grades.commands:diff_command", _diff_arguments,
             "what a regrade moved: scores and part statuses, old and new; exit 1 when a score went down", None),
    "doctor": ("rerun", "grader.rerun.doctor:doctor_command", _doctor_arguments,
               "run one world of the reference here as grade would: which layers hold, what bounds a world, why not", None),
    "gradescope": ("gradescope", "grader.gradescope.run:run", _gradescope_arguments,
                   "grade one submission inside Gradescope's autograder", None),
    "gradescope-bundle": ("gradescope", "grader.gradescope.bundle:bundle_command", _bundle_arguments,
                          "build the autograder zip for Gradescope", None),
    "skeleton": ("instructor", "grader.instructor.commands:skeleton_command", _skeleton_arguments,
                 "generate assignment_4/assignment4.py from the reference", None),
    "release": ("instructor", "grader.instructor.commands:release_command", _release_arguments,
                "write the tree students receive: skeleton, utils, handout, Slurm jobs, check and package",
                "Write the tree students receive into a new folder, after checking that the skeleton is "
                "current, that the reference, the rubric's default check and the handout state one "
                "configuration, and that no file leaks the solution or a hidden check."),
    "public-rubric": ("instructor", "grader.instructor.commands:public_rubric_command", _public_rubric_arguments,
                      "print the rubric students' check and package use, derived from grader/rubric.yaml",
                      "Print the public rubric: grader/rubric.yaml's public checks, each at its own world size "
                      "and at public_world_sizes, with the same points, tolerance and log requirements and no "
                      "hidden check. The release ships it as grader/rubric-public.yaml."),
    "check": ("student", "grader.student.commands:check_command", _check_arguments,
              "re-run every part at the public checks and check the run's .log",
              "Grade your hand-in as the graders will, at the public checks (grader/rubric-public.yaml): "
              "every part re-run on the CPU at each of them, and the run's .log and .err checked."),
    "package": ("student", "grader.student.commands:package_command", _package_arguments,
                "build the hand-in zip, then check it",
                "Zip assignment4.py, utils.py and the best run's .log and .err (the most complete run of "
                "this exact code, newest among equals), refusing a run that did not finish or ran other "
                "code; then check the zip."),
    "integrity": ("integrity", "grader.integrity.commands:integrity_command", _integrity_arguments,
                  "list the pairs of graded hand-ins a person should compare",
                  "Read a graded batch (and its hand-ins) for evidence only this grader has: the same run, the "
                  "same wrong weights, the same code beyond the skeleton, the same code sha256. Writes "
                  "OUT/integrity.csv and OUT/integrity.md: evidence for a person to weigh, never a verdict."),
}


def available() -> list:
    """The commands whose room this tree holds."""
    return [name for name, (room, *_) in COMMANDS.items() if (HERE / room / "__init__.py").is_file()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in available():
        room, target, arguments, help_text, description = COMMANDS[name]
        p = commands.add_parser(name, help=help_text, description=description or help_text)
        arguments(p)
        p.set_defaults(run=_handler(target))
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
