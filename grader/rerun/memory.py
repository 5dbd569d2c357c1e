"""The memory of a world as a whole: at most ranks x `limits.memory_mb` for everything it starts.

The per-rank address-space limit (grader.rerun.sandbox.limit_rank) binds each process alone; a
rank that forks children, each filling its own share, gets past it. So the world's leader also
watches the sum over every process of the world: its ranks and all they started, found as the
leader's descendants (the leader is the world's PID-namespace init, or a child subreaper, so an
orphan that left its process group is still its descendant).

    used = sum over the world's processes of Pss (proportional set size: a page shared by n
    processes counts 1/n in each, so pages shared inside the world count once, and a fork
    that shares without writing costs nothing)

polled every POLL_S seconds; Pss is read (smaps_rollup, costly) only while the cheap upper bound,
the sum of the resident sets (statm), is above the limit. The moment `used` passes the limit,
every process of the world is killed and each rank's output ends with
"MemoryError: the ranks and their children used more than N MB", which the grader reports as the
part's out-of-memory. The watchdog runs where no memory cgroup can be had (an ordinary user, a
container): it needs nothing from the machine.
"""

import os
import signal
import threading

POLL_S = 0.02
PAGE = os.sysconf("SC_PAGE_SIZE")


def _children() -> dict:
    """pid -> its child pids, for every process this /proc shows."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    return children


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


def descendants(root: int) -> list:
    """The pids below `root` (pids as this /proc numbers them)."""
    children, found, todo = _children(), [], [root]
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


class Watchdog:
    """Kills every process of the world below this one the moment they use more than `limit_mb`
    together, after writing the reason into each of `outputs` (the ranks' output files)."""

    def __init__(self, limit_mb: int, outputs: list):
        self.limit_mb, self.outputs = limit_mb, outputs
        self.tripped = False
        self._stop = threading.Event()
        self._me = int(os.readlink("/proc/self"))   # our pid as /proc numbers it (not our namespace's 1)
        self._thread = threading.Thread(target=self._watch, name="a4-memory", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *_):
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        limit = self.limit_mb << 20
        while not self._stop.wait(POLL_S):
            pids = descendants(self._me)
            if sum(_resident(p) for p in pids) > limit and used(pids) > limit:
                self._end(pids)
                return

    def _end(self, pids: list) -> None:
        self.tripped = True
        for path in self.outputs:
            try:
                with open(path, "a") as f:
                    f.write(f"\nMemoryError: {message(self.limit_mb)} (the world's limit: its ranks "
                            f"x limits.memory_mb); the world was ended\n")
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
