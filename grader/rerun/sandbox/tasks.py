"""How many tasks (processes and threads) one world may run, and what counts them for that world alone.

RLIMIT_NPROC is no limit of a process tree: the kernel counts every task of a real user id, and
(since Linux 5.14, "ucounts") it counts them per user namespace, checking a new task at each level
up to the machine's: in the task's own namespace against the task's RLIMIT_NPROC, and in every
namespace above against the limit its creator had when it made the namespace below. So the limit
counts one world only

- where the world's processes run under a user id no other process has (`Hold.OWN_UID`: the grader
  is root, inside the sandbox's wide user namespace or outside any), or
- in a user namespace of the world's own, on Linux >= 5.14 (`Hold.OWN_USERNS`),

and there the ranks get RLIMIT_NPROC = limits.processes. Elsewhere (an ordinary user without user
namespaces: `--sandbox off`, a laptop's `check`) it would count the user's other programs too, 150
idle threads of an editor included. There the world's tasks are counted by the world's leader
(grader.rerun.sandbox.memory.Watchdog, which ends the world past limits.processes) and RLIMIT_NPROC is set
relative to what the user runs when the world starts (`backstop`): a fork bomb between two polls
stops `limits.processes` tasks above the user's count. A pids cgroup of the world's own
(grader.rerun.sandbox.cgroup), where the grader can make one, holds the world exactly in every case.

Whatever holds a world, every level above it still counts the user as a whole: a user whose
`ulimit -u` leaves less room than a world needs cannot grade, and `headroom` says so with the
numbers before anything runs.
"""

import enum
import os
import resource
from dataclasses import dataclass

UCOUNTS_PER_NAMESPACE = (5, 14)   # the first Linux whose RLIMIT_NPROC counts per user namespace


class Hold(enum.Enum):
    """What bounds the tasks of one world (every result's isolation summary says which)."""
    PIDS_CGROUP = "a pids cgroup of the world's own (pids.max)"
    OWN_UID = "RLIMIT_NPROC of a user id of the world's own"
    OWN_USERNS = "RLIMIT_NPROC in a user namespace of the world's own"
    WATCHDOG = ("the world's leader, counting the world's tasks (RLIMIT_NPROC at the user's own count "
                "plus limits.processes as a backstop)")


def kernel_counts_per_namespace(release: str = "") -> bool:
    """Whether this kernel's RLIMIT_NPROC counts per user namespace (Linux >= 5.14)."""
    release = release or os.uname().release
    try:
        version = tuple(int(p) for p in release.split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return os.uname().sysname == "Linux" and version >= UCOUNTS_PER_NAMESPACE


def user_tasks(uid: int = None) -> int:
    """The tasks (threads included) whose real user id is `uid` (ours by default) that /proc shows:
    what the kernel's RLIMIT_NPROC counts for that user. 0 where there is no /proc."""
    uid = os.getuid() if uid is None else uid
    if not os.path.isdir("/proc/self/task"):
        return 0
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        real = threads = None
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        real = int(line.split()[1])
                    elif line.startswith(b"Threads:"):
                        threads = int(line.split()[1])
                        break
        except (OSError, ValueError, IndexError):
            continue
        if real == uid and threads:
            count += threads
    return count


@dataclass
class Headroom:
    """A user's room for more tasks: RLIMIT_NPROC's soft limit (None: unlimited) and the tasks the
    user runs now."""
    limit: int
    used: int

    @property
    def left(self):
        return None if self.limit is None else max(0, self.limit - self.used)

    def refusal(self, needed: int, processes: int) -> str:
        """Why a batch needing `needed` tasks (worlds x limits.processes and their helpers) cannot
        run here ('' when it can)."""
        if self.left is None or self.left >= needed:
            return ""
        return (f"your user may run {self.limit} processes and threads (ulimit -u) and runs {self.used} now, "
                f"which leaves {self.left}; grading needs up to {needed} more (limits.processes = {processes} "
                f"per world, for each of --jobs worlds, and the re-run helpers): raise the limit "
                f"(ulimit -u {self.used + needed} or more, or ask the machine's administrators), end other "
                f"programs of your user, grade with fewer --jobs, or lower limits.processes in the rubric")


def headroom(uid: int = None) -> Headroom:
    """This user's room for more tasks, measured now (root, whom the limit does not hold, has no limit)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    exempt = os.geteuid() == 0 or soft == resource.RLIM_INFINITY
    return Headroom(limit=None if exempt else soft, used=user_tasks(uid))


def backstop(processes: int, counted: int = None) -> int:
    """RLIMIT_NPROC for ranks whose user id is the user's own, where nothing counts their world
    alone: what the user runs now (`counted`, measured by default) plus the world's limit, so that a
    fork bomb stops there between two polls of the watchdog."""
    return (user_tasks() if counted is None else counted) + processes


def hold(own_uid: bool, own_userns: bool, pids_cgroup: bool) -> Hold:
    """What bounds a world's tasks here: its pids cgroup, else a user id or (on Linux >= 5.14) a
    user namespace of its own, else the watchdog."""
    if pids_cgroup:
        return Hold.PIDS_CGROUP
    if own_uid:
        return Hold.OWN_UID
    if own_userns and kernel_counts_per_namespace():
        return Hold.OWN_USERNS
    return Hold.WATCHDOG


def rank_nproc(held: Hold, own_uid: bool, processes: int, machine_visible: bool = True) -> int:
    """The RLIMIT_NPROC a rank gets: the world's limit where the count is the world's alone (a user
    id or a namespace of its own), else the backstop over the user's own count; none (0) where that
    count cannot be seen (a PID namespace hides the machine's tasks from a kernel older than 5.14,
    which counts them all): the watchdog alone then holds the world."""
    if own_uid or held == Hold.OWN_USERNS:
        return processes
    return backstop(processes) if machine_visible else 0
