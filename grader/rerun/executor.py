"""Where re-run worlds run.

- `warm` (the default): a long-lived helper process, the zygote, imports torch once and nothing
  of any hand-in or of the reference; every world's ranks are forked from it, so a world costs a
  fork and a gloo rendezvous instead of `world_size` Python start-ups. Each world is a fresh set
  of processes: nothing a hand-in does survives into the next one.
- `torchrun`: `torchrun --standalone` per world, every rank importing torch again: the cold path,
  kept as the baseline of the throughput benchmark.

Both run the same rank code (grader.rerun.worker) and the same supervision
(grader.rerun.supervise), and return the same WorldReport. One executor runs one world at a time; `--jobs N` makes N of them.
"""

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from grader import kit
from grader.rerun import channel, protocol
from grader.rerun.protocol import WorldJob, WorldReport
from grader.rerun.world import infra_report

EXECUTORS = ("warm", "torchrun")   # and "slurm": grader.batch.array spreads hand-ins over a job array
ENTRY = "grader.rerun.zygote"      # the module both executors start: the zygote, or a torchrun rank


def world_budget(job: WorldJob) -> float:
    """The longest a world may take before its executor is presumed stuck."""
    return job.timeouts.world_start + job.timeouts.part * len(job.parts) + 30.0


# The only variables of the grader's environment that reach the processes running hand-ins.
PASSED_ON = ("PATH", "LANG", "LC_ALL", "TMPDIR", "GLOO_SOCKET_IFNAME", "A4_SANDBOX_DISABLE")


def _child_env() -> dict:
    """A minimal environment: nothing of a TA's (tokens, say) is ever in a re-run's process tree."""
    env = {k: os.environ[k] for k in PASSED_ON if k in os.environ}
    env.update(OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(kit.ROOT), HOME="/tmp")
    return env


class Counted:
    """Counts the worlds an executor ran and the seconds they took, as seen from the grader."""
    worlds = 0
    world_seconds = 0.0

    def run_world(self, job: dict) -> dict:
        started = time.monotonic()
        try:
            return self._run_world(job)
        finally:
            self.worlds += 1
            self.world_seconds += time.monotonic() - started


class WarmExecutor(Counted):
    name = "warm"

    def __init__(self, sandbox: str = "auto"):
        self.sandbox = sandbox
        self.isolation = {}
        self._proc = None
        self._reader = None

    def _start(self):
        self._proc = subprocess.Popen([sys.executable, "-m", ENTRY, "--zygote", self.sandbox],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, env=_child_env(), cwd=str(kit.ROOT),
                                      start_new_session=True)
        self._reader = channel.Reader()
        hello = self._receive(time.monotonic() + 120, protocol.Hello)
        if hello is None:
            self._kill()
            raise RuntimeError("the re-run helper process did not start")
        self.isolation = hello.isolation

    def _receive(self, deadline, kind):
        """The next message from the zygote if it is a `kind`, else None (it exited, sent something
        else or garbage, or took too long)."""
        out = self._proc.stdout.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            readable, _, _ = select.select([out], [], [], left)
            if not readable:
                continue
            data = os.read(out, 1 << 20)
            if not data:
                return None
            try:
                messages = self._reader.feed(data)
                if messages:
                    return protocol.decode(messages[0], (kind,))
            except channel.ChannelError:
                return None

    def _kill(self):
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._proc.wait()
            self._proc = None

    def _run_world(self, job: WorldJob) -> WorldReport:
        if self._proc is None or self._proc.poll() is not None:
            try:
                self._start()
            except (OSError, RuntimeError) as e:
                return infra_report(job, f"the re-run helper process could not start ({e})")
        try:
            # Two messages: the zygote forks on the first and only the world's own process reads the job.
            protocol.send(self._proc.stdin.fileno(), protocol.WorldRequest())
            protocol.send(self._proc.stdin.fileno(), job)
        except OSError as e:
            self._kill()
            return infra_report(job, f"the re-run helper process is gone ({e})")
        report = self._receive(time.monotonic() + world_budget(job), WorldReport)
        if report is None:
            self._kill()
            return infra_report(job, "the re-run helper process stopped answering")
        return report

    def close(self):
        if self._proc is not None and self._proc.poll() is None:
            try:
                protocol.send(self._proc.stdin.fileno(), protocol.Exit())
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()


class TorchrunExecutor(Counted):
    """No namespaces: each rank is its own torchrun child. Only the per-rank limits apply."""
    name = "torchrun"
    isolation = {"mode": "torchrun", "processes": "process group", "network": "NOT isolated",
                 "files": "NOT isolated", "user": "the grader's own user",
                 "limits": "address space, processes, file size, CPU time, 1 thread per rank", "problems": []}

    def __init__(self, sandbox: str = "auto"):
        self.sandbox = sandbox

    def _run_world(self, job: WorldJob) -> WorldReport:
        from grader.rerun import supervise
        work = job.work_dir
        world_size = job.world_size
        fifos = [os.path.join(work, f"rank{r}.fifo") for r in range(world_size)]
        for path in fifos:
            os.mkfifo(path, 0o600)
        job_file = os.path.join(work, "job.json")
        with open(job_file, "w") as f:
            json.dump(protocol.encode(job), f)
        log_path = os.path.join(work, "torchrun.out")
        torchrun = str(Path(sys.executable).with_name("torchrun"))
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([torchrun, "--standalone", "--nnodes=1", f"--nproc_per_node={world_size}",
                                     "-m", ENTRY, "--torchrun-rank", job_file],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=_child_env(), cwd=str(kit.ROOT), start_new_session=True)
        # A FIFO opened without blocking reads nothing, and no end of file, until its rank opens it.
        fds = {r: os.open(path, os.O_RDONLY | os.O_NONBLOCK) for r, path in enumerate(fifos)}

        def output():
            with open(log_path, "rb") as f:
                return {0: f.read()[-supervise.OUTPUT_TAIL:].decode("utf-8", "replace")}
        return supervise.supervise(job, fds, [proc.pid], proc.pid, collect_output=output,
                               launcher_exited=lambda: proc.poll() is not None)

    def close(self):
        pass


def make_executor(name: str, sandbox: str = "auto"):
    if name == "warm":
        return WarmExecutor(sandbox)
    if name == "torchrun":
        return TorchrunExecutor(sandbox)
    raise ValueError(f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")
