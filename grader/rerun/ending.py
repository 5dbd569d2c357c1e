"""How a world's ranks end: each reaped the moment it exits, within a grace, and what is left
killed with its process group (`end_ranks`, called by grader.rerun.supervise once the world is
complete or must end), and what they left: what each wrote, and its record of its last part's
collectives.
"""

import os
import select
import signal
import time

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


def reap_within(pids: list, grace: float) -> dict:
    """The exit codes (by rank) of the ranks `pids` that end within `grace` seconds, each reaped
    the moment it ends: a process descriptor (pidfd_open, Linux 5.3) becomes readable when its
    process exits. Where there is none, the ranks are polled every 5 ms."""
    deadline, codes, watched = time.monotonic() + grace, {}, {}
    try:
        try:
            for rank, pid in enumerate(pids):
                watched[os.pidfd_open(pid)] = rank
        except (AttributeError, OSError):   # an older kernel or Python
            pass
        while len(codes) < len(pids) and time.monotonic() < deadline:
            left = deadline - time.monotonic()
            waiting = [fd for fd, rank in watched.items() if rank not in codes]
            if len(waiting) == len(pids) - len(codes):
                select.select(waiting, [], [], left)
            else:
                time.sleep(min(0.005, max(left, 0.0)))
            reaped = len(codes)
            for rank, pid in enumerate(pids):
                done, status = (0, 0) if rank in codes else os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[rank] = os.waitstatus_to_exitcode(status)
            if len(codes) == reaped:   # readable, not yet reapable (its last thread still ending)
                time.sleep(0.001)
    finally:
        for fd in watched:
            os.close(fd)
    return codes


def end_ranks(pgid: int, pids: list, grace: float = 0.0) -> dict:
    """Kill the world's process group and reap its ranks; return each rank's exit code (-signal)."""
    codes = reap_within(pids, grace) if grace else {}
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
