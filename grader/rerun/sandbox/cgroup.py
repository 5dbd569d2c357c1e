"""The kernel's hold on a world: a memory and a pids cgroup of the world's own, where one can be had.

`WorldCgroup.make()`, in the grader, makes one folder per cgroup hierarchy for an executor's worlds
(one world at a time runs in it) and `limit` sets, before each world, what the world may use:

    memory.max (v2) / memory.limit_in_bytes (v1) = limits.memory_mb, swap none where it can be said
    pids.max                                    = limits.processes + LEADER_TASKS (its leader and init)
    memory.kmem.tcp.limit_in_bytes (v1)         = limits.memory_mb / SOCKETS_SHARE, where the kernel has it

v1 charges no socket buffer to the memory limit; its TCP limit holds the world's TCP sockets where
the watchdog, reading every 20 ms, is outrun (loopback queues hundreds of MB between two readings).

Each world's leader moves itself into every folder (`join`) before it forks anything, so all the
world starts is counted, and nothing else. When the kernel's out-of-memory killer acts there, the
leader's watchdog sees it (`oom_kills`) and ends the world as out of memory. Each rank puts itself
first in the killer's line (`first_to_die`): the kill takes the hand-in's processes, never the
world's supervisor, whose loss would read as a crash.

Where one can be had:
- root, cgroup v1: below the grader's own cgroup in the memory and the pids hierarchy;
- cgroup v2 (root, or an ordinary user with a delegated subtree): below the deepest cgroup above
  the grader's own that it may write and whose children get the memory controller. A user's cgroup
  that is delegated but holds the grader itself (`systemd-run --user --scope -p Delegate=yes
  python -m grader ...`) gets it too: the grader first moves itself into a leaf of its own, since
  cgroup v2 gives controllers only to the children of a cgroup without processes. The sandbox then
  keeps the machine's cgroup namespace (a world's leader may move only within its namespace).
- inside a Slurm job the job's own cgroup bounds the whole batch (`slurm_job_limit` reads it, doctor
  and grade report it); worlds inside it are held by a cgroup of their own only where the job lets
  the grader make one, else by the watchdog.
Everywhere else (an ordinary user without delegation, a laptop) the watchdog alone holds a world.
"""

import os
import secrets

from grader.limits import SOCKETS_SHARE
from grader.rerun.sandbox import sweep

CGROUP = "/a4-cgroup"   # where the world's folders are bound inside the sandbox: /a4-cgroup/0, /a4-cgroup/1
LEADER_TASKS = 4        # the world's leader, its watchdog thread, its PID namespace's init: counted beside the world
V1_LIMITS = {"memory": ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.kmem.tcp.limit_in_bytes"),
             "pids": ("pids.max",)}
V2_LIMITS = ("memory.max", "memory.swap.max", "pids.max")
OOM_SCORE_ADJ = 1000    # a rank's, the most: the out-of-memory killer picks it (and all it starts) before any other


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _try(path: str, text: str) -> bool:
    try:
        _write(path, text)
        return True
    except OSError:
        return False


def _mounts() -> list:
    """(mount point, type, options) of every cgroup file system mounted here."""
    found = []
    for line in _read("/proc/self/mounts").splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[2] in ("cgroup", "cgroup2"):
            found.append((fields[1], fields[2], fields[3].split(",")))
    return found


def _own() -> dict:
    """The grader's cgroup per hierarchy: controller name (or "" for v2) -> path below the mount."""
    own = {}
    for line in _read("/proc/self/cgroup").splitlines():
        number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if number == "0":
            own[""] = path
        for name in controllers.split(","):
            own.setdefault(name, path)
    return own


class WorldCgroup:
    """The cgroup folders of one executor's worlds (one world at a time), and their limits."""
    why = ""   # why the last `make` gave none

    def __init__(self, folders: dict, version: int):
        self.folders, self.version = folders, version   # controller ("memory", "pids", "" for v2) -> folder

    @property
    def controllers(self) -> set:
        if self.version == 2:
            return {name for name in ("memory", "pids") if os.path.exists(os.path.join(self.folders[""], f"{name}.max"))}
        return set(self.folders)

    def paths(self, sandboxed: bool) -> list:
        """The folders as the zygote sees them: bound at CGROUP/0, CGROUP/1 ... inside the sandbox."""
        return [f"{CGROUP}/{i}" for i in range(len(self.folders))] if sandboxed else list(self.folders.values())

    def limit(self, memory_mb: int, tasks: int) -> None:
        """Before a world: at most `memory_mb` of memory (no swap where that can be said) and `tasks`
        processes and threads for everything in the folders."""
        values = {"memory.max": memory_mb << 20, "memory.limit_in_bytes": memory_mb << 20,
                  "memory.swap.max": 0, "memory.memsw.limit_in_bytes": memory_mb << 20, "pids.max": tasks,
                  "memory.kmem.tcp.limit_in_bytes": memory_mb // SOCKETS_SHARE << 20}
        present = self.controllers
        for controller, folder in self.folders.items():
            # v2: a parent may give its children memory and not pids (a GPU node's /process_api);
            # a file of a controller not given is not there, and writing it is refused (EACCES).
            names = [n for n in V2_LIMITS if n.split(".")[0] in present] if self.version == 2 else \
                V1_LIMITS.get(controller, ())
            if "memory.memsw.limit_in_bytes" in names:   # v1 keeps memory+swap at or above memory: lift it first
                _try(os.path.join(folder, "memory.memsw.limit_in_bytes"), "-1")
            for name in names:
                path = os.path.join(folder, name)
                if name in ("memory.max", "memory.limit_in_bytes", "pids.max"):
                    _write(path, str(values[name]))
                else:   # swap accounting may be off, a kernel may have no TCP limit: the memory limit alone then holds
                    _try(path, str(values[name]))

    def remove(self) -> None:
        """Kill what is still in the folders (a world's, without the sandbox), and remove them."""
        for folder in self.folders.values():
            if sweep.kill(folder):
                sweep.remove_tree(folder)

    @classmethod
    def make(cls):
        """A new one for an executor's worlds, or None where this user or machine gives none (and
        `why` says so)."""
        cls.why = ""
        mounts, own = _mounts(), _own()
        if not mounts:
            cls.why = "no cgroup file system is mounted"
            return None
        v1 = {}
        if os.geteuid() == 0:
            for point, kind, options in mounts:
                for controller in ("memory", "pids"):
                    if kind == "cgroup" and controller in options and controller in own and controller not in v1:
                        folder = cls._new(point + own[controller], V1_LIMITS[controller][0])
                        if folder:
                            v1[controller] = folder
            if "memory" in v1:
                return cls(v1, 1)
            for folder in v1.values():
                os.rmdir(folder)
        v2 = next((point for point, kind, _ in mounts if kind == "cgroup2"), None)
        if v2 is None or "" not in own:
            cls.why = cls.why or ("no memory cgroup for an ordinary user on cgroup v1" if os.geteuid() else
                                  "no memory controller is mounted")
            return None
        base = _v2_base(v2, own[""])
        folder = cls._new(base, "memory.max") if base else ""
        if not folder:
            cls.why = cls.why or _v2_why(v2, own[""])
            return None
        return cls({"": folder}, 2)

    @classmethod
    def _new(cls, parent: str, needed: str) -> str:
        """A new folder below `parent` that has the file `needed` ('' where none can be made)."""
        sweep.remove_stale(parent)
        path = os.path.join(parent, f"a4-world-{os.getpid()}-{secrets.token_hex(6)}")
        try:
            os.mkdir(path, 0o755)
        except OSError as e:
            cls.why = f"a cgroup could not be made below {parent} ({e.strerror})"
            return ""
        if os.path.exists(os.path.join(path, needed)):
            return path
        os.rmdir(path)
        cls.why = f"the cgroup {parent} gives its children no {needed.split('.')[0]} controller"
        return ""


def _subtree(folder: str) -> set:
    return set(_read(os.path.join(folder, "cgroup.subtree_control")).split())


def _writable(folder: str) -> bool:
    return os.access(folder, os.W_OK) and os.access(os.path.join(folder, "cgroup.procs"), os.W_OK)


def _v2_base(mount: str, own: str) -> str:
    """The cgroup v2 folder a world's cgroup goes below: the deepest cgroup at or above the grader's
    own that this user may write and whose children get memory (and pids); else the grader's own,
    when it is delegated to this user and holds nothing but the grader, after the grader has moved
    into a leaf of its own and given its children the controllers. '' when there is none."""
    folder = os.path.normpath(mount + own)
    while folder.startswith(mount):
        if _writable(folder) and "memory" in _subtree(folder):
            return folder
        if folder == mount:
            break
        folder = os.path.dirname(folder)
    folder = os.path.normpath(mount + own)
    offered = set(_read(os.path.join(folder, "cgroup.controllers")).split())
    if folder == mount or not _writable(folder) or "memory" not in offered:
        return ""
    procs = _read(os.path.join(folder, "cgroup.procs")).split()
    if procs != [str(os.getpid())]:
        return ""   # other processes share it: they cannot all be moved for the grader
    leaf = os.path.join(folder, f"a4-grader-{os.getpid()}")
    try:
        os.makedirs(leaf, exist_ok=True)
        _write(os.path.join(leaf, "cgroup.procs"), "0")
        _write(os.path.join(folder, "cgroup.subtree_control"), " ".join(f"+{c}" for c in ("memory", "pids")
                                                                        if c in offered))
    except OSError:
        return ""
    return folder


def _v2_why(mount: str, own: str) -> str:
    folder = os.path.normpath(mount + own)
    if os.environ.get("SLURM_JOB_ID"):
        return (f"inside Slurm job {os.environ['SLURM_JOB_ID']}, whose cgroup is not the grader's to divide: the "
                f"job's own limit bounds the whole batch, the watchdog each world")
    if os.geteuid() == 0:
        return f"no cgroup above {folder} gives its children the memory controller"
    if not _writable(folder):
        return f"your cgroup ({own}) is not delegated to you: {scope_hint()}"
    return (f"your cgroup ({own}) holds other processes besides the grader, or offers no memory controller: "
            f"{scope_hint()}")


SCOPE = "systemd-run --user --scope -p Delegate=yes python -m grader ..."


def scope_hint(environ=None) -> str:
    """How to give the grader a delegated cgroup of its own. `systemd-run --user` talks to the
    user's systemd manager over its bus ($XDG_RUNTIME_DIR/bus): without one (su, sudo -u, a session
    that did not log in through PAM) it fails with "Failed to connect to bus", so the step that
    starts one is given instead of a command that cannot work."""
    environ = os.environ if environ is None else environ
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if environ.get("DBUS_SESSION_BUS_ADDRESS") or (runtime and os.path.exists(os.path.join(runtime, "bus"))):
        return f"start the grader in a scope of its own, {SCOPE}"
    return (f"start the grader in a scope of its own ({SCOPE}), which needs your user's systemd manager, "
            f"absent from this session (no $XDG_RUNTIME_DIR/bus): log in as that user (ssh or a console, not "
            f"su or sudo -u), after `loginctl enable-linger USER` as root where none runs; until then the "
            f"watchdog alone holds each world")


def slurm_job_limit() -> int:
    """Inside a Slurm job: the memory limit of the job's cgroup in MB (0: none, or not in a job)."""
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job:
        return 0
    own = _own()
    for point, kind, options in _mounts():
        path = own.get("") if kind == "cgroup2" else own.get("memory") if "memory" in options else None
        if not path or f"job_{job}" not in path:
            continue
        folder = point + path[:path.index(f"job_{job}") + len(f"job_{job}")]
        for name in ("memory.max", "memory.limit_in_bytes"):
            text = _read(os.path.join(folder, name))
            if text.isdigit() and int(text) < 1 << 60:
                return int(text) >> 20
    return 0


# ---- in a world's leader ------------------------------------------------------------------------

def join(folders: list) -> bool:
    """Move this process (before it forks anything) into each of `folders`; whether all took it.

    A process of one thread (a leader just forked: a fork copies only the thread that forked) moves
    on cgroup v1 by its thread's id, through the folder's `tasks`: the kernel then locks that thread
    alone. Moved through `cgroup.procs`, its whole thread group, the kernel first makes every
    process's fork wait on a lock it takes for writing, and waits an RCU grace period for that
    (Linux 6.1 and later; older kernels take that lock either way): 8 ms to 17 ms a world here,
    every world. cgroup v2 moves processes only (`cgroup.procs`)."""
    joined, alone = True, _one_thread()
    for folder in folders:
        tasks = os.path.join(folder, "tasks")
        try:
            _write(tasks if alone and os.path.exists(tasks) else os.path.join(folder, "cgroup.procs"), "0")
        except OSError:
            joined = False
    return joined


def _one_thread() -> bool:
    """Whether this process has one thread (False where /proc cannot say)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def oom_kills(folders: list) -> int:
    """How many processes the kernel killed for memory in `folders` (v1 or v2) so far."""
    total = 0
    for folder in folders:
        for name in ("memory.events", "memory.oom_control"):
            for line in _read(os.path.join(folder, name)).splitlines():
                if line.startswith("oom_kill "):
                    total += int(line.split()[1])
    return total


def first_to_die() -> None:
    """In a rank, before it gives up its privileges: the rank, and all it starts, first in line when
    the kernel's out-of-memory killer picks. Raising it needs no privilege; a write with
    CAP_SYS_RESOURCE (root's, but in containers that drop it) also sets the floor the rank may not go
    below, else the rank may lower it to 0 (never below)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(OOM_SCORE_ADJ))
    except OSError:
        pass   # no /proc (not Linux): no such killer either
