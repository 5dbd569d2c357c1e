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
the sum of the resident sets (statm), is above the limit, and then estimated between readings
(`Estimate`). The moment `used` passes limits.memory_mb,
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
import resource
import signal
import threading
import time

from grader.rerun import cgroup

POLL_S = 0.02
MAX_PAUSE = 0.2    # the longest between two polls, however much one costs
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


class Estimate:
    """The Pss of a world's processes, kept cheap enough to poll every few milliseconds.

    Each process is estimated from its last Pss reading plus what its resident set grew since (its
    resident set, an upper bound, where it has none); while the estimate is within the limit, one
    process is read again per poll, the one read longest ago (a page copied on write grows a
    process's Pss, not its resident set). An estimate above the limit is checked while the world
    is stopped (`hold`: a world fills gigabytes a second, and a reading costs up to a tenth of a
    second per GB on a busy machine), the processes that grew most first: yes as soon as those read
    alone are above the limit (the world is then ended stopped); else the world goes on.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.known = {}   # pid -> (its resident set when its Pss was read, that Pss, when)
        self.last = 0     # the last estimate of the whole world

    def _read(self, pid: int, resident: int) -> int:
        self.known[pid] = (resident, _proportional(pid), time.monotonic())
        return self.known[pid][1]

    def over(self, resident: dict, hold) -> bool:
        """Whether the processes of `resident` (pid -> resident set now) use more than the limit;
        `hold(True)` stops them, `hold(False)` lets them go on."""
        self.known = {p: v for p, v in self.known.items() if p in resident}
        estimate = {p: self.known[p][1] + max(0, r - self.known[p][0]) if p in self.known else r
                    for p, r in resident.items()}
        self.last = sum(estimate.values())
        if self.last <= self.limit:
            stalest = min(resident, key=lambda p: self.known.get(p, (0, 0, 0.0))[2])
            self.last += self._read(stalest, resident[stalest]) - estimate[stalest]
            return self.last > self.limit and self.over(resident, hold)
        hold(True)
        growth = {p: estimate[p] - self.known.get(p, (0, 0, 0.0))[1] for p in resident}
        read = 0
        for pid in sorted(resident, key=growth.get, reverse=True):
            estimate[pid] = self._read(pid, resident[pid])
            read += estimate[pid]
            if read > self.limit:
                return True
        hold(False)
        self.last = sum(estimate.values())
        return False


def data_size(field: bytes = b"VmData:") -> int:
    """What this process holds as data now (VmData: private writable mappings; VmSize: its whole
    address space), in bytes; 0 where /proc does not say."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return 0


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
        estimate = Estimate(limit)
        pause = POLL_S
        while not self._stop.wait(pause):
            started = time.monotonic()
            children, threads = tree()
            pids = descendants(self._me, children)
            count = sum(threads.get(p, 1) for p in pids)
            self.peak_tasks = max(self.peak_tasks, count)
            resident = {p: _resident(p) for p in pids}
            # Where /proc shows the whole machine (no sandbox), a poll costs more: keep it under a
            # tenth, but never wait long (a world fills gigabytes a second), and poll four times as
            # often while the world holds more than half its limit.
            pause = min(MAX_PAUSE, max(POLL_S, 10 * (time.monotonic() - started)))
            if min(sum(resident.values()), estimate.last or limit) > limit // 2:
                pause = POLL_S / 4
            if (sum(resident.values()) > limit and estimate.over(resident, lambda stop: self._signal(
                    pids, signal.SIGSTOP if stop else signal.SIGCONT))) or \
                    cgroup.oom_kills(self.cgroups) > kills:
                return self._end(pids, f"MemoryError: {message(self.limit_mb)} (limits.memory_mb, the world's "
                                       f"limit); the world was ended")
            if self.tasks and count > self.tasks:
                return self._end(pids, f"{tasks_message(self.tasks)} (limits.processes, the world's limit); "
                                       f"the world was ended")

    def _end(self, pids: list, why: str) -> None:
        self.tripped = why
        for path in self.outputs:
            try:
                with open(path, "a") as f:
                    f.write(f"\n{why}\n")
            except OSError:
                pass
        for _ in range(3):   # a process that forks while being killed leaves children behind: again
            self._signal(pids, signal.SIGKILL)
            pids = descendants(self._me)
            if not pids:
                break

    @staticmethod
    def _signal(pids: list, sig: int) -> None:
        """Send `sig` to each of `pids` (as /proc numbers them: kill() takes our namespace's number)."""
        depth = len(_nspid("self")) - 1
        for pid in pids:
            ours = _nspid(pid)
            try:
                if len(ours) > depth:
                    os.kill(ours[depth], sig)
            except OSError:
                pass


class Peak:
    """The most memory (sum of Pss, MB) and tasks the processes below this one that were not there
    at the start used together, polled every 20 ms while a world runs."""

    def __init__(self):
        self.before = set(descendants(os.getpid())) if HAS_PROC else set()
        self.memory_mb = self.tasks = 0
        self._running = True
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self):
        if HAS_PROC:
            self._thread.start()
        return self

    def __exit__(self, *_):
        self._running = False
        if self._thread.is_alive():
            self._thread.join()

    def _poll(self):
        while self._running:
            children, threads = tree()
            new = [p for p in descendants(os.getpid(), children) if p not in self.before]
            self.memory_mb = max(self.memory_mb, used(new) >> 20)
            self.tasks = max(self.tasks, sum(threads.get(p, 1) for p in new))
            time.sleep(0.02)
