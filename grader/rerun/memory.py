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
part's out-of-memory. The watchdog needs nothing from the machine; between two polls a world may
allocate past the limit.

Where the grader runs as root, the kernel holds the limit too, exactly: the executor makes a memory
cgroup of its own (`Cgroup`, cgroup v1 or v2, below the grader's own), sets its limit to the
world's before each world, and binds it into the sandbox at CGROUP; each world's leader moves
itself into it before it forks anything. When the kernel's out-of-memory killer acts there, the
watchdog sees it (oom_kill) and ends the world with the same message.
"""

import os
import secrets
import signal
import threading
import time

CGROUP = "/a4-cgroup"   # where a world's leader finds its memory cgroup inside the sandbox

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


def _oom_kills(folder: str) -> int:
    """How many processes the kernel killed for memory in the cgroup at `folder` (v1 or v2)."""
    for name in ("memory.events", "memory.oom_control"):
        try:
            with open(os.path.join(folder, name)) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except (OSError, ValueError):
            continue
    return 0


def join_cgroup() -> bool:
    """In a world's leader, before it forks: move into the memory cgroup bound at CGROUP, if any."""
    try:
        with open(os.path.join(CGROUP, "cgroup.procs"), "w") as f:
            f.write("0")
        return True
    except OSError:
        return False


class Cgroup:
    """A memory cgroup of one executor's worlds, below the grader's own (root only)."""
    why = ""   # why the last `make` gave none

    def __init__(self, path: str, limit_file: str):
        self.path, self.limit_file = path, limit_file

    @classmethod
    def make(cls):
        """A new one, or None where this user or machine gives none (and `why` says so)."""
        cls.why = ""
        if os.geteuid() != 0:
            cls.why = "no memory cgroup for an ordinary user"
            return None
        try:
            with open("/proc/self/cgroup") as f:
                mine = [line.rstrip("\n").split(":", 2) for line in f]
            with open("/proc/self/mounts") as f:
                mounts = [line.split() for line in f]
        except OSError as e:
            cls.why = f"cgroups cannot be read ({e.strerror})"
            return None
        for fields in mounts:
            if fields[2] == "cgroup" and "memory" in fields[3].split(","):
                below = next((p for _, c, p in mine if "memory" in c.split(",")), None)
                limit_file = "memory.limit_in_bytes"
            elif fields[2] == "cgroup2":
                below = next((p for h, _, p in mine if h == "0"), None)
                limit_file = "memory.max"
            else:
                continue
            if below is None:
                continue
            path = os.path.join(fields[1] + below, f"a4-world-{secrets.token_hex(6)}")
            try:
                os.mkdir(path, 0o755)
            except OSError as e:
                cls.why = f"a memory cgroup could not be made ({e.strerror})"
                continue
            if os.path.exists(os.path.join(path, limit_file)):
                return cls(path, limit_file)
            os.rmdir(path)
            cls.why = "the cgroup hierarchy has no memory controller here"
        cls.why = cls.why or "no memory cgroup hierarchy is mounted"
        return None

    def limit(self, megabytes: int) -> None:
        with open(os.path.join(self.path, self.limit_file), "w") as f:
            f.write(str(megabytes << 20))

    def remove(self) -> None:
        try:
            os.rmdir(self.path)
        except OSError:
            pass


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
        kills = _oom_kills(CGROUP)
        pause = POLL_S
        while not self._stop.wait(pause):
            started = time.monotonic()
            pids = descendants(self._me)
            if (sum(_resident(p) for p in pids) > limit and used(pids) > limit) or _oom_kills(CGROUP) > kills:
                self._end(pids)
                return
            # Where /proc shows the whole machine (no sandbox), a poll costs more: keep it under a tenth.
            pause = max(POLL_S, 10 * (time.monotonic() - started))

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
