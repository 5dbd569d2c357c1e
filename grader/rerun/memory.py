"""The memory and the tasks of a world as a whole: `limits.memory_mb` and `limits.processes` for
everything the world starts, its ranks and all their children together.

A per-process limit binds each process alone: a rank that forks children, each filling its own
share, gets past it. So the world's leader watches the sum over every process of the world: its
ranks and all they started, found as the leader's descendants (the leader is the world's
PID-namespace init, or a child subreaper, so an orphan that left its process group is still its
descendant).

    used  = sum over the world's processes of Pss (proportional set size: a page shared by n
            processes counts 1/n in each, so pages shared inside the world count once, and a fork
            that shares without writing costs nothing)
    tasks = sum over the world's processes of their threads (what RLIMIT_NPROC would count)

polled every POLL_S seconds; Pss is read (smaps_rollup, costly) only while the cheap upper bound,
the sum of the resident sets (statm), is above the limit. The moment `used` passes limits.memory_mb,
every process of the world is killed and each rank's output ends with "MemoryError: the ranks and
their children used more than N MB", which the grader reports as the part's out-of-memory; past
limits.processes, with "the ranks and their children ran more than N processes and threads", a
crash. The watchdog needs nothing from the machine but /proc (without it, a laptop's world has no
watchdog, and `check` says so); between two polls a world may allocate past the limit.

Where a cgroup of the world's own holds it (grader.rerun.cgroup), the kernel holds both limits
exactly; when its out-of-memory killer acts there, the watchdog sees it and ends the world with the
same message.
"""

import os
import signal
import threading
import time

from grader.rerun import cgroup

POLL_S = 0.02
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
HAS_PROC = os.path.isdir("/proc/self/task")   # Linux; not macOS, where a world has no watchdog


def tree() -> tuple:
    """({pid: its child pids}, {pid: its threads}) for every process this /proc shows."""
    children, threads = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            ppid, count = int(fields[1]), int(fields[17])   # stat fields 4 (ppid) and 20 (num_threads)
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
        threads[int(name)] = count
    return children, threads


def _nspid(pid) -> list:
    """The numbers of process `pid` in the PID namespace /proc shows and in each one below it."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return [int(n) for n in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def descendants(root: int, children: dict = None) -> list:
    """The pids below `root` (pids as this /proc numbers them)."""
    children, found, todo = children if children is not None else tree()[0], [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _resident(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _proportional(pid: int) -> int:
    """Pss of `pid`, in bytes; its resident set where smaps_rollup cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return _resident(pid)


def used(pids: list) -> int:
    """Bytes the processes `pids` use together (the sum of their Pss, see the module docstring)."""
    return sum(_proportional(p) for p in pids)


def message(limit_mb: int) -> str:
    return f"the ranks and their children used more than {limit_mb} MB"


def tasks_message(limit: int) -> str:
    return f"the ranks and their children ran more than {limit} processes and threads"


class Watchdog:
    """Kills every process of the world below this one the moment they use more than `limit_mb`
    together, or run more than `tasks` tasks, after writing the reason into each of `outputs` (the
    ranks' output files). `cgroups`: the world's cgroup folders, whose out-of-memory kills it heeds."""

    def __init__(self, limit_mb: int, outputs: list, tasks: int = 0, cgroups: list = ()):
        self.limit_mb, self.outputs, self.tasks, self.cgroups = limit_mb, outputs, tasks, list(cgroups)
        self.tripped = ""
        self.peak_tasks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="a4-memory", daemon=True)

    def __enter__(self):
        if HAS_PROC:
            self._me = int(os.readlink("/proc/self"))   # our pid as /proc numbers it (not our namespace's 1)
            self._thread.start()
        return self

    def __exit__(self, *_):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _watch(self) -> None:
        limit = self.limit_mb << 20
        kills = cgroup.oom_kills(self.cgroups)
        pause = POLL_S
        while not self._stop.wait(pause):
            started = time.monotonic()
            children, threads = tree()
            pids = descendants(self._me, children)
            count = sum(threads.get(p, 1) for p in pids)
            self.peak_tasks = max(self.peak_tasks, count)
            if (sum(_resident(p) for p in pids) > limit and used(pids) > limit) or \
                    cgroup.oom_kills(self.cgroups) > kills:
                return self._end(pids, f"MemoryError: {message(self.limit_mb)} (limits.memory_mb, the world's "
                                       f"limit); the world was ended")
            if self.tasks and count > self.tasks:
                return self._end(pids, f"{tasks_message(self.tasks)} (limits.processes, the world's limit); "
                                       f"the world was ended")
            # Where /proc shows the whole machine (no sandbox), a poll costs more: keep it under a tenth.
            pause = max(POLL_S, 10 * (time.monotonic() - started))

    def _end(self, pids: list, why: str) -> None:
        self.tripped = why
        for path in self.outputs:
            try:
                with open(path, "a") as f:
                    f.write(f"\n{why}\n")
            except OSError:
                pass
        depth = len(_nspid("self")) - 1
        for _ in range(3):   # a process that forks while being killed leaves children behind: again
            for pid in pids:
                ours = _nspid(pid)   # kill() takes our namespace's number, /proc may show another
                try:
                    if len(ours) > depth:
                        os.kill(ours[depth], signal.SIGKILL)
                except OSError:
                    pass
            pids = descendants(self._me)
            if not pids:
                break
