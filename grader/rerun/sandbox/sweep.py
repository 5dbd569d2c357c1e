"""Without the sandbox (`--sandbox off`), a world still ends whole: its processes and its files go
with it.

Inside the sandbox a world's PID namespace, its /tmp and /dev/shm end with it (grader.rerun.sandbox.namespaces,
grader.rerun.sandbox.scratch). Without one, the zygote ends each world itself (`World`), after its leader:

- processes. The leader runs in a cgroup of the world's own, below the executor's
  (`open_world`), and everything in it is killed when the world ends: a daemon
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
that no live grader owns (grader.rerun.sandbox.cgroup), killing what is in them.
"""

import os
import re
import signal
import stat
import time

from grader.rerun.sandbox import scratch

SWEPT = ("/tmp", "/var/tmp", "/dev/shm")
# The grader's own scratch folders, as tempfile names them (grader.rerun.sandbox.namespaces.scratch_dir): another
# batch of the same user may make one while a world runs.
GRADERS_OWN = re.compile(r"a4-(grade|check|doctor|gradescope|integrity|sandbox)-[a-z0-9_]{8}")
ROUNDS = 100          # kill, reap and look again, at most this often (10 ms apart)
WORLD = "world"       # the cgroup folder below each of the executor's that one world's processes run in


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


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _try(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError:
        pass


def _descendants(root: int) -> list:
    """The pids below `root`, from every process's parent in /proc."""
    children = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        fields = _read(f"/proc/{name}/stat").rsplit(")", 1)[-1].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
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
        pids = _descendants(os.getpid()) + (_of_user(uid) if uid is not None else [])
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


# ---- cgroups: a world's own, and those of graders killed --------------------------------------

def _procs(folder: str) -> list:
    """The pids in `folder` and the folders below it (a delegated user's hand-in may make some)."""
    return [int(p) for below, _, _ in os.walk(folder) for p in _read(os.path.join(below, "cgroup.procs")).split()
            if p.isdigit() and p != "0"]


def kill(folder: str) -> bool:
    """Kill every process in `folder` and below it (cgroup.kill where the kernel has it, else each
    process listed, again until none is left); whether none is."""
    _try(os.path.join(folder, "cgroup.kill"), "1")
    for _ in range(ROUNDS):
        for pid in _procs(folder):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not _procs(folder):
            return True
        time.sleep(0.01)
    return False


def remove_tree(folder: str) -> bool:
    """rmdir `folder` and the folders below it, deepest first, again a while (a killed process
    leaves its cgroup a moment after it dies); whether it is gone."""
    for _ in range(ROUNDS):
        for below, _, _ in sorted(os.walk(folder), key=lambda w: -len(w[0])):
            _try_rmdir(below)
        if not os.path.exists(folder):
            return True
        time.sleep(0.01)
    return False


def _try_rmdir(folder: str) -> None:
    try:
        os.rmdir(folder)
    except OSError:
        pass


def remove_stale(parent: str) -> None:
    """Remove the executors' folders below `parent` whose grader is gone (killed before it could),
    killing what is still in them: named a4-world-PID-..., a4-grader-PID, PID no longer alive."""
    for name in os.listdir(parent) if os.path.isdir(parent) else []:
        fields = name.split("-")
        ours = len(fields) == (4 if name.startswith("a4-world-") else 3 if name.startswith("a4-grader-") else 0)
        if ours and fields[2].isdigit() and len(fields[2]) <= 7 and not _alive(int(fields[2])):
            if kill(os.path.join(parent, name)):
                remove_tree(os.path.join(parent, name))


def _alive(pid: int) -> bool:
    """Whether `pid` runs (or runs under another user: another grader's, or the id is reused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def end_world(folders: list) -> bool:
    """Kill everything in a world's folders and remove them; whether all went."""
    ended = True
    for folder in folders:
        if os.path.isdir(folder):
            ended = kill(folder) and remove_tree(folder) and ended
    return ended


def open_world(executor_folders: list) -> list:
    """Before a world, without the sandbox: a new folder below each of the executor's for the
    world's processes alone (its limits are the executor's folder's, which holds it), what an
    earlier world's zygote could not end first killed and removed. The folders made."""
    made = []
    for folder in executor_folders:
        path = os.path.join(folder, WORLD)
        end_world([path])
        try:
            os.mkdir(path, 0o755)
            made.append(path)
        except OSError:
            pass
    return made


class World:
    """One world's end, outside the sandbox: made in the zygote before it forks the world's leader
    (`cgroups`: the folders the leader joins), `end`ed after the leader is reaped."""

    def __init__(self, executor_cgroups: list, uid: int):
        self.uid = uid
        self.own_uid = uid != os.getuid()
        self.cgroups = open_world(executor_cgroups)
        self.before = None if self.own_uid else {top: _names(top, uid) for top in SWEPT}

    def end(self) -> list:
        """Kill what is left of the world, remove its files and its cgroup; what could not be
        (empty when the world ended whole)."""
        problems = []
        if not end_world(self.cgroups):
            problems.append("processes of the world's cgroup outlived it")
        if not kill_below(self.uid if self.own_uid else None):
            problems.append("processes of the world outlived it")
        for top in SWEPT:
            problems += [f"{path} could not be removed" for path in
                         remove_owned(self.uid, top, None if self.own_uid else self.before[top])]
        return problems


def processes_end(isolation) -> str:
    """Without the sandbox: how a world's processes end with it, for its isolation summary."""
    if isolation.sandbox or not isolation.watchdog:
        return ""
    how = ("its cgroup's processes killed" if isolation.cgroups else
           "no cgroup of its own: its leader or the helper adopts every orphan, all killed")
    also = ", and every process of its user id" if isolation.own_uid else ""
    return f"; all it starts ends with its world ({how}{also})"


def files_end(isolation) -> str:
    """Without the sandbox: which of a world's files are removed with it, for its isolation summary."""
    if isolation.sandbox or not isolation.watchdog:
        return ""
    return ("; what its user id owns in /tmp, /var/tmp and /dev/shm is removed with it" if isolation.own_uid else
            "; what the grader's user made in /tmp, /var/tmp and /dev/shm while it ran is removed with it "
            "(but folders named as the grader's own scratch)")
