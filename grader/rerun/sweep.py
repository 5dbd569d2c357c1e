"""Without the sandbox (`--sandbox off`), a world still ends whole: its processes and its files go
with it.

Inside the sandbox a world's PID namespace, its /tmp and /dev/shm end with it (grader.rerun.sandbox,
grader.rerun.scratch). Without one, the zygote ends each world itself (`World`), after its leader:

- processes. The leader runs in a cgroup of the world's own, below the executor's
  (grader.rerun.cgroup.open_world), and everything in it is killed when the world ends: a daemon
  that left its process group and its session is still in it. Where no cgroup can be had, the
  zygote and each world's leader are child subreapers: a process whose parents exited is adopted by
  the leader, or by the zygote if the leader is gone, never by init, and everything below the
  zygote is killed. As root, whose ranks run under a user id of the world's own, every process of
  that id is killed too.
- files. As root, every entry that the world's user id owns in /tmp, /var/tmp and /dev/shm (and in
  the folders there that anyone may write) is removed. Under the grader's own user id (an ordinary
  user), its ranks' TMPDIR is the world's own folder, and the entries of that user that appeared
  in /tmp, /var/tmp and /dev/shm while the world ran are removed, but folders named as the grader
  names its own (`GRADERS_OWN`): the user's other programs' files made meanwhile go too
  (docs/security.md).

What still holds after a kill of the grader itself: the next executor removes the cgroup folders
that no live grader owns (grader.rerun.cgroup), killing what is in them.
"""

import os
import re
import signal
import stat
import time

from grader.rerun import cgroup, memory, scratch

SWEPT = ("/tmp", "/var/tmp", "/dev/shm")
# The grader's own scratch folders, as tempfile names them (grader.rerun.sandbox.scratch_dir): another
# batch of the same user may make one while a world runs.
GRADERS_OWN = re.compile(r"a4-(grade|check|doctor|gradescope|integrity|sandbox)-[a-z0-9_]{8}")
ROUNDS = 100          # kill, reap and look again, at most this often (10 ms apart)


def _of_user(uid: int) -> list:
    """The pids of every process whose real user id is `uid`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                real = next(int(line.split()[1]) for line in f if line.startswith(b"Uid:"))
        except (OSError, ValueError, IndexError, StopIteration):
            continue
        if real == uid:
            found.append(int(name))
    return found


def _reap() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                return
        except ChildProcessError:
            return


def kill_below(uid: int = None) -> bool:
    """Kill every process below this one (a subreaper adopts the world's orphans), and every process
    of `uid` (None: none by user id); reap. Whether none was left."""
    for _ in range(ROUNDS):
        pids = memory.descendants(os.getpid()) + (_of_user(uid) if uid is not None else [])
        if not pids:
            return True
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
        _reap()
    return False


def _names(top: str, uid: int) -> set:
    try:
        return {e.name for e in os.scandir(top) if e.stat(follow_symlinks=False).st_uid == uid}
    except OSError:
        return set()


def remove_owned(uid: int, top: str, before: set = None, depth: int = 2) -> list:
    """Remove the entries of `top` that `uid` owns (but the names in `before`, and the grader's own
    where `before` is given: the grader's user is the ranks'); look into the folders there anyone may
    write, `depth` levels down, when `before` is None (the world's user id is its own). What could
    not be removed."""
    left = []
    try:
        entries = list(os.scandir(top))
    except OSError:
        return left
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if info.st_uid != uid:
            if before is None and depth and stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IWOTH:
                left += remove_owned(uid, entry.path, None, depth - 1)
            continue
        if before is not None and (entry.name in before or (stat.S_ISDIR(info.st_mode) and
                                                            GRADERS_OWN.fullmatch(entry.name))):
            continue
        scratch.remove(entry.path)
        if os.path.lexists(entry.path):
            left.append(entry.path)
    return left


class World:
    """One world's end, outside the sandbox: made in the zygote before it forks the world's leader
    (`cgroups`: the folders the leader joins), `end`ed after the leader is reaped."""

    def __init__(self, executor_cgroups: list, uid: int):
        self.uid = uid
        self.own_uid = uid != os.getuid()
        self.cgroups = cgroup.open_world(executor_cgroups)
        self.before = None if self.own_uid else {top: _names(top, uid) for top in SWEPT}

    def end(self) -> list:
        """Kill what is left of the world, remove its files and its cgroup; what could not be
        (empty when the world ended whole)."""
        problems = []
        if not cgroup.end_world(self.cgroups):
            problems.append("processes of the world's cgroup outlived it")
        if not kill_below(self.uid if self.own_uid else None):
            problems.append("processes of the world outlived it")
        for top in SWEPT:
            problems += [f"{path} could not be removed" for path in
                         remove_owned(self.uid, top, None if self.own_uid else self.before[top])]
        return problems
