"""The sandbox inside the job sandbox: a namespace set per world, limits per rank, a clean slate
between worlds. grader.rerun.bwrap builds the job sandbox around all of it.

bubblewrap isolates the zygote from the machine; this module isolates one world from the next
inside it, and that part stays hand-written: a warm zygote forks worlds from a process that has
imported torch once, and bwrap can only start a new process. So each world's leader, before it
forks any rank,

- unshares PID, network, IPC and mount namespaces of its own: a world's processes see no other
  world's, its loopback is its own, its SysV objects die with it, its /tmp and /dev/shm are new
  empty file systems (nothing an earlier world left, however made unremovable, is there) and its
  code folder is read only (no rank writes bytecode beside it); and either a user id no other
  world has (the grader is root: bwrap's user namespace maps a range of ids) or a user namespace
  of its own (an ordinary user's single id);
- is the parent of ranks that drop every capability (no CAP_NET_ADMIN: no socket buffer forced
  past the machine's maximum), set no_new_privs, and take the rubric's limits on file size and CPU
  time, RANK_OPEN_FILES open files (grader.limits), one compute thread each
  (grader.rerun.sandbox.environment), and no more data than they hold at their fork plus the world's
  memory (RLIMIT_DATA: never below what the Python already maps, which torch's CUDA build makes
  3 GB of address space at `import torch`).

The world as a whole, all its ranks and their children, is held to limits.memory_mb and
limits.processes by a cgroup of its own where the grader can have one (grader.rerun.sandbox.cgroup) and
by its leader's watchdog (grader.rerun.sandbox.memory) everywhere; RLIMIT_NPROC only where it counts this
world alone (grader.rerun.sandbox.tasks). Between worlds the zygote kills every other process it can see
and empties its /tmp and /dev/shm (grader.rerun.sandbox.scratch, which also gives each world new ones).
Without bwrap (`--sandbox off`, a student's own machine, a container without user namespaces)
none of the namespaces exist; ranks run as a user id of their own when the grader is root, so
files only root may read stay unreadable (and a world whose ranks could not reach the Python then,
as under /root, gets a mount namespace in which they can: grader.rerun.sandbox.scratch.passable). Before
any world, the zygote checks that ranks can read every folder the Python loads from
(grader.rerun.sandbox.readable); where not, grading refuses. `Isolation.summary()` says what held, for
every result; a laptop without /proc or prctl (macOS) runs plain forked worlds and says so.
"""

import ctypes
import fcntl
import os
import random
import resource
import signal
import socket
import struct
import sys
from dataclasses import dataclass, field

from grader.limits import RANK_OPEN_FILES, Limits
from grader.rerun.sandbox import cgroup, memory, pss, readable, scratch, sweep, tasks

CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWIPC = 0x10000000, 0x20000000, 0x40000000, 0x08000000
CLONE_NEWNS = 0x00020000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 4, 38, 36
CAPABILITY_VERSION_3 = 0x20080522

LINUX = sys.platform.startswith("linux")
_libc = ctypes.CDLL(None, use_errno=True)


class SandboxError(OSError):
    """A sandbox layer that should work did not: the machine, not the hand-in, is at fault."""


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise SandboxError(err, f"{what}: {os.strerror(err)}")


def prctl(option, value):
    """prctl(2) on Linux; elsewhere (a laptop's `check`) nothing: those layers are not there."""
    if LINUX:
        _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl {option}")


@dataclass
class Isolation:
    """Which layers hold; the zygote fills it in from inside (`probe`), every result reports it."""
    mode: str = "auto"          # auto: the full sandbox, or grade refuses; off: limits only; best: what works
    sandbox: str = ""           # "bubblewrap 0.11.0" when the zygote runs inside it
    files: bool = False         # a private root: system, Python and the engine only
    network: bool = False       # an own network namespace with only its loopback
    processes: bool = False     # an own PID namespace: nothing outside is visible or signalable
    per_world: bool = False     # each world in namespaces of its own inside the sandbox, /tmp and /dev/shm new
    per_rank: bool = False      # each rank, too, in a mount and IPC namespace of its own (its own /tmp, /dev/shm)
    own_uid: bool = False       # without namespaces, as root: ranks under a user id of their own
    id_range: int = 1           # user ids the sandbox maps (more than 1: a fresh one per world)
    cgroups: list = field(default_factory=list)      # the world's cgroup folders, as the zygote sees them
    controllers: list = field(default_factory=list)  # what they hold: "memory", "pids"
    tasks: str = ""             # the tasks.Hold that bounds a world's tasks, by name
    watchdog: bool = True       # /proc is there: the world's leader watches its memory and tasks
    refused: str = ""           # the calls every rank is refused (grader.rerun.rank.syscalls), "" where none
    passable: list = field(default_factory=list)     # folders above the Python each world opens (no sandbox, root)
    uid: int = -1               # the user id the zygote runs as
    problems: list = field(default_factory=list)
    unfit: list = field(default_factory=list)   # why no world can run right here: grading refuses, any mode

    @property
    def complete(self) -> bool:
        return self.files and self.network and self.processes

    def summary(self) -> dict:
        held = tasks.Hold[self.tasks].value if self.tasks else tasks.Hold.WATCHDOG.value
        memory = ("held by a memory cgroup of the world's own and the watchdog" if "memory" in self.controllers else
                  "held by the watchdog (no memory cgroup)" if self.watchdog else "NOT held (no /proc to watch it)")
        return {"mode": self.mode, "sandbox": self.sandbox or "none",
                "processes": ("own PID namespace" + (", one per world" if self.per_world else "")
                              if self.processes else "process group" + sweep.processes_end(self)),
                "network": "own network namespace, loopback only" if self.network else "NOT isolated",
                "files": ("private root: system, Python and the hand-in only" if self.files else
                          "NOT isolated: the hand-in sees what its user may read" + (
                              f" (of {', '.join(self.passable)}, only the Python: each world's own mount namespace)"
                              if self.passable else "")),
                "user": ("an unprivileged user id of its own per world" if self.own_uid or self.id_range > 1 else
                         "the grader's user, in a user namespace of its own" if self.sandbox else
                         f"the grader's own user (uid {self.uid})"),
                "limits": ("per process: data past what it holds at its fork (RLIMIT_DATA), file size, CPU time; "
                           "1 compute thread, no GPU; " + (f"{self.refused} refused" if self.refused else
                                                          "memory files NOT refused (no seccomp filter)")),
                "memory": f"the world's processes together, at most limits.memory_mb: {memory}",
                "tasks": f"the world's processes and threads together, at most limits.processes: {held}",
                "scratch": ("a new /tmp and /dev/shm per world and per rank, the code read only" if self.per_rank else
                            "a new /tmp and /dev/shm per world, shared by its ranks, the code read only"
                            if self.per_world else
                            "/tmp and /dev/shm emptied between worlds (a new sandbox when they cannot be)"
                            if self.sandbox else
                            "a new folder per world, its TMPDIR; its ranks share the machine's /tmp and /dev/shm"
                            + sweep.files_end(self)),
                "problems": list(self.problems), "unfit": list(self.unfit)}


def _lo_up():
    """Bring up the loopback interface of a new network namespace (SIOCGIFFLAGS / SIOCSIFFLAGS)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, request)[:18])[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def unshare_world(isolation: Isolation, tmp_mb: int = 64) -> None:
    """In a world's leader, before it forks: PID, network, IPC and mount namespaces of its own for
    everything it forks after (the leader's next child is the new PID namespace's init), a new /tmp
    and /dev/shm, and a user namespace too unless its ranks get an id of their own."""
    try:
        scratch.own_user_namespace(CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWNS, isolation.id_range <= 1)
    except OSError as e:
        raise SandboxError(e.errno, f"unshare: {e.strerror}") from None
    try:
        scratch.fresh(tmp_mb)
    except OSError as e:
        raise SandboxError(e.errno, f"a new /tmp for the world: {e.strerror}") from None
    _lo_up()


def _rank_view_here(isolation: Isolation) -> None:
    """What a rank's view takes (grader.rerun.sandbox.scratch.rank_view), tried in a world of its own by `probe`."""
    unshare_world(isolation)
    os.makedirs("/tmp/world/code")
    scratch.read_only("/tmp/world/code")
    open("/tmp/world/store", "w").close()
    scratch.rank_view("/tmp/world", "/tmp/world/code", ["/tmp/world/store"], 1, isolation.id_range <= 1)


def _drop_capabilities() -> None:
    """No capability left, in any set: a world's user namespace gives its leader all of them."""
    header = struct.pack("Ii", CAPABILITY_VERSION_3, 0)
    data = ctypes.create_string_buffer(bytes(24))
    _check(_libc.capset(ctypes.c_char_p(header), data), "capset")


def scratch_dir(prefix: str, parent=None) -> str:
    """A new temporary folder of the grader's that other users may pass through but not list: a
    rank running under its own user id reaches the folder made for it (by name, which it is given)
    and nothing else."""
    import tempfile
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    os.chmod(path, 0o711)
    return path


def world_uid(isolation: Isolation) -> int:
    """The user id a world's ranks run as: a fresh one of the sandbox's range, or (without a sandbox,
    as root) a fresh one of the machine's, else our own."""
    if isolation.id_range > 1:
        return random.randint(1, isolation.id_range - 1)
    return random.randint(200_000, 1_000_000_000) if isolation.own_uid else os.getuid()


def limit_rank(limits: Limits, uid: int, nproc: int = 0, dumpable: bool = True) -> None:
    """In a rank, after its files are open and before any hand-in code: limits, then no privileges.
    `nproc`: its RLIMIT_NPROC (grader.rerun.sandbox.tasks.rank_nproc; 0: none); `dumpable`: False where
    its watchdog may read it anyway (a leader privileged over the ranks' user id)."""
    def cap(kind, value):
        soft, hard = resource.getrlimit(kind)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (value, value))

    data = pss.data_size()
    if data:   # one process alone may not take more than the world may: refused at once, a clean MemoryError
        cap(resource.RLIMIT_DATA, data + (limits.memory_mb << 20))
    cap(resource.RLIMIT_FSIZE, limits.file_mb << 20)
    cap(resource.RLIMIT_CPU, limits.cpu_s)
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_NOFILE, RANK_OPEN_FILES)
    if uid != os.getuid():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    if nproc:
        cap(resource.RLIMIT_NPROC, nproc)
    # Dumpable again (the leader is not, and a change of user id clears it): the world's watchdog, where
    # it runs as this user without privilege (no namespaces), reads the rank's Pss, not its resident set,
    # which counts every page shared with the zygote once per rank (4 ranks of torch's CUDA build: 2 GB).
    prctl(PR_SET_DUMPABLE, 1 if dumpable else 0)
    cgroup.first_to_die()   # its /proc is its own to write only now (grader.rerun.world.fork_rank did as root)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
    if LINUX and (os.environ.get("A4_IN_SANDBOX") or uid != 0):
        try:
            _drop_capabilities()
        except SandboxError:
            pass   # no capabilities to drop outside a user namespace of our own
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def in_child(attempt) -> str:
    """Run `attempt` in a forked child: '' when it returned, else what it raised."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            attempt()
            os._exit(0)
        except BaseException as e:  # noqa: BLE001 - any failure means the layer is not there
            os.write(write_fd, f"{type(e).__name__}: {e}"[:300].encode())
            os._exit(1)
    os.close(write_fd)
    why = os.read(read_fd, 400).decode(errors="replace")
    os.close(read_fd)
    return "" if os.waitpid(pid, 0)[1] == 0 else why or "it failed"


def _readable(isolation: Isolation) -> None:
    """Can ranks under a user id of their own read this Python? Where a folder above it bars them
    outside the sandbox, each world opens it in a mount namespace of its own, if this machine allows
    one; what still cannot be read makes the machine unfit (grading refuses, naming it)."""
    uid = world_uid(isolation)
    found = readable.check_as(uid)
    blocked = found.above
    if blocked and not isolation.sandbox and os.geteuid() == 0 and not in_child(lambda: scratch.own_mounts(blocked)):
        isolation.passable = blocked
        found = readable.check_as(uid, prepare=lambda: scratch.own_mounts(blocked))
    problem = found.problem(isolation.mode)
    if problem:
        isolation.unfit.append(problem)


def probe(mode: str, kit_root: str = "", sandbox: str = "", cgroups: list = ()) -> Isolation:
    """What holds for the processes of this zygote, seen from inside: `kit_root` (the kit's folder on
    the machine) must not be visible, only the loopback, only this sandbox's processes; `cgroups`
    are the world's cgroup folders (grader.rerun.sandbox.cgroup) the executor made."""
    isolation = Isolation(mode=mode, sandbox=sandbox, uid=os.getuid(), watchdog=os.path.isdir("/proc/self/task"))
    isolation.cgroups = [c for c in cgroups if os.access(os.path.join(c, "cgroup.procs"), os.W_OK)]
    isolation.controllers = sorted({name for c in isolation.cgroups for name, files in
                                    (("memory", ("memory.max", "memory.limit_in_bytes")), ("pids", ("pids.max",)))
                                    if any(os.path.exists(os.path.join(c, f)) for f in files)})
    if not os.environ.get("A4_IN_SANDBOX") or not LINUX:
        isolation.own_uid = LINUX and os.geteuid() == 0
        _finish(isolation, own_userns=False)
        return isolation
    if os.getuid() == 0:   # root inside: the ids the sandbox maps, one of them per world
        with open("/proc/self/uid_map") as f:
            isolation.id_range = sum(int(line.split()[2]) for line in f if line.strip())
    # The kit's folder may show (a venv inside it is bound, or it is the site-packages `pip install .`
    # put the kit in, its folders then hidden under empty ones), but nothing of the kit itself.
    isolation.files = bool(kit_root) and not any(
        os.path.exists(os.path.join(kit_root, name))
        for name in ("grader/kit.py", "grader/rubric.yaml", "assignment_4/utils.py", "requirements.txt"))
    isolation.network = [name for _, name in socket.if_nameindex()] == ["lo"]
    with open("/proc/1/cmdline", "rb") as f:
        isolation.processes = b"bwrap" in f.read() and len([p for p in os.listdir("/proc") if p.isdigit()]) < 16
    why = in_child(lambda: unshare_world(isolation))
    isolation.per_world = not why
    alone = in_child(lambda: _rank_view_here(isolation)) if isolation.per_world else why
    isolation.per_rank = not alone
    if isolation.per_world and alone:
        isolation.problems.append(f"the ranks of a world share its /tmp, /dev/shm and IPC ({alone})")
    names = {"files": "a private root", "network": "a network namespace", "processes": "a PID namespace"}
    missing = [text for layer, text in names.items() if not getattr(isolation, layer)]
    if missing:
        isolation.problems.append(f"the sandbox started without {', '.join(missing)}")
    if why:
        isolation.problems.append(f"worlds share the job sandbox's namespaces ({why})")
    # Without a world namespace of its own, the sandbox's user namespace still counts the sandbox alone.
    _finish(isolation, own_userns=True)
    return isolation


def _finish(isolation: Isolation, own_userns: bool) -> None:
    """What bounds a world's tasks, and whether ranks of an id of their own can read the Python."""
    held = tasks.hold(isolation.own_uid or isolation.id_range > 1, own_userns, "pids" in isolation.controllers)
    isolation.tasks = held.name
    problem = memory.address_space_problem()
    if problem:
        isolation.unfit.append(problem)
    if not isolation.watchdog:
        isolation.problems.append("no /proc here: nothing watches a world's memory and tasks, "
                                  "and a world has no limit on them but its processes' own")
    if isolation.own_uid or isolation.id_range > 1:
        _readable(isolation)
