"""How a world's ranks end: all together, killed with their process group the moment the world is
complete or must end, and reaped (`end_ranks`, called by grader.rerun.supervise), and what they left: what each wrote, and its record of its last part's
collectives.
"""

import os
import signal

from grader.rerun.sandbox.scratch import left_file

OUTPUT_HEAD, OUTPUT_TAIL = 4096, 8192
PROGRESS_TAIL = 65536


def read_ends(path: str, head: int, tail: int) -> bytes:
    """The first `head` and the last `tail` bytes of the file a rank left at `path` (b"" where
    there is none), what lies between (if any, after a head) named by its size."""
    fd = left_file(path)
    if fd is None:
        return b""
    with open(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        text = f.read(head)
        if size > head + tail:
            f.seek(size - tail)
            text += b"\n[... %d bytes left out ...]\n" % (size - head - tail) if head else b""
        return text + f.read(tail)


def output(work_dir: str, world_size: int) -> dict:
    """Head and tail of what each rank wrote to stdout/stderr."""
    out = {}
    for rank in range(world_size):
        try:
            out[rank] = read_ends(os.path.join(work_dir, f"rank{rank}.out"), OUTPUT_HEAD, OUTPUT_TAIL).decode(
                "utf-8", "replace")
        except OSError:
            out[rank] = ""
    return out


def progress(work_dir: str, world_size: int) -> dict:
    """The tail of each rank's record of its last part's collectives (grader.rerun.rank.hooks), read
    after the world ended: what a rank that never reported was waiting in."""
    out = {}
    for rank in range(world_size):
        try:
            out[rank] = read_ends(os.path.join(work_dir, f"rank{rank}.calls"), 0, PROGRESS_TAIL).decode(
                "utf-8", "replace")
        except OSError:
            pass
    return out


def end_ranks(pgid: int, pids: list) -> dict:
    """Kill the world's process group and reap its ranks; return each rank's exit code (-signal:
    a rank that exited on its own, a hand-in's os._exit or a failed collective's, keeps its own)."""
    codes = {}
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for rank, pid in enumerate(pids):   # a rank that left the group (setpgid) is killed all the same
        if rank not in codes:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for rank, pid in enumerate(pids):
        if rank not in codes:
            try:
                codes[rank] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            except ChildProcessError:
                codes[rank] = None
    return codes
