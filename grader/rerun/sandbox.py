"""The sandbox around hand-in code: namespaces for a world, limits and an unprivileged user for a rank.

A world's ranks share (Linux, where the kernel allows it; `probe` finds out once):
- a PID namespace: the world is killed as a whole (every process it forked, whatever session or
  group it moved to), and its processes see nothing outside it;
- a network namespace with only its own loopback: gloo works between the ranks, nothing else is
  reachable, the grader's own 127.0.0.1 included;
- a mount namespace with a private root: the system's programs and libraries and Python (read
  only), the hand-in's code (read only), the world's folder, and a small /tmp. The reference
  solution, the rubric, the grader's outputs and other hand-ins are not in it;
- as root, a user id of its own, no privileges, no way to gain any. Without root, a user namespace
  provides the others where the kernel lets unprivileged users have one.
Every rank has limits on address space, processes (threads count), file size, CPU time, and one
compute thread. Which layers were active is reported with every result.
"""

import ctypes
import os
import platform
import random
import resource
import signal
import socket
import struct
import sys
import fcntl
from dataclasses import dataclass, field

from grader.limits import Limits

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(platform.machine())
READ_ONLY = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/sys"]

_libc = ctypes.CDLL(None, use_errno=True)


class SandboxError(OSError):
    """A sandbox layer that should work did not: the machine, not the hand-in, is at fault."""


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise SandboxError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype=None, flags=0, data=None):
    _check(_libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                       ctypes.c_ulong(flags), data and data.encode()), f"mount {target}")


def prctl(option, value):
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl {option}")


@dataclass
class Isolation:
    """Which layers a world gets; `probe` fills it in, results report it."""
    mode: str = "auto"                      # auto: what works; strict: all or infra_error; off: limits only
    pid: bool = False
    net: bool = False
    mount: bool = False
    user: bool = False                      # an unprivileged user namespace (running without root)
    own_uid: bool = False                   # ranks run as a user id of their own (running as root)
    problems: list = field(default_factory=list)

    def summary(self) -> dict:
        return {"mode": self.mode,
                "processes": "own PID namespace, killed as a whole" if self.pid else "process group",
                "network": "own network namespace, loopback only" if self.net else "NOT isolated",
                "files": ("private root: system, Python and the hand-in only" if self.mount else
                          "NOT isolated: the hand-in sees what its user may read"),
                "user": ("own unprivileged uid" if self.own_uid else
                         "user namespace" if self.user else "the grader's own user"),
                "limits": "address space, processes, file size, CPU time, 1 thread per rank",
                "problems": list(self.problems)}


def _lo_up():
    """Bring up the loopback interface of a new network namespace (SIOCGIFFLAGS / SIOCSIFFLAGS)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, request)[:18])[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def unshare_world(isolation: Isolation) -> None:
    """In a world's leader, before it forks: new namespaces for everything forked after."""
    flags = (CLONE_NEWPID if isolation.pid else 0) | (CLONE_NEWNET if isolation.net else 0) | \
            (CLONE_NEWNS if isolation.mount else 0)
    if not flags:
        return
    uid, gid = os.getuid(), os.getgid()
    if isolation.user:
        _check(_libc.unshare(CLONE_NEWUSER | flags), "unshare")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
    else:
        _check(_libc.unshare(flags), "unshare")
    if isolation.net:
        _lo_up()


def _bind(source, target, read_only=True, recursive=True):
    os.makedirs(target, exist_ok=True)
    _mount(source, target, None, MS_BIND | (MS_REC if recursive else 0))
    if read_only:
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def private_root(isolation: Isolation, limits: Limits, code_dir: str, work_dir: str) -> dict:
    """In the world's first process inside the new namespaces: build and enter its private root.

    Returns the paths the ranks use inside it: {"code_dir", "work_dir", "store"}.
    """
    if not isolation.mount:
        return {"code_dir": code_dir, "work_dir": work_dir, "store": os.path.join(work_dir, "store")}
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    root = os.path.join(work_dir, "root")
    os.makedirs(root, exist_ok=True)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    # The world's own /dev and /tmp first: Python itself may live under /tmp (a checkout there).
    os.makedirs(root + "/dev")
    _mount("tmpfs", root + "/dev", "tmpfs", MS_NOSUID, "size=64k,mode=755")
    for device in ("null", "zero", "random", "urandom"):
        open(f"{root}/dev/{device}", "w").close()
        _mount(f"/dev/{device}", f"{root}/dev/{device}", None, MS_BIND)
    os.makedirs(root + "/dev/shm")
    _mount("tmpfs", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={limits.tmp_mb}m,mode=1777")
    os.makedirs(root + "/tmp")
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={limits.tmp_mb}m,mode=1777")
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    for path in READ_ONLY + sorted(prefixes):
        if os.path.isdir(path) and not os.path.islink(path) and not any(
                path.startswith(top + "/") for top in READ_ONLY if os.path.isdir(top)):
            _bind(path, root + path)
        elif os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
    _bind(code_dir, root + "/a4/code", recursive=False)
    _bind(work_dir, root + "/a4/world", read_only=False, recursive=False)
    os.makedirs(root + "/proc")
    os.makedirs(root + "/.old")
    _check(_libc.syscall(SYS_PIVOT_ROOT, root.encode(), (root + "/.old").encode()), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "umount old root")
    os.rmdir("/.old")
    if isolation.pid:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV)
    return {"code_dir": "/a4/code", "work_dir": "/a4/world", "store": "/a4/world/store"}


def scratch_dir(prefix: str, parent=None) -> str:
    """A new temporary folder of the grader's that other users may pass through but not list: a
    world's own user reaches the folder made for it (by name, which it is given) and nothing else
    (sibling folders have random names it cannot read). Without a mount namespace that is all that
    keeps one hand-in's ranks from another hand-in's files."""
    import tempfile
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    os.chmod(path, 0o711)
    return path


def world_uid(isolation: Isolation) -> int:
    """A user id of the world's own (as root), so that the process limit counts this world alone."""
    return random.randint(200000, 2000000000) if isolation.own_uid else os.getuid()


def limit_rank(limits: Limits, uid: int) -> None:
    """In a rank, after its files are open and before any hand-in code: limits, then drop privileges."""
    def cap(kind, value):
        soft, hard = resource.getrlimit(kind)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (value, value))

    cap(resource.RLIMIT_AS, limits.memory_mb << 20)
    cap(resource.RLIMIT_FSIZE, limits.file_mb << 20)
    cap(resource.RLIMIT_CPU, limits.cpu_s)
    cap(resource.RLIMIT_CORE, 0)
    if uid != os.getuid():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    cap(resource.RLIMIT_NPROC, limits.processes)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = "1"


def _try_layer(isolation: Isolation, layer: str, scratch: str) -> str:
    """Why `layer` cannot be set up ('' when it can), tried in a throw-away process."""
    trial = Isolation(**{**isolation.__dict__, "pid": False, "net": False, "mount": False, layer: True})
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            unshare_world(trial)
            if layer == "mount":
                work, code = os.path.join(scratch, layer, "work"), os.path.join(scratch, layer, "code")
                os.makedirs(work)
                os.makedirs(code)
                private_root(trial, Limits(), code, work)
                assert os.path.isdir("/a4/code") and not os.path.exists(scratch), "the private root leaks"
                assert os.path.isdir(os.path.realpath(sys.prefix)), "Python is not in the private root"
            os._exit(0)
        except BaseException as e:  # noqa: BLE001 - any failure means the layer is not available
            os.write(write_fd, f"{type(e).__name__}: {e}"[:300].encode())
            os._exit(1)
    os.close(write_fd)
    why = os.read(read_fd, 400).decode(errors="replace")
    os.close(read_fd)
    return "" if os.waitpid(pid, 0)[1] == 0 else why or "it failed"


def probe(mode: str = "auto") -> Isolation:
    """Find out which layers work on this machine; in strict mode, missing ones are problems."""
    isolation = Isolation(mode=mode)
    if mode == "off" or sys.platform != "linux" or SYS_PIVOT_ROOT is None:
        if mode == "strict":
            isolation.problems.append("namespaces need Linux on x86_64 or aarch64")
        return isolation
    import shutil
    import tempfile
    root = os.geteuid() == 0
    isolation.user = not root
    isolation.own_uid = root
    scratch = tempfile.mkdtemp(prefix="a4-probe-")
    # A4_SANDBOX_DISABLE=net,mount turns layers off by hand (one that misbehaves on a machine).
    disabled = {x.strip() for x in os.environ.get("A4_SANDBOX_DISABLE", "").split(",") if x.strip()}
    why = {}
    try:
        for layer in ("pid", "net", "mount"):
            why[layer] = "turned off by A4_SANDBOX_DISABLE" if layer in disabled else \
                _try_layer(isolation, layer, scratch)
            setattr(isolation, layer, not why[layer])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    names = {"pid": "PID namespace", "net": "network namespace", "mount": "mount namespace"}
    missing = [f"{names[layer]} ({why[layer]})" for layer in names if not getattr(isolation, layer)]
    if missing:
        isolation.problems.append(f"not available on this machine: {'; '.join(missing)}"
                                  + ("" if root else " (without root they need unprivileged user namespaces)"))
    return isolation
