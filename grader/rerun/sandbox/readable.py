"""Whether a rank, under a user id of its own, can read the Python it runs on.

A rank that runs under an id of its own (the grader is root) imports what the zygote imported
already from memory, but anything later (`import sched` inside a part, a lazy torch submodule, a
library dlopen'd on first use) from the disk, as that id. A Python under /root, or installed under
umask 077, then fails there, and correct code would score 0. So before any hand-in runs, the zygote
tries, as such an id, every folder the Python can load from (`roots`: sys.path, the folders of
LD_LIBRARY_PATH and of libpython, the interpreter's own), every folder below them (listing each),
and the files at their top two levels (the modules a part imports by name), and says what failed:

    above: folders above a root the id cannot pass (only their owner may: /root, a home directory);
           the sandbox makes them passable (grader.rerun.bwrap), and so does a world's own mount
           namespace outside it (grader.rerun.sandbox.scratch.passable), where one can be made;
    below: folders inside a root it cannot list, files it cannot read: nothing but a change of
           their permissions helps (chmod -R o+rX), and grading refuses, naming them.

Site-packages folders that are not on sys.path (a base Python's, under a venv) are not walked.
"""

import os
import sys
import sysconfig
from dataclasses import dataclass, field

SHOWN = 5   # folders named in a message


def roots() -> list:
    """The outermost folders this Python loads from (real paths), the engine's own excluded."""
    wanted = {p for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p) and not p.startswith("/a4/")}
    wanted |= {p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p and os.path.isdir(p)}
    library = sysconfig.get_config_var("LIBDIR")
    if library and os.path.isdir(library) and sysconfig.get_config_var("Py_ENABLE_SHARED"):
        wanted.add(library)
    wanted.add(os.path.dirname(os.path.realpath(sys.executable)))
    kept = []
    for path in sorted({os.path.realpath(p) for p in wanted}, key=len):
        if not any(path == k or path.startswith(k + "/") for k in kept):
            kept.append(path)
    return kept


@dataclass
class Readability:
    above: list = field(default_factory=list)   # folders above a root the id cannot pass
    below: list = field(default_factory=list)   # folders or files inside a root it cannot read

    def problem(self, mode: str) -> str:
        """The message that names what failed and the fix ('' when nothing did)."""
        if self.below:
            return (f"the ranks run under a user id of their own and cannot read {', '.join(self.below[:SHOWN])}"
                    f"{' and more' if len(self.below) > SHOWN else ''}: make the Python installation readable to "
                    f"every user (chmod -R o+rX on it), or install it where it is")
        if self.above:
            return (f"the ranks run under a user id of their own and cannot pass through "
                    f"{', '.join(self.above[:SHOWN])} (only its owner may) to the Python installed below it, and "
                    f"this machine lets no world have a mount namespace of its own to open the way: let other users "
                    f"pass (chmod o+x {self.above[0]}: they can then reach the folders below by name, list "
                    f"nothing), install Python where every user can read it, or grade "
                    f"{'with the sandbox' if mode == 'off' else 'as an ordinary user'}")
        return ""


def _readable(path: str) -> bool:
    """This id can read `path`; a link to nothing is no barrier of permissions (a distribution's
    link whose target is not installed, the same for every user) and counts as readable."""
    if os.access(path, os.R_OK):
        return True
    try:
        os.stat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def _walk(root: str, depth: int, found: list) -> None:
    try:
        entries = list(os.scandir(root))
    except OSError:
        found.append(root)
        return
    for entry in entries:
        if len(found) > SHOWN:
            return
        try:
            if entry.is_dir(follow_symlinks=False):
                if entry.name in ("site-packages", "dist-packages") and entry.path not in sys.path:
                    continue
                _walk(entry.path, depth + 1, found)
            elif depth < 2 and entry.name.endswith((".py", ".so")) and not _readable(entry.path):
                found.append(entry.path)
        except OSError:
            found.append(entry.path)


def blocked_above(paths: list) -> list:
    """The folders above `paths` this process cannot pass through, outermost first."""
    blocked = []
    for path in paths:
        folder = os.path.dirname(path)
        chain = []
        while folder not in ("/", ""):
            chain.append(folder)
            folder = os.path.dirname(folder)
        for folder in reversed(chain):
            if not os.access(folder, os.X_OK):
                if folder not in blocked:
                    blocked.append(folder)
                break
    return blocked


def check_as(uid: int, paths: list = None, prepare=None) -> Readability:
    """What a process of user id `uid` cannot read of this Python (see the module docstring). Tried
    in a child that takes that id, after calling `prepare` (as root: a world's own mount namespace);
    the caller must be root."""
    paths = roots() if paths is None else paths
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            if prepare is not None:
                prepare()
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            above = blocked_above(paths)
            below = []
            for path in paths:
                if not any(path.startswith(a + "/") for a in above):
                    _walk(path, 0, below)
        except BaseException:  # noqa: BLE001 - whatever failed, nothing was shown readable
            above, below = [], list(paths)
        try:
            os.write(write_fd, ("\n".join(above[:SHOWN]) + "\0" + "\n".join(below[:SHOWN + 1])).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 1 << 16):
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    above, _, below = b"".join(chunks).decode(errors="replace").partition("\0")
    return Readability(above=[a for a in above.split("\n") if a], below=[b for b in below.split("\n") if b])
