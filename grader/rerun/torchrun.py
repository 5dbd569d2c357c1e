"""The cold executor: `torchrun --standalone` per world, every rank importing torch again.

Kept as the baseline of the throughput benchmark (`make bench`). No namespaces: each rank is a
torchrun child running grader.rerun.zygote's `--torchrun-rank`, with the per-rank limits only; the
supervision (grader.rerun.supervise) runs here, in the grader's own process, and serves the parts'
data over a FIFO per rank. A sandboxed run refuses it (SandboxUnavailable).
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from grader import kit
from grader.limits import Limits
from grader.rerun.wire import protocol, secret
from grader.rerun.executor import ENTRY, Counted
from grader.rerun.startup import SandboxUnavailable, child_env, refusal
from grader.rerun.wire.protocol import WorldJob, WorldReport
from grader.rerun.world import write_code


class TorchrunExecutor(Counted):
    """No namespaces: each rank is its own torchrun child. Only the per-rank limits apply."""
    name = "torchrun"
    isolation = {"mode": "off", "sandbox": "none", "processes": "process group", "network": "NOT isolated",
                 "files": "NOT isolated", "user": "the grader's own user",
                 "limits": ("per process: data past what it holds at its fork (RLIMIT_DATA), file size, CPU time; "
                            "1 compute thread, no GPU"),
                 "memory": "NOT held as a world: each rank's own data limit only",
                 "tasks": "RLIMIT_NPROC at the user's own count plus limits.processes",
                 "problems": ["the torchrun executor runs hand-in code without a sandbox"]}

    def __init__(self, sandbox: str = "auto", limits: Limits = None, key: bytes = None):
        self.sandbox = sandbox
        self.key = key or secret.new_key()

    def start(self) -> dict:
        if self.sandbox == "auto":
            raise SandboxUnavailable(refusal(["the torchrun executor (the benchmark's baseline) has no sandbox"]))
        return self.isolation

    def _run_world(self, job: WorldJob) -> WorldReport:
        from grader.rerun import ending, supervise
        work = job.work_dir
        job = dataclasses.replace(job, code_dir=write_code(job, os.path.join(work, "code")))
        world_size = job.world_size
        fifos = [os.path.join(work, f"rank{r}.fifo") for r in range(world_size)]
        data_fifos = [os.path.join(work, f"rank{r}.data") for r in range(world_size)]
        for path in fifos + data_fifos:
            os.mkfifo(path, 0o600)
        # Opened for reading and writing, a FIFO never blocks the opener; the rank reads its end.
        orders = {r: os.open(path, os.O_RDWR | os.O_NONBLOCK) for r, path in enumerate(data_fifos)}
        job_file = os.path.join(work, "job.json")
        with open(job_file, "w") as f:
            json.dump(protocol.encode(job), f)
        log_path = os.path.join(work, "torchrun.out")
        torchrun = str(Path(sys.executable).with_name("torchrun"))
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([torchrun, "--standalone", "--nnodes=1", f"--nproc_per_node={world_size}",
                                     "-m", ENTRY, "--torchrun-rank", job_file],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=child_env(), cwd=str(kit.ROOT), start_new_session=True)
        # A FIFO opened without blocking reads nothing, and no end of file, until its rank opens it.
        fds = {r: os.open(path, os.O_RDONLY | os.O_NONBLOCK) for r, path in enumerate(fifos)}

        def output():   # the tail only: what the ranks wrote is capped (limits.file_mb), never read whole
            return {0: ending.read_ends(log_path, 0, ending.OUTPUT_TAIL).decode("utf-8", "replace")}
        return supervise.supervise(job, fds, orders, [proc.pid], proc.pid, supervise.draw_secrets(job, self.key),
                                   collect_output=output, launcher_exited=lambda: proc.poll() is not None)

    def close(self):
        pass
