"""Package a hand-in: the zip a student uploads, holding exactly the files the grader expects.

    python -m grader package [PATH] [--log FILE] [--err FILE] [-o ZIP] [--partial]

PATH is the folder that holds `assignment4.py` (default: `assignment_4/` when there is one, else
the current folder) or the file itself. `utils.py` is taken from beside it, or from the folder
above (where the reference solution finds it). Without `--log`, the run is taken from PATH's
folder or the current folder, where Slurm and `slurm/run-local.sh` leave them: its stdout and
stderr are found by what they hold, whatever their names (`assignment4-<id>.log` and `.err`,
Slurm's `slurm-<id>.out` with both streams in one file, `output_<id>.txt` ...), and of several
runs the best is taken (grader.evidence.runs: a run of this very code, complete, what the public
rubric asks of a run, newest among equals); `Sources.note` says which and why. `--log FILE` names
the run's stdout, whatever its name; its stderr is the file of the same name or job id beside it,
or the file itself when it holds both streams.

The zip holds `assignment4.py`, `utils.py` and the run's files at its top level. It is refused,
with a PackageError that says what to do, when there is no `assignment4.py`, no `utils.py`, no
run, a `.log` without its `.err`, a run that did not finish, or a run of other code than the file
being zipped (the code sha256 its log records). The CLI then checks the zip with
`grader.student.check`, as the graders will grade it.

A run that crashed or hung is partial work: `--partial` hands it in as it is. The parts its log
shows matching on every rank earn their log points, and the grader re-runs every part, as it
does for every hand-in. Either way the message says once what did not finish (the ranks that
never printed "done", the job's status, what the .err says) and names the command that made
the run, as its log shows it (`made_by`): `slurm/run-local.sh`, the Slurm job, or torchrun by hand.
"""

import hashlib
import io
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from grader import kit
from grader.evidence import runs as run_logs
from grader.evidence.logfile import parse_log
from grader.evidence.errfile import parse_err
from grader.evidence.logtext import LogReport, ranks_text, read_log
from grader.rubric import load_public_rubric

DEFAULT_FOLDER = Path("assignment_4")
DEFAULT_ZIP = Path("assignment4-handin.zip")
SLURM_JOB = "sbatch slurm/assignment4.sbatch"
RUN_FIRST = ("run the job first (sbatch slurm/assignment4.sbatch on the cluster; slurm/run-local.sh "
             "tries it on this machine)")


# What the .err says that names the failure, in order of what to tell first (grader.evidence.errfile).
ERR_REASONS = ("python_error", "collective_timeout", "oom", "slurm_time_limit", "slurm_node_fail", "slurm_cancelled",
               "nccl_error")
LOCAL_ID = re.compile(r"local-\d{8}-\d{6}")   # slurm/run-local.sh's job ids; slurm.submit's are local-<n>


class PackageError(ValueError):
    """What is to be zipped is not a hand-in yet; the message names the file and what to do."""


def show(path: Path) -> str:
    """`path` as the user would type it: relative to the current folder when it is inside it."""
    path = Path(path)
    try:
        shown = str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        shown = str(path)
    return shown + ("/" if path.is_dir() and not shown.endswith("/") else "")


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass
class Sources:
    """The files one hand-in is made of, as found on disk (None: not found)."""
    code: Path
    utils: Path = None
    log: Path = None
    err: Path = None
    searched: list = field(default_factory=list)   # the folders searched for the newest run
    note: str = ""                                  # which run was taken, and why (several, or an odd name)

    def members(self) -> dict:
        """Name in the zip -> file on disk, for the files that were found."""
        named = {"assignment4.py": self.code, "utils.py": self.utils}
        for path in (self.log, self.err):
            if path is not None:
                named[path.name] = path
        return {name: path for name, path in named.items() if path is not None}


@dataclass
class Packaged:
    """A hand-in zip that was written."""
    zip: Path
    sources: Sources
    members: list                 # the names in the zip, in order
    job: dict = field(default_factory=dict)   # the [Job] fields of the run's .log
    world_size: int = None        # of the run in the .log
    command: str = ""             # what made the run (made_by)
    unfinished: str = ""          # what did not finish, for a run handed in with --partial ("" when it finished)
    matched: list = field(default_factory=list)   # the parts the .log shows matching on every rank


def find_code(path=None) -> Path:
    """The assignment4.py at `path` (a folder or the file); see the module docstring for the default."""
    if path is None:
        path = DEFAULT_FOLDER if DEFAULT_FOLDER.is_dir() else Path(".")
    path = Path(path)
    if path.is_file():
        if path.name != "assignment4.py":
            raise PackageError(f"{show(path)} is not assignment4.py: give the folder that holds your "
                               f"assignment4.py, or that file")
        return path
    if not path.is_dir():
        raise PackageError(f"{show(path)}: no such file or folder; give the folder that holds your "
                           f"assignment4.py (the default is assignment_4/ in the kit's top folder)")
    code = path / "assignment4.py"
    if not code.is_file():
        raise PackageError(f"{show(path)} has no assignment4.py in it: give the folder that holds your "
                           f"assignment4.py (python -m grader package assignment_4), or run this "
                           f"from the kit's top folder")
    return code


def find_utils(code: Path):
    for folder in (code.parent, code.parent.parent):
        if (folder / "utils.py").is_file():
            return folder / "utils.py"
    return None


def _files(folders) -> list:
    return list({p.resolve(): p for folder in folders for p in Path(folder).iterdir() if p.is_file()}.values())


def runs(folders) -> list:
    """The stdout files of runs in `folders`, newest first (by modification time, then by name)."""
    found = [p for p in _files(folders) if run_logs.is_stdout(p)]
    return sorted(found, key=run_logs.modified, reverse=True)


def public_rule() -> run_logs.LogRule:
    """What the public rubric asks of a run (world size; nodes and a Slurm job where the course asks)."""
    try:
        return run_logs.rule_of(load_public_rubric())
    except (OSError, ValueError):
        return run_logs.LogRule()


def _given(path, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise PackageError(f"{show(path)}: no such file; give the {what} the job wrote")
    return path


def collect(path=None, log=None, err=None, rule=None) -> Sources:
    """Find the files of the hand-in at `path`: the code, utils.py and the best run (or those given)."""
    code = find_code(path)
    sources = Sources(code=code, utils=find_utils(code))
    digest = sha256_of(code)
    if log is not None:
        given = _given(log, "log (the job's stdout)")
        siblings = [p for p in _files([given.parent]) if p.resolve() != given.resolve() and run_logs.is_stderr(p)]
        found = run_logs.runs_in([given] + siblings, loose=False)
        run = next((r for r in found if r.log == given), None)
        sources.log, sources.err = given, run.err if run is not None else None
    else:
        folders = [code.parent]
        if Path(".").resolve() != code.parent.resolve():
            folders.append(Path("."))
        sources.searched = folders
        choice = run_logs.choose(_files(folders), digest, rule or public_rule(), run_logs.modified, loose=False)
        if choice.run is not None:
            sources.log, sources.err, sources.note = choice.run.log, choice.run.err, choice.note
    if err is not None:
        sources.err = _given(err, ".err")
    return sources


def made_by(report: LogReport) -> str:
    """The command that made the run in `report`, as its log shows it: slurm/run-local.sh's job id
    is local-<date>-<time>, `python -m slurm.submit --local`'s local-<n>, a Slurm job's its number."""
    job = report.job.get("id", "")
    if LOCAL_ID.fullmatch(job):
        return "slurm/run-local.sh"
    if job.startswith("local"):
        return "python -m slurm.submit --local"
    if report.slurm:
        return SLURM_JOB
    return "torchrun --standalone --nproc_per_node=4 assignment_4/assignment4.py, by hand"


def run_again(command: str) -> str:
    return f"run it again with this code ({command}) and package again"


def why_unfinished(report: LogReport, err: Path = None) -> str:
    """What did not finish, said once: the ranks that never printed "done", the job's footer or
    status, and what the run's .err says went wrong."""
    ws, done = report.world_size, set(report.done_ranks)
    silent = [r for r in range(ws or 0) if r not in done]
    why = [] if ws and not silent else [f"{ranks_text(silent)} never printed 'done'"] if done else \
        ["no rank printed 'done'" if ws else "no rank started"]
    if report.job.get("id") and "status" not in report.job:
        why.append("the job's footer is missing (stopped at its time limit, or cancelled?)")
    elif report.job.get("status", "0") != "0":
        why.append(f"the job ended with status {report.job['status']}")
    if err is not None:
        flags = {f.code: f.message for f in parse_err(read_log(err)).flags}
        said = [flags[code] for code in ERR_REASONS if code in flags][:2]
        if said:
            why.append(f"{show(err)} says: " + " ".join(said))
    return "; ".join(why)


def refuse_unless_ready(sources: Sources, partial: bool = False) -> tuple:
    """Raise a PackageError unless `sources` make a hand-in; return (the parsed .log, what did not
    finish: "" for a complete run, which `partial` allows to be unfinished)."""
    code = show(sources.code)
    if sources.utils is None:
        raise PackageError(f"no utils.py beside {code}: copy the provided utils.py from the kit next to it")
    if sources.log is None:
        where = " or ".join(show(f) for f in sources.searched)
        raise PackageError(f"no log of a run in {where} (no file holds a run's lines): {RUN_FIRST}, then "
                           f"package again; or give the job's stdout with --log FILE")
    log = show(sources.log)
    report = parse_log(read_log(sources.log))
    again = run_again(made_by(report))
    if sources.err is None:
        raise PackageError(f"{log} has no .err beside it ({sources.log.with_suffix('.err').name}): hand in "
                           f"the .err the same job wrote (give it with --err FILE), or {again}")
    digest = sha256_of(sources.code)
    if report.fingerprints and digest not in report.fingerprints:
        raise PackageError(f"{log} was written by other code than {code} (the log's code sha256 "
                           f"{report.fingerprints[-1][:12]}..., the file's {digest[:12]}...): the file "
                           f"changed after that run; {again}")
    if report.finished:
        return report, ""
    why = why_unfinished(report, sources.err)
    if not report.init_ranks:
        flags = " ".join(f.message for f in report.flags if f.code in ("empty", "binary", "no_init_lines"))
        raise PackageError(f"{log}: the run never started ({why}). {flags} Fix it and {again}")
    if not partial:
        raise PackageError(f"{log}: the run did not finish: {why}. Fix it and {again}; or, to hand in the work "
                           f"as it is, package with --partial: the parts the log shows finished earn their log "
                           f"points, and the grader re-runs every part")
    return report, why


def zip_bytes(sources: Sources) -> bytes:
    """The hand-in zip of `sources` (whatever was found), every file at the top level."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for name, path in sources.members().items():
            z.write(path, name)
    return buffer.getvalue()


def write_zip(data: bytes, out: Path) -> None:
    """Write `data` to `out` whole or not at all."""
    kit.atomic_write(out, data)


def package(path=None, log=None, err=None, out=None, partial: bool = False) -> Packaged:
    """Write the hand-in zip of the code at `path` and its run; see the module docstring. With
    `partial`, a run that did not finish is handed in as it is."""
    out = Path(out) if out is not None else DEFAULT_ZIP
    if out.suffix.lower() != ".zip":
        raise PackageError(f"{out}: a hand-in is a .zip file; give -o NAME.zip")
    sources = collect(path, log, err)
    report, unfinished = refuse_unless_ready(sources, partial)
    data = zip_bytes(sources)
    write_zip(data, out)
    return Packaged(zip=out, sources=sources, members=list(sources.members()), job=dict(report.job),
                    world_size=report.world_size, command=made_by(report), unfinished=unfinished,
                    matched=[p for p, ev in report.parts.items() if ev.passed])
