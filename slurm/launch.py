"""Submit the assignment from Python with submitit, wait for it, and leave the sbatch job's logs.

    p = plan(profile="slurm/clusters/mycluster.yaml", nodes=4)   # what will run, resolved
    print(sbatch_script(p))                                  # the sbatch script submitit submits
    outcome = run(p)                                         # submit, wait, write .log/.err
    print(outcome.message)

The job is the one slurm/assignment4.sbatch runs: one task per node, each running torchrun for
its node (slurm/node_task.py), all meeting at a c10d rendezvous on the first node. When it ends,
the per-node outputs are joined into <name>-<jobid>.log and <name>-<jobid>.err in `out`, in the
form the sbatch job writes (common.sh's [Job] header and footer), so the grader and the hand-in
treat both alike. `local=True` runs the same world on this machine through submitit's local
executor: one node, with as many ranks as the cluster run would have.
"""

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from enum import Enum
from pathlib import Path

import cloudpickle

# Slurm warns a job near its time limit with submitit's signal, USR2 by default, whose default
# action kills a process: torchrun and its ranks would die early, with a wrong reason. URG is
# ignored unless handled; NodeTask handles it. (Read by submitit when it is imported.)
os.environ.setdefault("SUBMITIT_PREEMPT_SIGNAL", "URG")
import submitit
from submitit.slurm.slurm import SlurmExecutor

from slurm import node_task
from slurm.node_task import NodeTask, run_id
from slurm.profile import ClusterProfile, load_profile

KIT = Path(__file__).resolve().parent.parent
POLL_S = 1.0
LOST_S = 300      # a job neither sacct nor scontrol knows for this long is given up on
# States in which a job may still run; any other state is final.
UNFINISHED = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED",
              "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "READY", "UNKNOWN"}

# The task travels inside the job's pickle, so a node needs neither the kit on its sys.path nor
# this package to run it.
cloudpickle.register_pickle_by_value(node_task)


class LaunchError(RuntimeError):
    """The job could not be submitted (no Slurm, sbatch refused it, bad script path ...)."""


class JobStatus(Enum):
    COMPLETED = "completed"
    RANK_CRASHED = "rank_crashed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass(frozen=True)
class Plan:
    """One run, resolved from the profile and the command line: everything the job needs."""
    profile: ClusterProfile
    nodes: int            # Slurm nodes (1 with local=True)
    nproc_per_node: int   # ranks torchrun starts on each node
    local: bool
    script: Path
    name: str
    folder: Path          # submitit's folder for this job (%j: the job id)
    out: Path             # where <name>-<jobid>.log and .err go
    temporary: bool = False   # `folder` is removed once the logs are collected

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node


@dataclass
class RunOutcome:
    job_id: str
    status: JobStatus
    state: str            # Slurm's final state (sacct), or the local executor's
    message: str
    log: Path | None = None
    err: Path | None = None

    @property
    def ok(self) -> bool:
        return self.status is JobStatus.COMPLETED

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(status=self.status.value, log=self.log and str(self.log), err=self.err and str(self.err))
        return d


def plan(profile=None, nodes=4, gpus_per_node=None, local=False, script="assignment_4/assignment4.py",
         name="assignment4", folder=None, out=".") -> Plan:
    """Resolve one run. `profile`: a YAML file or a name in slurm/clusters/ (None: the defaults of
    slurm/assignment4.sbatch, or with `local` its CPU variant: one rank per node, so the handout's
    4 ranks); `gpus_per_node` overrides the profile's; `local` runs on this machine, one node with
    nodes x nproc_per_node ranks; `folder` is submitit's (None: build/submitit/%j for a Slurm run,
    a temporary folder removed afterwards for a local one); relative paths are from the current folder."""
    if profile is not None:
        prof = load_profile(profile)
    else:
        prof = ClusterProfile(gpus_per_node=0) if local and gpus_per_node is None else ClusterProfile()
    if gpus_per_node is not None:
        if gpus_per_node < 0:
            raise LaunchError(f"--gpus-per-node must be 0 or more, not {gpus_per_node}")
        prof = replace(prof, gpus_per_node=gpus_per_node)
    if nodes < 1:
        raise LaunchError(f"--nodes must be 1 or more, not {nodes}")
    script_path = Path(script).resolve()
    if not script_path.is_file():
        raise LaunchError(f"no such script: {script} (run from the kit's top folder, or give --script)")
    nproc = prof.ranks_per_node
    if local:
        nodes, nproc = 1, nodes * nproc
    if folder is None:
        folder = tempfile.mkdtemp(prefix="a4-submitit-") if local else "build/submitit/%j"
    return Plan(prof, nodes, nproc, local, script_path, name, Path(folder).absolute(), Path(out).absolute(),
                temporary=local and str(folder).startswith(tempfile.gettempdir()))


def slurm_parameters(p: Plan) -> dict:
    """The SlurmExecutor parameters of the run (sbatch's option names, with underscores)."""
    prof = p.profile
    params = dict(job_name=p.name, nodes=p.nodes, ntasks_per_node=1, cpus_per_task=prof.cpus_per_task,
                  time=prof.time_minutes, partition=prof.partition, account=prof.account,
                  gpus_per_node=prof.gpus_per_node or None, setup=list(prof.setup) or None,
                  signal_delay_s=60, additional_parameters=dict(prof.sbatch_options) or None,
                  # srun does not inherit --cpus-per-task on every Slurm version; one crashed
                  # node ends the others at once.
                  srun_args=["--kill-on-bad-exit=1", f"--cpus-per-task={prof.cpus_per_task}"])
    return {k: v for k, v in params.items() if v is not None}


class _ScriptOnlyExecutor(SlurmExecutor):
    """submitit's SlurmExecutor, usable where there is no srun: it only writes the script."""
    @classmethod
    def affinity(cls) -> int:
        return 1


def node_command(p: Plan) -> str:
    """The command every node runs, as a person would type it (for --dry-run): the same function
    builds the one the node really runs."""
    endpoint = "localhost:<a free port>" if p.local else "<first node of the job>:<a free port there>"
    run = "local-<id>" if p.local else "<job id>"
    python = p.profile.python or sys.executable
    command = node_task.torchrun_command(python, p.nodes, p.nproc_per_node, run, endpoint, str(p.script))
    return " ".join(shlex.quote(c) if not c.startswith("--rdzv") else c for c in command)


def dry_run(p: Plan) -> str:
    """What --dry-run prints: the sbatch script (a Slurm run) and the torchrun command of each node."""
    where = f"on each of the {p.nodes} nodes" if not p.local else "on this machine"
    text = "" if p.local else sbatch_script(p) + "\n"
    return (text + f"# {where}, from {KIT} (backend {p.profile.backend if not p.local else 'auto'}, "
            f"{p.world_size} ranks in all):\n{node_command(p)}\n")


def sbatch_script(p: Plan) -> str:
    """The sbatch script submitit submits for this run, by submitit's own code."""
    if p.local:
        raise LaunchError("a local run has no sbatch script")
    ex = _ScriptOnlyExecutor(p.folder, **({"python": p.profile.python} if p.profile.python else {}))
    ex.update_parameters(**slurm_parameters(p))
    return ex._make_submission_file_text(ex._submitit_command_str, "dry-run")


def submit(p: Plan):
    """Submit the run; return the submitit job."""
    # On a cluster the profile says NCCL or gloo; on this machine, NCCL only if its GPUs suffice.
    backend = None if p.local and p.profile.gpus_per_node > 0 else p.profile.backend
    task = NodeTask(kit=str(KIT), script=str(p.script), nproc_per_node=p.nproc_per_node,
                    backend=backend, name=p.name)
    if p.local:
        ex = submitit.AutoExecutor(folder=p.folder, cluster="local")
        ex.update_parameters(name=p.name, nodes=1, tasks_per_node=1, timeout_min=p.profile.time_minutes,
                             gpus_per_node=p.profile.gpus_per_node)
    else:
        try:
            ex = submitit.AutoExecutor(folder=p.folder, cluster="slurm",
                                       **({"slurm_python": p.profile.python} if p.profile.python else {}))
        except RuntimeError as e:
            raise LaunchError(f"no Slurm here ({e}); use --local to run on this machine") from None
        ex.update_parameters(**{f"slurm_{k}": v for k, v in slurm_parameters(p).items()})
    try:
        return ex.submit(task)
    except submitit.core.utils.FailedJobError as e:
        raise LaunchError(f"sbatch refused the job:\n{e}") from None


def job_state(job, local: bool) -> str:
    """The job's state now: sacct's (e.g. RUNNING, TIMEOUT, "CANCELLED by 0"), scontrol's where
    sacct does not know the job (yet, or no accounting), or the local executor's."""
    if local:
        return {"RUNNING": "RUNNING", "INTERRUPTED": "CANCELLED"}.get(job.state, "FINISHED")
    state = job.get_info(mode="force").get("State") or "UNKNOWN"
    if state == "UNKNOWN":
        shown = subprocess.run(["scontrol", "show", "job", "-o", str(job.job_id)], capture_output=True,
                               text=True, timeout=60).stdout
        found = [w.split("=", 1)[1] for w in shown.split() if w.startswith("JobState=")]
        state = found[0] if found else "UNKNOWN"
    return state


def wait(job, local: bool, progress=None, poll_s=POLL_S, lost_s=LOST_S) -> str:
    """Wait until the job is in a final state and return it; `progress(state, seconds)` is called
    on every poll. Slurm's own waiting (sbatch --wait) backs off to long intervals; this does not."""
    start = last_known = time.monotonic()
    while True:
        state = job_state(job, local)
        now = time.monotonic()
        if progress is not None:
            progress(state, now - start)
        if state != "UNKNOWN":
            last_known = now
            if state.split()[0] not in UNFINISHED:
                return state
        elif now - last_known > lost_s:
            return "LOST"      # neither sacct nor scontrol knows the job any more
        time.sleep(poll_s)


def _node_statuses(job_dir: Path, nodes: int) -> list:
    """(torchrun's exit status, host, end time) for each node; None for a node that never got to
    write it (killed with the job)."""
    out = []
    for k in range(nodes):
        f = job_dir / f"node{k}.status"
        if f.is_file():
            status, host, ended = f.read_text().split()
            out.append((int(status), host, float(ended)))
        else:
            out.append(None)
    return out


def first_failure(statuses):
    """(node, (status, host, end time)) of the node whose torchrun failed first by itself, or None.

    A torchrun killed by a signal (srun stopping the others once one failed) comes after any that
    exited with a status of its own."""
    failed = [(k, s) for k, s in enumerate(statuses) if s is not None and s[0] != 0]
    return min(failed, key=lambda ks: (ks[1][0] < 0, ks[1][2]), default=None)


def collect_logs(job, p: Plan, rid: str, statuses, finished: bool):
    """Join the nodes' outputs into <name>-<rid>.log (the [Job] footer when the job ended by
    itself, as the sbatch job writes it) and the tasks' stderr into <name>-<rid>.err."""
    job_dir = job.paths.folder
    p.out.mkdir(parents=True, exist_ok=True)
    log, err = p.out / f"{p.name}-{rid}.log", p.out / f"{p.name}-{rid}.err"
    with open(log, "w") as f:
        for k in range(p.nodes):
            part = job_dir / f"node{k}.out"
            if part.is_file():
                text = part.read_text()
                f.write(text if not text or text.endswith("\n") else text + "\n")
        if finished:
            failed = first_failure(statuses)
            status = failed[1][0] if failed else (0 if None not in statuses else 1)
            f.write(f"[Job] finished status={status} at={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
    with open(err, "w") as f:
        for k in range(p.nodes):
            part = job.task(k).paths.stderr
            if part.is_file():
                f.write(part.read_text())
    return log, err


def outcome(job_id: str, state: str, statuses, timed_out_locally: bool) -> tuple:
    """(JobStatus, message) for a job that ended in `state` with these per-node statuses."""
    word = state.split()[0]
    crashed = first_failure(statuses)
    if word == "TIMEOUT" or (timed_out_locally and None in statuses):
        return JobStatus.TIMED_OUT, (f"job {job_id} timed out: it reached its time limit ({state}); "
                                     "raise `time` in the profile if the run needs longer")
    if word == "CANCELLED":
        return JobStatus.CANCELLED, f"job {job_id} was cancelled ({state})"
    if crashed:
        k, (s, host, _) = crashed
        how = f"was killed by signal {-s}" if s < 0 else f"exited with status {s}"
        return JobStatus.RANK_CRASHED, (f"job {job_id} failed: a rank crashed; torchrun on node {k} ({host}) {how} "
                                        f"(Slurm state {state})")
    if word in ("COMPLETED", "FINISHED") and statuses and None not in statuses:
        return JobStatus.COMPLETED, f"job {job_id} completed"
    if word == "OUT_OF_MEMORY":
        return JobStatus.FAILED, f"job {job_id} ran out of memory ({state})"
    if word == "LOST":
        return JobStatus.FAILED, f"job {job_id}: Slurm lost track of it (neither sacct nor scontrol knows it)"
    return JobStatus.FAILED, f"job {job_id} failed ({state})"


def run(p: Plan, progress=None) -> RunOutcome:
    """Submit, wait (cancelling the job on Ctrl-C), collect the logs, and say how it ended.
    `progress(job_id, state, seconds)` is called while the job waits and runs."""
    job = submit(p)
    rid = run_id("local" if p.local else "slurm", job.job_id)
    try:
        state = wait(job, p.local, progress and (lambda state, seconds: progress(rid, state, seconds)))
    except KeyboardInterrupt:
        job.cancel(check=False)
        raise
    job_dir = job.paths.folder
    statuses = _node_statuses(job_dir, p.nodes)
    status, message = outcome(rid, state, statuses, p.local and (job_dir / "time-limit").exists())
    finished = status not in (JobStatus.TIMED_OUT, JobStatus.CANCELLED)
    log, err = collect_logs(job, p, rid, statuses, finished)
    if p.temporary:
        shutil.rmtree(p.folder, ignore_errors=True)
    return RunOutcome(rid, status, state, f"{message}; logs: {log} and {err}", log, err)


def progress_printer(stream=sys.stderr):
    """A progress callback: one line rewritten in place on a terminal, one line per change otherwise."""
    last = [None]
    tty = stream.isatty()

    def show(job_id, state, seconds):
        minutes, secs = divmod(int(seconds), 60)
        shown = "SUBMITTED" if state == "UNKNOWN" else state     # not in the accounting yet
        line = f"[submit] job {job_id}: {shown} ({minutes}:{secs:02d})"
        if tty:
            done = state.split()[0] not in UNFINISHED
            stream.write("\r" + line.ljust(60) + ("\n" if done else ""))
        elif state != last[0]:
            stream.write(line + "\n")
        stream.flush()
        last[0] = state
    return show
