"""What /proc says of a world's processes, for its watchdog (grader.rerun.sandbox.memory) and the
grader's own peak (grader.pipeline.peak): the tree of processes, each one's resident set, Pss and
page tables, and an estimate of their Pss together cheap enough to poll every few milliseconds.

    resident     = VmRSS + VmPTE                (status: cheap, an upper bound)
    proportional = Pss (smaps_rollup) + VmPTE   (a page shared by n processes counts 1/n in each)
"""

import os
import time

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


def nspid(pid) -> list:
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


def resident_set(pid: int) -> int:
    """An upper bound of what `pid` holds, in bytes: its resident set and its page tables."""
    return _status(pid, b"VmRSS:", b"VmPTE:")


def _proportional(pid: int) -> int:
    """Pss of `pid` and its page tables, in bytes; `resident_set` where smaps_rollup cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return (int(line.split()[1]) << 10) + _status(pid, b"VmPTE:")
    except (OSError, ValueError, IndexError):
        pass
    return resident_set(pid)


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
