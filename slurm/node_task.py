"""What runs on each node of a submitit job: one torchrun for that node's ranks.

submitit starts one task per node (through srun on Slurm, as a subprocess with --local), and
each task calls a `NodeTask`. It starts torchrun for its node as a subprocess, exactly as the
sbatch job's srun line does: every node's torchrun meets the others at a c10d rendezvous on the
first node of the job, and torchrun starts the node's ranks. (submitit's
TorchDistributedEnvironment is not used: it is for ranks that srun starts itself, one task per
rank, while here torchrun starts them.)

The task leaves, in the job's submitit folder:
    rendezvous       host:port of the rendezvous, chosen by node 0 (a free port there)
    node<k>.out      stdout of node k's torchrun; node 0's begins with the [Job] header
    node<k>.status   "<exit status> <host> <end time>" of torchrun on node k, once it has ended
    time-limit       present when Slurm warned the job that its time limit is near
Its stderr is submitit's per-task error file. slurm/launch.py turns these into the
<name>-<jobid>.log and .err that the sbatch job leaves.

This module uses only the standard library and submitit, and is pickled by value, so that a
node can run it without importing the kit.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

RENDEZVOUS_WAIT_S = 300   # how long nodes other than node 0 wait for node 0 to choose the port


class TorchrunFailed(RuntimeError):
    """torchrun on one node ended with a non-zero status: a rank crashed, or was killed."""


def run_id(cluster: str, job_id: str) -> str:
    """The id that names a run's files: the Slurm job id, or local-<id> for a local run."""
    return str(job_id) if cluster == "slurm" else f"local-{job_id}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _rendezvous(job_dir: Path, node: int, host: str) -> str:
    """host:port every node's torchrun meets at: node 0 picks a free port and writes it down."""
    path = job_dir / "rendezvous"
    if node == 0:
        tmp = job_dir / f".rendezvous.{os.getpid()}"
        tmp.write_text(f"{host}:{_free_port()}\n")
        tmp.rename(path)
    deadline = time.monotonic() + RENDEZVOUS_WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"node {node}: node 0 did not write {path} in {RENDEZVOUS_WAIT_S} s; "
                               f"is {job_dir} on a file system every node shares?")
        time.sleep(0.5)
    return path.read_text().strip()


def _detect_backend(nproc: int) -> str:
    import torch
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc else "gloo"


def _child_setup():
    """In the torchrun subprocess: ignore Slurm's time-limit warning signal (its default action
    kills a process), and die with the task if it dies (Linux)."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.signal(signal.SIGURG, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG


def torchrun_command(python: str, nnodes: int, nproc_per_node: int, run: str, endpoint: str, script: str) -> list:
    """The command each node runs: torchrun for its ranks, meeting the other nodes at `endpoint`."""
    return [python, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc_per_node={nproc_per_node}",
            "--max_restarts=0", f"--rdzv_id={run}", "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}", script]


@dataclass(frozen=True)
class NodeTask:
    """Run torchrun for this node; raise TorchrunFailed when it ends with a non-zero status."""

    kit: str                 # the kit's top folder (holds slurm/common.sh); torchrun runs there
    script: str              # absolute path of the script every rank runs
    nproc_per_node: int      # ranks torchrun starts on this node
    backend: str | None      # nccl or gloo, exported to the ranks as A4_BACKEND; None: nccl
                             # when this node has a GPU for every rank, gloo otherwise
    name: str = "assignment4"

    def __call__(self) -> dict:
        import submitit

        env = submitit.JobEnvironment()
        job_dir = env.paths.folder
        node, nnodes = env.node, env.num_nodes
        this_host = socket.gethostname().split(".")[0]
        rid = run_id(env.cluster, env.job_id)

        # submitit would treat the time-limit warning as a request to requeue; just note it.
        def near_time_limit(signum, frame):
            (job_dir / "time-limit").touch()
            sys.stderr.write(f"[node {node}] Slurm: the time limit is near\n")
        signal.signal(getattr(signal, "SIG" + env.USR_SIG), near_time_limit)

        # One machine: torchrun meets itself on localhost. A cluster: the first node, never
        # localhost (each node would form a world of its own and wait forever).
        hosts = [this_host] if env.cluster != "slurm" else list(env.hostnames)
        endpoint = _rendezvous(job_dir, node, "localhost" if env.cluster != "slurm" else hosts[0])

        backend = self.backend or _detect_backend(self.nproc_per_node)
        child_env = dict(os.environ, A4_BACKEND=backend, A4_JOB_NAME=self.name,
                         PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        command = torchrun_command(sys.executable, nnodes, self.nproc_per_node, rid, endpoint, self.script)
        sys.stderr.write(f"[node {node}] {this_host}: rendezvous at {endpoint}, "
                         f"{nnodes} nodes x {self.nproc_per_node} ranks, {backend}\n")
        sys.stderr.flush()

        with open(job_dir / f"node{node}.out", "w") as out:
            if node == 0:
                header = 'source "$0"; a4_job_header "$@"'
                subprocess.run(["bash", "-c", header, str(Path(self.kit) / "slurm" / "common.sh"), rid,
                                ",".join(hosts), str(nnodes), str(self.nproc_per_node), backend],
                               stdout=out, env=child_env, check=True)
                out.flush()
            proc = subprocess.Popen(command, cwd=self.kit, env=child_env, stdout=out,
                                    preexec_fn=_child_setup)
            try:
                status = proc.wait()
            finally:
                if proc.poll() is None:          # the task itself is being stopped
                    proc.terminate()
                    try:
                        proc.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        proc.kill()
        (job_dir / f"node{node}.status").write_text(f"{status} {this_host} {time.time():.3f}\n")
        if status != 0:
            how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
            raise TorchrunFailed(f"torchrun on node {node} ({this_host}) {how}")
        return {"node": node, "host": this_host, "status": status}
