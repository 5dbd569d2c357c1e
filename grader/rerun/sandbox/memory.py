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

from grader.rerun.sandbox import cgroup
from grader.rerun.sandbox import outside as outside_module

POLL_S = 0.02
MAX_PAUSE = 0.2    # the longest between two polls, however much one costs
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


def _status(pid, *fields: bytes) -> int:
    """The sum of `fields` (in kB) of /proc/PID/status, in bytes; 0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            return sum(int(line.split()[1]) << 10 for line in f if line.startswith(fields))
    except (OSError, ValueError, IndexError):
        return 0


def _resident(pid: int) -> int:
    """An upper bound of what `pid` holds, in bytes: its resident set and its page tables."""
    return _status(pid, b"VmRSS:", b"VmPTE:")


def _proportional(pid: int) -> int:
    """Pss of `pid` and its page tables, in bytes; `_resident` where smaps_rollup cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return (int(line.split()[1]) << 10) + _status(pid, b"VmPTE:")
    except (OSError, ValueError, IndexError):
        pass
    return _resident(pid)


def used(pids: list) -> int:
    """Bytes the processes `pids` use together (their Pss and page tables: the module docstring)."""
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

    def over(self, resident: dict, hold, outside: int = 0) -> bool:
        """Whether the processes of `resident` (pid -> resident set now), with the `outside` bytes the
        world holds beyond their Pss (grader.rerun.sandbox.outside), use more than the limit; `hold(True)`
        stops them, `hold(False)` lets them go on."""
        limit = self.limit - outside
        if limit < 0:
            return True
        self.known = {p: v for p, v in self.known.items() if p in resident}
        estimate = {p: self.known[p][1] + max(0, r - self.known[p][0]) if p in self.known else r
                    for p, r in resident.items()}
        self.last = sum(estimate.values())
        if self.last <= limit:
            if not resident:
                return False
            stalest = min(resident, key=lambda p: self.known.get(p, (0, 0, 0.0))[2])
            self.last += self._read(stalest, resident[stalest]) - estimate[stalest]
            return self.last > limit and self.over(resident, hold, outside)
        hold(True)
        growth = {p: estimate[p] - self.known.get(p, (0, 0, 0.0))[1] for p in resident}
        read = 0
        for pid in sorted(resident, key=growth.get, reverse=True):
            estimate[pid] = self._read(pid, resident[pid])
            read += estimate[pid]
            if read > limit:
                return True
        hold(False)
        self.last = sum(estimate.values())
        return False


def data_size(field: bytes = b"VmData:") -> int:
    """What this process holds as data now (VmData: private writable mappings; VmSize: its whole
    address space), in bytes; 0 where /proc does not say."""
    return _status("self", field)


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
        depth, wanted = len(_nspid("self")) - 1, {pid: rank for rank, pid in enumerate(self.ranks)}
        for pid in pids if len(self._proc_of) < len(self.ranks) else []:
            ours = _nspid(pid)
            if len(ours) > depth and ours[depth] in wanted:
                self._proc_of[wanted[ours[depth]]] = pid
        return {rank: [pid, *descendants(pid, children)] for rank, pid in self._proc_of.items()}

    def _watch(self) -> None:
        limit = self.limit_mb << 20
        estimate, outside = Estimate(limit), outside_module.Outside(self.own)
        pause, polls = POLL_S, 0
        while not self._stop.wait(pause):
            started = time.monotonic()
            children, threads = tree()
            pids = descendants(self._me, children)
            count = sum(threads.get(p, 1) for p in pids)
            self.peak_tasks = max(self.peak_tasks, count)
            resident = {p: _resident(p) for p in pids}
            polls += 1
            if polls % OUTSIDE_EVERY == 1 or outside.total > limit // 8 or sum(resident.values()) > limit // 2:
                outside.read(pids)
            held = {p: resident[p] + outside.by_pid.get(p, 0) for p in pids}
            self.shares = {rank: sum(held.get(p, 0) for p in tree_pids)
                           for rank, tree_pids in self._rank_trees(pids, children).items()}
            # Where /proc shows the whole machine (no sandbox), a poll costs more: keep it under a
            # tenth, but never wait long (a world fills gigabytes a second), and poll four times as
            # often while the world holds more than half its limit.
            pause = min(MAX_PAUSE, max(POLL_S, 10 * (time.monotonic() - started)))
            if min(sum(resident.values()) + outside.total, estimate.last + outside.total or limit) > limit // 2:
                pause = POLL_S / 4
            if (sum(resident.values()) + outside.total > limit and estimate.over(
                    resident, lambda stop: self._signal(pids, signal.SIGSTOP if stop else signal.SIGCONT),
                    outside.total)) or self.ran_out():
                if not self._out_of_memory:
                    self._trip_memory()
                return self._end(pids, f"MemoryError: {message(self.limit_mb)} (limits.memory_mb, the world's "
                                       f"limit); the world was ended")
            if self.tasks and count > self.tasks:
                return self._end(pids, f"{tasks_message(self.tasks)} (limits.processes, the world's limit); "
                                       f"the world was ended")

    def _end(self, pids: list, why: str) -> None:
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
