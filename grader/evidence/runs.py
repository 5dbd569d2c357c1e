"""A hand-in's runs: which files are a run's stdout and stderr, found by what they hold, and which
run counts when there are several.

Names vary: the handout's job writes `assignment4-<jobid>.log` and `.err`; Slurm's default is
`slurm-<jobid>.out` with both streams in it; students' job scripts write `%x-%j.out`,
`output_%j.txt`, `.stdout`; a run redirected by hand has no extension at all. So a **stdout** is
any text file with a log's name (`.log`, `.out`, `.txt`, `.stdout`, none) that holds this
assignment's log lines (an init line, a part's line, the job header); a **stderr** is a file
named `.err`, `.error` or `.stderr`, or any other text file that holds what stderr holds (a
traceback, torchrun's or Slurm's lines). A stdout is paired with the stderr of the same name, else
of the same job id (the numbers in their names), else the only one; with none, a stdout that
holds stderr lines, or is not named `.log`, holds both streams (Slurm writes both into one file
unless `--error` names another), and is its own stderr.

Of several runs, the one that counts is the best by, in order: written by the code handed in (its
code sha256; a log that records none is judged by its content), complete (finished, every rank
present), what the rubric asks of a run (`LogRule`), the parts it shows matching, a stderr of its
own, and newest (the larger job id; on disk, the later modification time). `choose` says which
file it took and why, in one note; a hand-in whose one run is named as the handout names it gets
no note. A name never costs a point.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path

from grader.evidence.logfile import parse_log
from grader.evidence.logtext import read_log

SNIFF_BYTES = 1 << 16
STDOUT_SUFFIX = re.compile(r"(\.(log|out|txt|stdout|o\d+))?", re.I)
STDERR_SUFFIX = re.compile(r"\.(err|error|stderr|e\d+)", re.I)
# A run's stdout holds at least one of these (the job header, an init line, a part's line).
RUN_MARKERS = (b"[Job] id=", b"[Distributed Init]", b"Tensors match", b"Not implemented yet", b"] done")
# What stderr holds: a traceback, torchrun's warnings and banner, Slurm's and NCCL's lines.
ERR_MARKERS = (b"Traceback (most recent call last)", b"torch.distributed", b"OMP_NUM_THREADS",
               b"slurmstepd", b"srun: ", b"NCCL WARN", b"Error: ", b"Warning: ")
HANDOUT_NAME = re.compile(r"assignment4-[\w-]+")


@dataclass
class LogRule:
    """What the rubric asks of the run a .log shows (grader.rubric: log_min_world_size, ...)."""
    min_world_size: int = 4
    min_nodes: int = 1
    slurm_job: bool = False


def rule_of(rubric) -> LogRule:
    return LogRule(rubric.log_min_world_size, rubric.log_min_nodes, rubric.log_slurm_job)


def rule_problems(log, rule: LogRule) -> list:
    """Why the run in `log` (a LogReport) is not a run the rubric counts: [(flag, sentence)], [] when it is."""
    problems = []
    if log.world_size is not None and log.world_size < rule.min_world_size:
        problems.append(("log_world_size", f"the run in the log had world size {log.world_size}; the course "
                                           f"asks for at least {rule.min_world_size} ranks"))
    if rule.min_nodes > 1 and (log.nodes or 0) < rule.min_nodes:
        had = f"ran on {log.nodes} node{'s' if log.nodes != 1 else ''}" if log.nodes else "does not show its nodes"
        problems.append(("log_nodes", f"the run in the log {had}; the course asks for at least {rule.min_nodes} "
                                      f"nodes (sbatch slurm/assignment4.sbatch runs on 4)"))
    if rule.slurm_job and not log.slurm:
        job = log.job.get("id", "")
        what = (f"a local run (job id {job}, slurm/run-local.sh)" if job.startswith("local")
                else "not a Slurm job (no Slurm job id and no Slurm node ids: torchrun's output redirected by hand?)")
        problems.append(("log_not_slurm", f"the run in the log is {what}; the course counts only a run of the "
                                          f"Slurm job on the cluster (sbatch slurm/assignment4.sbatch)"))
    return problems


@dataclass
class Run:
    log: Path
    err: Path = None
    report: object = None        # the LogReport of `log`
    newest: tuple = ()
    why_not: str = ""            # why another run was preferred

    @property
    def combined(self) -> bool:
        return self.err is not None and self.err == self.log


@dataclass
class Choice:
    run: Run = None              # None: no run in the hand-in
    others: list = field(default_factory=list)
    note: str = ""               # which file was used and why ("" for the plain case)


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(SNIFF_BYTES)
    except OSError:
        return b""


def _texty(head: bytes) -> bool:
    return bool(head) and b"\0" not in head[:4096]


def is_stdout(path: Path, head: bytes = None) -> bool:
    head = _head(path) if head is None else head
    return (STDOUT_SUFFIX.fullmatch(path.suffix or "") is not None and _texty(head)
            and any(m in head for m in RUN_MARKERS))


def is_stderr(path: Path, head: bytes = None) -> bool:
    head = _head(path) if head is None else head
    if STDERR_SUFFIX.fullmatch(path.suffix or ""):
        return head == b"" or _texty(head)
    return (STDOUT_SUFFIX.fullmatch(path.suffix or "") is not None and _texty(head)
            and not any(m in head for m in RUN_MARKERS) and any(m in head for m in ERR_MARKERS))


def _digits(path: Path) -> tuple:
    return tuple(int(d) for d in re.findall(r"\d+", path.stem))


def modified(path: Path) -> tuple:
    """Newest by modification time, then by name: for runs on disk."""
    return (path.stat().st_mtime, path.name)


def _name_key(path: Path) -> tuple:
    digits = _digits(path)
    return (max(digits) if digits else -1, path.name)


def runs_in(files, newest=_name_key, min_world_size: int = 4, loose: bool = True, code_sha256: str = "") -> list:
    """The runs among `files` (paths), each stdout paired with its stderr, parsed; unordered.
    `loose`: a lone stdout and a lone stderr of other names are one run (in a hand-in; not in a
    folder of the student's, where they may be two jobs' halves). `code_sha256`: a log's parts are
    read from the lines of the run of that code only (parse_log)."""
    heads = {p: _head(p) for p in files}
    stdouts = [p for p in files if is_stdout(p, heads[p])]
    stderrs = [p for p in files if p not in stdouts and is_stderr(p, heads[p])]
    found = []
    for out in stdouts:
        err = next((e for e in stderrs if e.parent == out.parent and e.stem == out.stem), None)
        err = err or next((e for e in stderrs if _digits(e) and _digits(e) == _digits(out)), None)
        if err is None and loose and len(stdouts) == 1 and len(stderrs) == 1:
            err = stderrs[0]
        if err is None and (out.suffix.lower() != ".log" or any(m in heads[out] for m in ERR_MARKERS)):
            err = out
        found.append(Run(log=out, err=err, report=parse_log(read_log(out), min_world_size, code_sha256),
                         newest=newest(out)))
    return found


def _rank(run: Run, code_sha256: str, rule: LogRule) -> tuple:
    log = run.report
    own = 2 if code_sha256 and code_sha256 in log.fingerprints else 0 if log.fingerprints else 1
    broken = {"missing_ranks", "duplicate_ranks", "separate_worlds"} & set(log.flag_codes())
    complete = log.finished and not broken
    parts = sum(1 for e in log.parts.values() if e.passed)
    return (own, complete, not rule_problems(log, rule), parts, run.err is not None, run.newest)


def _why_not(run: Run, best: Run, code_sha256: str, rule: LogRule) -> str:
    """Why `best` was preferred to `run`: the first of _rank's keys in which they differ."""
    mine, theirs = _rank(run, code_sha256, rule), _rank(best, code_sha256, rule)
    at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), len(mine))
    if at == 0:
        return "other code" if run.report.fingerprints else "records no code sha256"
    if at == 1:
        return "did not finish" if not run.report.finished else "ranks missing or repeated"
    if at == 2:
        return rule_problems(run.report, rule)[0][1].split(";")[0].replace("the run in the log ", "")
    return ["fewer parts matching", "no stderr of its own", "older", "the same run again"][min(at - 3, 3)]


def describe(run: Run, code_sha256: str) -> str:
    log, said = run.report, []
    if code_sha256 and code_sha256 in log.fingerprints:
        said.append("a run of this assignment4.py (its code sha256)")
    elif not log.fingerprints:
        said.append("its log records no code sha256")
    else:
        said.append("a run of other code than this assignment4.py")
    if log.finished and log.world_size:
        said.append(f"finished on {log.world_size} rank{'s' if log.world_size != 1 else ''}")
    return ", ".join(said)


def choose(files, code_sha256: str = "", rule: LogRule = None, newest=_name_key, loose: bool = True) -> Choice:
    """The run that counts among `files` (see the module docstring), and the note that says why."""
    rule = rule or LogRule()
    found = runs_in(list(files), newest, rule.min_world_size, loose, code_sha256)
    if not found:
        return Choice()
    found.sort(key=lambda r: _rank(r, code_sha256, rule), reverse=True)
    best, others = found[0], found[1:]
    for other in others:
        other.why_not = _why_not(other, best, code_sha256, rule)
    said = []
    if others:
        said.append(f"of {len(found)} runs, used {best.log.name} ({describe(best, code_sha256)}); left aside: "
                    + ", ".join(f"{o.log.name} ({o.why_not})" for o in others[:4])
                    + (f" and {len(others) - 4} more" if len(others) > 4 else ""))
    elif not HANDOUT_NAME.fullmatch(best.log.stem) or best.log.suffix != ".log":
        said.append(f"used {best.log.name} as the run's log (it holds the run's lines)")
    if best.combined:
        said.append(f"its stderr is in the same file ({best.log.name}), as Slurm writes both streams unless "
                    f"--error names another file")
    elif best.err is not None and best.err.stem != best.log.stem:
        said.append(f"its stderr: {best.err.name}")
    return Choice(run=best, others=others, note="the run's log: " + "; ".join(said) if said else "")
