"""Where re-run worlds run.

- `warm` (the default): a long-lived helper process, the zygote, imports torch once and nothing
  of any hand-in or of the reference; every world's ranks are forked from it, so a world costs a
  fork and a gloo rendezvous instead of `world_size` Python start-ups. Each world is a fresh set
  of processes: nothing a hand-in does survives into the next one.
- `torchrun`: `torchrun --standalone` per world, every rank importing torch again: the cold path,
  kept as the baseline of the throughput benchmark.

Both run the same rank code (grader.worker) and the same supervision (grader.world), and return
the same world report. One executor runs one world at a time; `--jobs N` makes N of them.
"""

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from grader import channel

ROOT = Path(__file__).resolve().parent.parent
EXECUTORS = ("warm", "torchrun")


def infra_report(job: dict, detail: str) -> dict:
    """The report of a world the machinery could not run: no part of the hand-in is to blame."""
    return {"type": "world_report", "completed": [], "results": {p: {} for p in job["parts"]},
            "abort": {"reason": "infra_error", "part": None, "detail": detail},
            "exit_codes": {}, "output": {}, "skipped_lines": [], "seconds": 0.0}


def world_budget(job: dict) -> float:
    """The longest a world may take before its executor is presumed stuck."""
    t = job["timeouts"]
    return t["world_start"] + t["part"] * len(job["parts"]) + 30.0


def _child_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


class WarmExecutor:
    name = "warm"

    def __init__(self):
        self._proc = None
        self._reader = None

    def _start(self):
        self._proc = subprocess.Popen([sys.executable, "-m", "grader.executor", "--zygote"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, env=_child_env(), cwd=str(ROOT),
                                      start_new_session=True)
        self._reader = channel.Reader()

    def _kill(self):
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._proc.wait()
            self._proc = None

    def run_world(self, job: dict) -> dict:
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        try:
            channel.send(self._proc.stdin.fileno(), job)
        except OSError as e:
            self._kill()
            return infra_report(job, f"the re-run helper process is gone ({e})")
        deadline = time.monotonic() + world_budget(job)
        out = self._proc.stdout.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._kill()
                return infra_report(job, "the re-run helper process stopped answering")
            readable, _, _ = select.select([out], [], [], left)
            if not readable:
                continue
            data = os.read(out, 1 << 20)
            if not data:
                self._kill()
                return infra_report(job, "the re-run helper process exited")
            try:
                messages = self._reader.feed(data)
            except channel.ChannelError as e:
                self._kill()
                return infra_report(job, f"the re-run helper process sent a malformed report ({e})")
            if messages:
                return messages[0]

    def close(self):
        if self._proc is not None and self._proc.poll() is None:
            try:
                channel.send(self._proc.stdin.fileno(), {"type": "exit"})
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()


class TorchrunExecutor:
    name = "torchrun"

    def run_world(self, job: dict) -> dict:
        from grader import world
        work = job["work_dir"]
        world_size = job["world_size"]
        fifos = [os.path.join(work, f"rank{r}.fifo") for r in range(world_size)]
        for path in fifos:
            os.mkfifo(path, 0o600)
        job_file = os.path.join(work, "job.json")
        with open(job_file, "w") as f:
            json.dump(job, f)
        log_path = os.path.join(work, "torchrun.out")
        torchrun = str(Path(sys.executable).with_name("torchrun"))
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([torchrun, "--standalone", "--nnodes=1", f"--nproc_per_node={world_size}",
                                     "-m", "grader.executor", "--torchrun-rank", job_file],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=_child_env(), cwd=str(ROOT), start_new_session=True)
        # A FIFO opened without blocking reads nothing, and no end of file, until its rank opens it.
        fds = {r: os.open(path, os.O_RDONLY | os.O_NONBLOCK) for r, path in enumerate(fifos)}

        def output():
            with open(log_path, "rb") as f:
                return {0: f.read()[-world.OUTPUT_TAIL:].decode("utf-8", "replace")}
        return world.supervise(job, fds, [proc.pid], proc.pid, collect_output=output,
                               launcher_exited=lambda: proc.poll() is not None)

    def close(self):
        pass


def make_executor(name: str):
    if name == "warm":
        return WarmExecutor()
    if name == "torchrun":
        return TorchrunExecutor()
    raise ValueError(f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")


def _zygote() -> None:
    """The warm helper: read world jobs on stdin, run each, answer with its report on stdout."""
    from grader import world, worker  # torch is imported once here, inherited by every forked rank
    worker.warm_up()
    control_out = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # stray prints must not reach the control pipe
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    reader = channel.Reader()
    while True:
        data = os.read(0, 1 << 20)
        if not data:
            return
        for job in reader.feed(data):
            if job["type"] == "exit":
                return
            channel.send(control_out, world.run_world(job))


def _torchrun_rank(job_file: str) -> None:
    from grader import worker
    with open(job_file) as f:
        job = json.load(f)
    rank = int(os.environ["RANK"])
    fd = os.open(os.path.join(job["work_dir"], f"rank{rank}.fifo"), os.O_WRONLY)
    worker.warm_up()  # on the start-up clock, as the zygote does, not on the first part's
    worker.rank_main(job, rank, fd)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--zygote"]:
        _zygote()
    elif sys.argv[1:2] == ["--torchrun-rank"]:
        _torchrun_rank(sys.argv[2])
    else:
        sys.exit("usage: python -m grader.executor --zygote | --torchrun-rank JOB_FILE (used by the grader)")
