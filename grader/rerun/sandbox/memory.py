"""The memory and the tasks of a world as a whole: `limits.memory_mb` and `limits.processes` for
everything the world starts, its ranks and all their children together.

A per-process limit binds each process alone: a rank that forks children, each filling its own
share, gets past it. So the world's leader watches the sum over every process of the world: its
ranks and all they started, found as the leader's descendants (the leader is the world's
PID-namespace init, or a child subreaper, so an orphan that left its process group is still its
descendant).

    used  = sum over the world's processes of Pss (proportional set size: a page shared by n
            processes counts 1/n in each, so pages shared inside the world count once, and a fork
            that shares without writing costs nothing) and of their page tables (VmPTE: no Pss
            shows them, and a process that reads a terabyte of a read-only mapping once every
            2 MB maps only the zero page but holds 2 GB of them)
            + what the world holds outside Pss (grader.rerun.sandbox.outside: memfds and files in memory
            it holds open, its own /tmp and /dev/shm, its socket buffers), read every
            OUTSIDE_EVERY polls while that is small, every poll once it is not
    tasks = sum over the world's processes of their threads (what RLIMIT_NPROC would count)

polled every POLL_S seconds; Pss is read (smaps_rollup, costly) only while the cheap upper bound,
the sum of the resident sets and page tables (status), is above the limit, and then estimated
between readings (`Estimate`). The moment `used` passes limits.memory_mb, every process of the
world is killed and each rank's output ends with "MemoryError: the ranks and their children used
more than N MB"; the world's report (grader.rerun.world.out_of_memory, by `ran_out`) then ends out
of memory at the part `culprit`, the rank whose processes held most, was running; past
limits.processes, with "the ranks and their children ran more than N processes and threads", a
crash. The watchdog needs nothing but /proc (without it, a laptop's world has no watchdog, and
`check` says so); between two polls a world may allocate past the limit.

Where a cgroup of the world's own holds it (grader.rerun.sandbox.cgroup), the kernel holds both limits
exactly; when its out-of-memory killer acts there, the watchdog sees it and ends the world with the
same message, the same verdict and the same culprit (the rank that held most at the last poll):
one cause, one verdict, whichever layer caught it.
"""

import os
import resource
import signal
import threading
import time

from grader.limits import SOCKETS_SHARE
from grader.rerun.sandbox import cgroup, sockets
from grader.rerun.sandbox import outside as outside_module
from grader.rerun.sandbox.pss import HAS_PROC, Estimate, data_size, descendants, nspid, resident_set, tree
from grader.rerun.sandbox.scratch import left_file

POLL_S = 0.02
MAX_PAUSE = 0.2    # the longest between two polls, however much one costs



RANK_GROWTH_MB = 1024   # address space a rank adds to the zygote's: its threads' stacks and arenas, gloo, tensors


def address_space_problem() -> str:
    """Why no world can run under this process's address-space cap ('' when one can): a machine's own
    (`ulimit -v`, a login node's) below what a rank maps once it runs makes its next thread fail
    (torch's CUDA build maps 3 GB at import)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    mapped = data_size(b"VmSize:") >> 20
    if soft == resource.RLIM_INFINITY or not mapped or mapped + RANK_GROWTH_MB <= soft >> 20:
        return ""
    return (f"this Python maps {mapped} MB of address space before any hand-in runs, a rank about {RANK_GROWTH_MB} MB "
            f"more, and `ulimit -v` allows {soft >> 20} MB: raise it (ulimit -v unlimited) before grading")


def message(limit_mb: int) -> str:
    return f"the ranks and their children used more than {limit_mb} MB"


def verdict(limit_mb: int) -> str:
    """What a part that ran out of memory is told, whichever layer caught it: the watchdog, the
    world's cgroup, or a MemoryError (a rank's RLIMIT_DATA is the world's limit)."""
    return f"{message(limit_mb)} (limits.memory_mb, the world's limit)"


def sockets_verdict(limit_mb: int) -> str:
    """What a part whose world's sockets held more than their share is told (grader.limits.SOCKETS_SHARE)."""
    return (f"the ranks' sockets held more than {limit_mb // SOCKETS_SHARE} MB in the kernel (limits.memory_mb / "
            f"{SOCKETS_SHARE}: the machine's socket memory is one pool for every world)")


def tasks_message(limit: int) -> str:
    return f"the ranks and their children ran more than {limit} processes and threads"


OUTSIDE_EVERY = 5   # polls between two readings of what the world holds outside Pss, while that is small


class Watchdog:
    """Kills every process of the world below this one the moment they use more than `limit_mb`
    together (Pss and grader.rerun.sandbox.outside's), or run more than `tasks` tasks, after writing why into
    each of `outputs` (the ranks' output files). `cgroups`: the world's cgroup folders, whose
    out-of-memory kills it heeds; `ranks`: the ranks' pids as this process numbers them; `own`:
    whether the world has namespaces of its own (grader.rerun.sandbox.outside.Outside)."""

    def __init__(self, limit_mb: int, outputs: list, tasks: int = 0, cgroups: list = (), ranks: list = (),
                 own: bool = False):
        self.limit_mb, self.outputs, self.tasks, self.cgroups = limit_mb, outputs, tasks, list(cgroups)
        self.ranks, self.own = list(ranks), own
        self.peak_tasks = 0
        self.culprit = None     # the rank whose processes held most when the world ran out of memory
        self.shares = {}        # rank -> what its processes held at the last poll, in bytes
        self.verdict = verdict(limit_mb)   # why it ran out: its memory, or its sockets past their share
        self._out_of_memory, self._proc_of = False, {}   # rank -> its pid as /proc numbers it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="a4-memory", daemon=True)

    def __enter__(self):
        self._kills = cgroup.oom_kills(self.cgroups)
        if HAS_PROC:
            self._me = int(os.readlink("/proc/self"))   # our pid as /proc numbers it (not our namespace's 1)
            self._thread.start()
        return self

    def __exit__(self, *_):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def rank_pids(self) -> list:
        """Each rank's pid as /proc numbers it; [] until the watchdog has found them all."""
        return [self._proc_of[r] for r in sorted(self._proc_of)] if len(self._proc_of) == len(self.ranks) else []

    def ran_out(self) -> bool:
        """Whether the world ran out of memory, by the watchdog's count or by the kernel's kill in the
        world's cgroup (then `culprit` is the rank that held most at the last poll)."""
        if not self._out_of_memory and self.cgroups and cgroup.oom_kills(self.cgroups) > self._kills:
            self._trip_memory()
        return self._out_of_memory

    def _trip_memory(self) -> None:
        self.culprit = max(self.shares, key=self.shares.get) if self.shares else None
        self._out_of_memory = True

    def _rank_trees(self, pids: list, children: dict) -> dict:
        """rank -> the /proc pids of its process and all below it."""
        depth, wanted = len(nspid("self")) - 1, {pid: rank for rank, pid in enumerate(self.ranks)}
        for pid in pids if len(self._proc_of) < len(self.ranks) else []:
            ours = nspid(pid)
            if len(ours) > depth and ours[depth] in wanted:
                self._proc_of[wanted[ours[depth]]] = pid
        return {rank: [pid, *descendants(pid, children)] for rank, pid in self._proc_of.items()}

    def _watch(self) -> None:
        limit = self.limit_mb << 20
        estimate, outside = Estimate(limit), outside_module.Outside(self.own)
        pause, polls, pool = POLL_S, 0, sockets.pool()
        while not self._stop.wait(pause):
            started = time.monotonic()
            children, threads = tree()
            pids = descendants(self._me, children)
            count = sum(threads.get(p, 1) for p in pids)
            self.peak_tasks = max(self.peak_tasks, count)
            resident = {p: resident_set(p) for p in pids}
            polls += 1
            # ...and at once when the machine's sockets grew by half the world's share since (one file read)
            machine = sockets.pool()
            if polls % OUTSIDE_EVERY == 1 or outside.total > limit // 8 or sum(resident.values()) > limit // 2 \
                    or machine - pool > limit // SOCKETS_SHARE // 2:
                pool = machine
                outside.read(pids)
            held = {p: resident[p] + outside.by_pid.get(p, 0) for p in pids}
            self.shares = {rank: sum(held.get(p, 0) for p in tree_pids)
                           for rank, tree_pids in self._rank_trees(pids, children).items()}
            # Where /proc shows the whole machine (no sandbox), a poll costs more: keep it under a
            # tenth, but never wait long (a world fills gigabytes a second), and poll four times as
            # often while the world holds more than half its limit.
            pause = min(MAX_PAUSE, max(POLL_S, 10 * (time.monotonic() - started)))
            if min(sum(resident.values()) + outside.total, estimate.last + outside.total or limit) > limit // 2 \
                    or outside.sockets > limit // SOCKETS_SHARE // 4:   # ...or its sockets a quarter of their share
                pause = POLL_S / 4
            if (sum(resident.values()) + outside.total > limit and estimate.over(
                    resident, lambda stop: self._signal(pids, signal.SIGSTOP if stop else signal.SIGCONT),
                    outside.total)) or self.ran_out():
                if not self._out_of_memory:
                    self._trip_memory()
                return self._end(pids, f"MemoryError: {message(self.limit_mb)} (limits.memory_mb, the world's "
                                       f"limit); the world was ended")
            if outside.sockets > limit // SOCKETS_SHARE:
                self._trip_memory()
                self.verdict = sockets_verdict(self.limit_mb)
                return self._end(pids, f"MemoryError: {self.verdict}; the world was ended")
            if self.tasks and count > self.tasks:
                return self._end(pids, f"{tasks_message(self.tasks)} (limits.processes, the world's limit); "
                                       f"the world was ended")

    def _end(self, pids: list, why: str) -> None:
        for path in self.outputs:
            fd = left_file(path, os.O_WRONLY | os.O_APPEND)   # never a FIFO waited on, nor a link followed
            if fd is None:
                continue
            try:
                os.write(fd, f"\n{why}\n".encode())
            except OSError:
                pass
            finally:
                os.close(fd)
        for _ in range(3):   # a process that forks while being killed leaves children behind: again
            self._signal(pids, signal.SIGKILL)
            pids = descendants(self._me)
            if not pids:
                break

    @staticmethod
    def _signal(pids: list, sig: int) -> None:
        """Send `sig` to each of `pids` (as /proc numbers them: kill() takes our namespace's number)."""
        depth = len(nspid("self")) - 1
        for pid in pids:
            ours = nspid(pid)
            try:
                if len(ours) > depth:
                    os.kill(ours[depth], sig)
            except OSError:
                pass
