"""Command line: parses arguments and hands them to the command's room, imported only then.

COMMANDS below is the one list of commands: `python -m grader --help` (and `a4 --help`) lists
every one the parser holds, grouped by who runs it (READERS); `python -m grader COMMAND --help`
gives a command's options. A tree that lacks a command's room (the student release, the Gradescope
bundle) does not offer it. Nothing here imports torch: `--help` and `skeleton` start at once.
"""

import argparse
import importlib
import os
import sys
import traceback
from pathlib import Path

from grader import kit, lmss
from grader.limits import JOBS_RULE, slurm_task

HERE = Path(__file__).resolve().parent
DESCRIPTION = "Assignment 4's grader and student tools: the commands this copy of the kit holds, and who runs them, are below."
EXECUTOR_CHOICES = ("warm", "torchrun", "slurm")   # grader.rerun.executors.EXECUTORS and the job array
PATH_HELP = ("the folder with your assignment4.py (default: assignment_4/, else the current folder), "
             "or the file itself")
LOG_HELP = ("the run's stdout, whatever its name (.log, Slurm's slurm-<id>.out, .txt ...; default: the best run "
            "in PATH's folder or the current folder)")
ERR_HELP = "the run's stderr (default: the one beside the stdout, or the stdout itself when it holds both)"
# Where a Python without torch is sent: the kit's install page, else the student release's README
# (the release ships no docs/). tests/test_docs.py holds each heading to exist.
INSTALL_GUIDES = (("docs/install.md", "Install"), ("README.md", "Set up, once"))


def install_guide() -> str:
    """The first guide of INSTALL_GUIDES this tree holds, as `path, "heading"`."""
    path, heading = next((g for g in INSTALL_GUIDES if (kit.ROOT / g[0]).is_file()), INSTALL_GUIDES[0])
    return f'{path}, "{heading}"'


def _handler(target: str):
    """`module:function`, imported when the command runs. A command that finds no torch (at its
    import, or later: check and package import the engine only once they re-run code) says so."""
    def run(args):
        module, function = target.split(":")
        try:
            return getattr(importlib.import_module(module), function)(args)
        except ModuleNotFoundError as e:
            if e.name != "torch":
                raise
            print(f"grader: `{args.command}` re-runs code and needs torch, which this Python "
                  f"({sys.version.split()[0]}, {sys.executable}) does not have: install the kit's "
                  f"requirements ({install_guide()}) into it, or use the Python that has them. "
                  f"Commands that only read results (gradebook, diff, integrity, public-rubric) run without it.",
                  file=sys.stderr)
            return 2
        except (ImportError, RuntimeError, OSError, MemoryError) as e:
            if not any(f.filename.endswith(f"torch{os.sep}__init__.py") for f in traceback.extract_tb(e.__traceback__)):
                raise
            print(f"grader: `{args.command}` needs torch, and this Python could not import it "
                  f"({type(e).__name__}: {e}){_address_space_hint()}", file=sys.stderr)
            return 2
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
                   help=f"an LMS download ({lmss.titles()}; zipped or unzipped), a folder "
                        "of hand-in zips (or that folder zipped), hand-in zips or unpacked hand-in folders")
    p.add_argument("--lms", choices=tuple(lmss.LMSS),
                   help="the LMS the download comes from (default: recognised from its file names)")
    p.add_argument("--out", required=True, metavar="DIR", help="where grades.csv, summary.md and per-student folders go")
    p.add_argument("--jobs", type=int, default=kit.JOBS, metavar="N",
                   help=f"hand-ins graded at once: here (default: as many as the machine holds, "
                        f"grader.limits.default_jobs: {JOBS_RULE}; the choice and why are printed at the start), "
                        f"or in each array task (default {kit.TASK_JOBS})")
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
    task = slurm_task(kit.ARRAY_CHUNK, kit.TASK_JOBS)
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
    p.add_argument("--check", action="store_true",
                   help="only check that the committed skeleton and the handout's points are current")


def _release_arguments(p) -> None:
    p.add_argument("--out", required=True, metavar="DIR", help="a new or empty folder")
    p.add_argument("--replace", action="store_true",
                   help="DIR may hold an earlier release: it is replaced once the new one is complete")
    p.add_argument("--lab-answers", action="store_true",
                   help="ship the lecture's lab whole, with its files that answer the assignment's TODOs (by "
                        "default they are left out; the release names them either way)")


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
    p.add_argument("--partial", action="store_true",
                   help="hand in a run that crashed or hung as it is: the parts its log shows finished earn "
                        "their log points, and the grader re-runs every part")


def _gradebook_arguments(p) -> None:
    p.add_argument("out", metavar="OUT", help="the --out folder of python -m grader grade")
    p.add_argument("--policy", required=True, metavar="POLICY.yaml",
                   help="deadline, late penalty, extensions, overrides, submission times, roster")
    p.add_argument("-o", "--output", metavar="FINAL.csv", help="the final gradebook (default OUT/final.csv)")
    p.add_argument("--keep-stale-overrides", action="store_true",
                   help="apply overrides made for other bytes than the hand-in graded now (flagged override_stale)")
    p.add_argument("--lms", action="append", metavar="LMS:FILE",
                   help=f"fill the final grades into the file the LMS exported: {lmss.specs()}; "
                        "writes FINAL-<lms>-import.csv beside the final gradebook "
                        "(FINAL: -o's name), keeping an earlier one of that name under its time")
    p.add_argument("--assignment", metavar="NAME",
                   help=" and ".join(lms.title for lms in lmss.LMSS.values() if lms.per_assignment)
                   + ": the assignment column to fill (part of its name)")
    p.add_argument("--feedback", action="store_true",
                   help="also write OUT/feedback-upload/: each LMS's feedback files, headed by the "
                        "grade that LMS shows; with --lms LMS:FILE, the feedback column of that file too where it "
                        "has one (docs/tas.md says each LMS's way)")
    p.add_argument("--canvas", metavar="ASSIGNMENT_URL",
                   help="read the submission times from Canvas's API: the assignment page's address "
                        "(https://CANVAS/courses/N/assignments/M); the token from CANVAS_API_TOKEN or --canvas-token")
    p.add_argument("--canvas-token", metavar="TOKEN",
                   help="Canvas API token (Account > Settings > New Access Token); prefer CANVAS_API_TOKEN, "
                        "which stays out of the shell's history")
    p.add_argument("--allow-infra-error", action="store_true",
                   help="write the LMS files even though some hand-ins are infra_error (their cells left as "
                        "they were); without it such a batch gets none")
    p.add_argument("--allow-no-time", action="store_true",
                   help="write the LMS files even though some graded students have no submission time (their "
                        "grades without a late penalty); without it, give the times first")


def _diff_arguments(p) -> None:
    p.add_argument("old", metavar="OLD_OUT", help="the results before the regrade")
    p.add_argument("new", metavar="NEW_OUT", help="the results after it")


def _integrity_arguments(p) -> None:
    p.add_argument("out", metavar="OUT", help="the folder `grade --out` wrote (its grading.json files; nothing is re-run)")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="the hand-ins given to `grade`, to compare their .log, .err and code too")
    p.add_argument("--common", type=int, metavar="N",
                   help="evidence shared by more than N hand-ins is common, counted but not listed "
                        "(default: 2%% of the hand-ins, at least 5; code weighs by how few hold it, nothing past "
                        "the larger of N and 5%% of the hand-ins)")
    p.add_argument("--rubric", metavar="FILE", help="the rubric given to `grade` (for its student id pattern)")
    p.add_argument("--base", action="append", metavar="FILE",
                   help="code the students were given besides the kit's skeleton (e.g. a course's own handout "
                        "code): what a hand-in shares with it counts for nothing; repeat for several files")


# command: (room, handler, arguments, help, description)
COMMANDS = {
    "grade": ("batch", "grader.batch.commands:grade_command", _grade_arguments,
              "grade an LMS download, a folder of hand-ins or hand-in zips", None),
    "gradebook": ("grades", "grader.grades.commands:gradebook_command", _gradebook_arguments,
                  "the final gradebook: autograde results, late policy, extensions, overrides, roster, LMS file",
                  "Compute every final grade from the graded results in OUT and the course policy (never "
                  "re-running code), and write the final gradebook and, with --lms, the file to import."),
    "diff": ("grades", "grader.grades.commands:diff_command", _diff_arguments,
             "what a regrade moved: scores and part statuses, old and new; exit 1 when a score went down", None),
    "doctor": ("pipeline", "grader.pipeline.doctor:doctor_command", _doctor_arguments,
               "run the reference here as grade would: which layers hold, what bounds a world, why not, and "
               "whether its answers are right", None),
    "gradescope": ("gradescope", "grader.gradescope.run:run", _gradescope_arguments,
                   "grade one submission inside Gradescope's autograder", None),
    "gradescope-bundle": ("gradescope", "grader.gradescope.bundle:bundle_command", _bundle_arguments,
                          "build the autograder zip for Gradescope", None),
    "skeleton": ("instructor", "grader.instructor.commands:skeleton_command", _skeleton_arguments,
                 "generate assignment_4/assignment4.py from the reference, and the handout's points from the rubric",
                 None),
    "release": ("instructor", "grader.instructor.commands:release_command", _release_arguments,
                "write the tree students receive: skeleton, utils, handout, Slurm jobs, check and package",
                "Write the tree students receive into a new folder, the handout's points written from the "
                "rubric, after checking that the skeleton is current, that the reference, the rubric's default "
                "check and the handout state one configuration, that no points are stated elsewhere, and that "
                "no file leaks the solution, a hidden check or the lab's answers; a refusal names every place."),
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
                "this exact code, newest among equals), refusing a run that ran other code, or that did not "
                "finish unless --partial hands it in as partial work; then check the zip."),
    "integrity": ("integrity", "grader.integrity.commands:integrity_command", _integrity_arguments,
                  "list the pairs of graded hand-ins a person should compare",
                  "Read a graded batch (and its hand-ins) for evidence only this grader has: the same run, the "
                  "same wrong weights, the same code beyond the skeleton, the same code sha256. Writes "
                  "OUT/integrity.csv and OUT/integrity.md: evidence for a person to weigh, never a verdict."),
}


# Who runs each room's commands: `--help` lists the commands in these groups, in this order.
READERS = {"batch": "TAs", "grades": "TAs", "integrity": "TAs", "pipeline": "TAs",
           "instructor": "instructors", "gradescope": "Gradescope's autograder", "student": "students"}


def available() -> list:
    """The commands whose room this tree holds."""
    return [name for name, (room, *_) in COMMANDS.items() if (HERE / room / "__init__.py").is_file()]


def program_name(argv0: str = None) -> str:
    """What the user typed to run the kit, for usage lines: `a4` for the console script (whatever
    it is called, on whatever path), `python -m grader` for the module."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    name = Path(argv0).name
    if not name or name in ("__main__.py", "-c") or name.endswith(".py"):
        return "python -m grader"
    return name


def _by_reader(names: list) -> str:
    """`--help`'s closing lines: the commands this tree offers, grouped by who runs them."""
    groups = {}
    for name in names:
        groups.setdefault(READERS[COMMANDS[name][0]], []).append(name)
    order = list(dict.fromkeys(READERS.values()))
    lines = [f"  {reader + ':':25} {', '.join(groups[reader])}" for reader in order if reader in groups]
    return "commands by who runs them (COMMAND --help gives each one's options):\n" + "\n".join(lines)


def build_parser(prog: str = None) -> argparse.ArgumentParser:
    names = available()
    parser = argparse.ArgumentParser(prog=prog or program_name(), epilog=_by_reader(names), description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in names:
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
