"""A world's writable folders, /tmp and /dev/shm: new and empty for every world.

Where worlds have namespaces of their own (grader.rerun.sandbox.namespaces.unshare_world), each world's mount
namespace gets a new tmpfs on both (`fresh`): nothing an earlier world left there, however it made
it unremovable, is in sight, and it all goes when the world's last process does. Its code folder
is mounted read only (`read_only`): no rank, whatever its user, writes bytecode or anything else
beside the code. Where worlds have no namespaces of their own, the zygote empties its own between
worlds and says whether it could (`clean_between_worlds`); when not, it exits and the executor
starts a new sandbox. Outside the sandbox, as root, a world whose ranks could not pass through a
folder above the Python (/root) gets a mount namespace of its own in which they can (`passable`).
"""

import ctypes
import os
import resource
import shutil
import signal
import stat
import sys

from grader.limits import TMP_FILES_PER_MB
from grader.rerun.sandbox import readable

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4
SCRATCH = ("/tmp", "/dev/shm")

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source, target, fstype, flags, data=None):
    if _libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                   ctypes.c_ulong(flags), data and data.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def python_links() -> dict:
    """{path: its target} for the prefixes of the Python in use that are reached through a link (a
    venv at ~/venv linked to /scratch/venv): Python runs by that name, so the sandbox makes the same
    link (grader.rerun.bwrap) and `fresh` makes it again in each world's /tmp."""
    paths = {os.path.abspath(p) for p in (sys.prefix, sys.base_prefix)}
    return {p: os.path.realpath(p) for p in sorted(paths) if os.path.realpath(p) != p}


def _inside_scratch(path: str) -> bool:
    return path.startswith(tuple(top + "/" for top in SCRATCH))


def fresh(tmp_mb: int) -> None:
    """In a new mount namespace: a new tmpfs on /tmp and on /dev/shm (what the zygote's held is out
    of sight), with what the sandbox made inside them for a Python under /tmp made again: its
    mounts bound back, its prefix's link (`python_links`) linked again."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    with open("/proc/self/mounts") as f:
        inside = sorted({line.split()[1] for line in f if _inside_scratch(line.split()[1])}, key=len)
    inside = [m for m in inside if not any(m.startswith(o + "/") for o in inside if o != m)]
    held = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in inside}
    try:
        for top in SCRATCH:
            _mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV,
                   f"mode=1777,size={tmp_mb << 20},nr_inodes={tmp_mb * TMP_FILES_PER_MB}")
        for path, fd in held.items():
            os.makedirs(path, mode=0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        _link_python()
    finally:
        for fd in held.values():
            os.close(fd)


def own_user_namespace(flags: int, own_user: bool = True) -> None:
    """unshare(2) the namespaces of `flags`, and a user namespace too when `own_user`, in which this
    process keeps its user and group ids (the one id an ordinary user may map)."""
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare((CLONE_NEWUSER if own_user else 0) | flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    if own_user:
        dumpable = _libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
        _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)   # an undumpable process may not write its own /proc/self files
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        _libc.prctl(PR_SET_DUMPABLE, dumpable, 0, 0, 0)


def rank_view(work_dir: str, code_dir: str, shared: list, tmp_mb: int, own_user: bool, nproc: int = 0) -> None:
    """In a rank, before it drops its capabilities: a mount and an IPC namespace of its own, so that
    ranks share no writable file system, no SysV or POSIX shared memory, no message queue. Its
    /tmp and /dev/shm are new (`fresh`); in its /tmp, the world's folder (its working folder) is
    made again, with only the code (read only) and the files of `shared` (the rank's own progress
    file) bound in; every other mount is read only.

    No rank may reach another's files through /proc (/proc/PID/root, cwd, fd: each needs the right
    to trace it). Ranks under a user id of the world's (root) are not dumpable (grader.rerun.sandbox.namespaces
    .limit_rank): only their privileged leader reads them. Ranks of the grader's one id (`own_user`)
    get a user namespace each: a rank may trace only what lives in its own, while the leader, which
    made its parent, still may. Its RLIMIT_NPROC (`nproc`) is set first: the kernel holds the
    world's count in the world's namespace to the limit the namespace's creator had
    (grader.rerun.sandbox.tasks)."""
    if _libc.unshare(CLONE_NEWNS | CLONE_NEWIPC) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")
    _rank_mounts(work_dir, code_dir, shared, tmp_mb)
    if own_user:
        if nproc:
            soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
            value = nproc if hard == resource.RLIM_INFINITY else min(nproc, hard)
            resource.setrlimit(resource.RLIMIT_NPROC, (value, value))
        own_user_namespace(0)


def _rank_mounts(work_dir: str, code_dir: str, shared: list, tmp_mb: int) -> None:
    held = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in [code_dir, *shared]}
    try:
        fresh(tmp_mb)   # the code folder, a mount inside /tmp, is bound back with the Python's
        os.makedirs(work_dir, mode=0o755, exist_ok=True)
        if not os.path.ismount(code_dir):
            os.makedirs(code_dir, mode=0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{held[code_dir]}", code_dir, None, MS_BIND)
        read_only(code_dir)
        for path in shared:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
            _mount(f"/proc/self/fd/{held[path]}", path, None, MS_BIND)
    finally:
        for fd in held.values():
            os.close(fd)
    _all_read_only(keep=set(SCRATCH) | set(shared))


# Flags a mount keeps when it is remounted read only: in a user namespace the kernel refuses a
# remount that would clear one that the namespace's creator set.
KEPT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": 8, "noatime": 1024, "nodiratime": 2048,
              "relatime": 1 << 21}


def _all_read_only(keep: set) -> None:
    """Every mount in this mount namespace read only, but those of `keep` and /proc, /sys: the
    sandbox's root (which an ordinary user's sandbox makes that user's), its /dev, the worlds'
    cgroup folders and whatever else is writable, so that no rank writes where another reads."""
    with open("/proc/self/mountinfo") as f:
        mounts = [(line.split()[4], line.split()[5].split(",")) for line in f]
    for point, options in mounts:
        point = point.replace("\\040", " ")
        if "ro" in options or point in keep or point.startswith(("/proc", "/sys")):
            continue
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        for name in options:
            flags |= KEPT_FLAGS.get(name, 0)
        _mount(None, point, None, flags)


def passable(blocked: list, keep: list) -> None:
    """In a mount namespace of the caller's own (unshared already, as root): each folder of `blocked`
    (one only its owner may pass, as /root) becomes an empty tmpfs every user may pass through, with
    the folders of `keep` below it (the Python's, grader.rerun.sandbox.readable) bound back at their own
    paths. Ranks under a user id of their own then reach the Python, and nothing else of the folder."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    for top in blocked:
        inside = [k for k in keep if k.startswith(top + "/")]
        inside = [k for k in inside if not any(k.startswith(o + "/") for o in inside if o != k)]
        held = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in inside}
        try:
            _mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
            for path, fd in held.items():
                folder = top
                for name in path[len(top) + 1:].split("/"):
                    folder = os.path.join(folder, name)
                    os.makedirs(folder, exist_ok=True)
                    os.chmod(folder, 0o755)   # whatever the umask: every rank's user passes
                _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        finally:
            for fd in held.values():
                os.close(fd)


def own_mounts(blocked: list, also: list = ()) -> None:
    """Outside the sandbox, as root: a mount namespace of this process's own in which a rank can pass
    the folders `blocked` to the Python below them, and to `also` (`passable`)."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")
    keep = set(readable.roots()) | {os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)
                                    and not p.startswith("/a4/")}
    passable(blocked, sorted(keep | {os.path.abspath(p) for p in also}))


# Read when the zygote imports this module, before any world ran: in the zygote's own /tmp (no
# namespaces for worlds) a world may have put a link of its own in their place since.
PYTHON_LINKS = python_links()


def _link_python() -> None:
    """Make again, in an empty /tmp, the links to the Python in use that lie inside it."""
    for path, target in PYTHON_LINKS.items():
        if _inside_scratch(path):
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            os.symlink(target, path)


def read_only(folder: str) -> None:
    """Mount `folder` on itself read only (inside a world's mount namespace): its ranks, whatever
    user they run as, can neither write into it nor undo that (they hold no capability)."""
    _mount(folder, folder, None, MS_BIND)
    _mount(None, folder, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def left_file(path: str, flags: int = os.O_RDONLY):
    """A descriptor of the file a rank left at `path`, opened with `flags`, where it is a regular
    file; None where it is not (or is gone). Where ranks have no view of their own (`--sandbox off`),
    a hand-in can put a FIFO, a link or a device in its files' place: none is waited on, followed or
    read, and the leader never hangs on what a rank left."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def clean_between_worlds() -> bool:
    """In the zygote, inside the sandbox only: kill every other process it can see (bwrap's init is
    immune), reap its children, and empty /tmp and /dev/shm for the next world. Whether they are
    empty now (a world with a /tmp of its own never touched the zygote's)."""
    if not os.environ.get("A4_IN_SANDBOX"):
        return True
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                break
        except ChildProcessError:
            break
    with open("/proc/self/mounts") as f:
        mounts = {line.split()[1] for line in f if _inside_scratch(line.split()[1])}
    for top in SCRATCH:
        _empty(top, mounts)
    if any(_leftovers(top, mounts) for top in SCRATCH):
        return False
    _link_python()   # removed with the rest: whatever a world put in its place is gone too
    return True


def _leftovers(folder: str, mounts: set) -> list:
    """What `_empty` could not remove from `folder`."""
    left = []
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if path not in mounts:
            left += _leftovers(path, mounts) if any(m.startswith(path + "/") for m in mounts) else [path]
    return left


def _empty(folder: str, mounts: set) -> None:
    """Remove everything in `folder` but the mount points in `mounts` (a Python bound under /tmp)
    and the folders that lead to them."""
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if path in mounts:
            continue
        if any(m.startswith(path + "/") for m in mounts):
            _empty(path, mounts)
        else:
            remove(path)


def remove(path: str) -> None:
    """Remove a file, a link or a whole folder (made writable where a world made it read only)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, onerror=_writable_then_retry)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def _writable_then_retry(function, path, _):
    """rmtree's error handler: a folder a world made read only is made writable (its owner may),
    then the removal is tried once more; what still fails stays, and the caller sees it."""
    try:
        os.chmod(os.path.dirname(path), 0o700)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            shutil.rmtree(path, ignore_errors=True)
        else:
            function(path)
    except OSError:
        pass
