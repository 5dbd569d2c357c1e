"""What a world holds in memory outside its processes' Pss, for its leader's watchdog
(grader.rerun.sandbox.memory): files in memory its ranks hold open, its own /tmp and /dev/shm, its SysV
shared memory, its socket buffers.

    outside = sum over the memory files its processes hold open (memfds, files on tmpfs or
                  ramfs, deleted or not; each inode once) of their allocated size (st_blocks x 512)
            + the used blocks of its own /tmp and /dev/shm (where the world has a mount namespace
                  of its own; each is a tmpfs of limits.tmp_mb), and of each rank's own
                  (grader.rerun.sandbox.scratch.rank_view), seen through /proc/PID/root
            + its SysV shared memory segments' resident bytes (where it has an IPC namespace of its own)
            + what its sockets hold in the kernel (grader.rerun.sandbox.sockets: TCP, UDP, unix and
                  netlink; every socket of its own network namespace, else those its processes
                  hold open)

A cgroup v1 charges the files and the shared memory but not the sockets; no process's Pss shows a
page no process maps. A page a rank both maps and holds in a memory file counts twice (in its Pss
and here), which errs toward the limit. What is not counted is refused or bounded instead
(docs/security.md): the calls that make a memory file no process need hold open, SysV memory in
a rank's own IPC namespace, a tmpfs or sockets in a namespace of a rank's own, or sockets of a kind
no dump reads, are refused to the ranks (grader.rerun.rank.syscalls; where the kernel has no
seccomp, a memfd no process holds open but one maps counts by the pages mapped);
pipes hold at most the kernel's per-user pipe allowance (fs.pipe-user-pages-soft).

Each reading says, beside the total, what each process holds (`by_pid`: files and sockets, by the
first process found holding each), so the watchdog can name the rank that used most.
"""

import os
import stat

from grader.rerun.sandbox import sockets as kernel_sockets

MEMORY_FS = ("tmpfs", "ramfs", "hugetlbfs")
OWN_SCRATCH = ("/tmp", "/dev/shm")


def memory_devices() -> set:
    """st_dev of every file system mounted here whose files live in memory."""
    found = set()
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                fstype = fields[fields.index("-") + 1] if "-" in fields else ""
                if fstype in MEMORY_FS:
                    major, minor = fields[2].split(":")
                    found.add(os.makedev(int(major), int(minor)))
    except (OSError, ValueError, IndexError):
        pass
    return found


def _device(path: str):
    try:
        return os.stat(path).st_dev
    except OSError:
        return None


def _used(path: str) -> int:
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _sysv_shm() -> int:
    """Resident bytes of the SysV shared memory segments of this IPC namespace."""
    total = 0
    try:
        with open("/proc/sysvipc/shm") as f:
            header = f.readline().split()
            column = header.index("rss")
            for line in f:
                fields = line.split()
                total += int(fields[column]) if len(fields) > column else 0
    except (OSError, ValueError):
        pass
    return total


class Outside:
    """Readings of what one world holds outside Pss. `own`: whether the world has mount, IPC and
    network namespaces of its own (grader.rerun.sandbox.namespaces.unshare_world), which the caller is in."""

    def __init__(self, own: bool):
        self.own = own
        self.devices = memory_devices()
        self.scratch = set()   # the world's own /tmp and /dev/shm: counted by their used blocks, not per file
        if own:
            for path in OWN_SCRATCH:
                try:
                    self.scratch.add(os.stat(path).st_dev)
                except OSError:
                    pass
        self.total, self.by_pid, self.sockets = 0, {}, 0
        # Without a mount namespace of its own a world's ranks see the machine's /tmp and /dev/shm:
        # never counted as the world's (grader.rerun.sandbox.sweep removes what the world left there).
        self.shared = set() if own else {_device(path) for path in OWN_SCRATCH}

    def _files(self, pids: list) -> tuple:
        """({pid: bytes of the memory files it was found holding first}, {socket inode: the pid holding it})."""
        seen, by_pid, sockets = set(), {}, {}
        for pid in pids:
            folder = f"/proc/{pid}/fd"
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                path = f"{folder}/{name}"
                try:
                    link = os.readlink(path)
                except OSError:
                    continue
                if link.startswith("socket:["):
                    sockets.setdefault(int(link[8:-1]), pid)
                    continue
                if not link.startswith("/"):   # memfds too: "/memfd:name (deleted)"
                    continue   # pipes, anonymous inodes: bounded, not counted
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                key = (st.st_dev, st.st_ino)
                in_memory = st.st_dev in self.devices or link.startswith("/memfd:")
                if not in_memory or st.st_dev in self.scratch or key in seen or not stat.S_ISREG(st.st_mode):
                    continue
                seen.add(key)
                by_pid[pid] = by_pid.get(pid, 0) + st.st_blocks * 512
        return by_pid, sockets

    def _ranks_scratch(self, pids: list) -> int:
        """The used blocks of each rank's own /tmp and /dev/shm (grader.rerun.sandbox.scratch.rank_view: a
        tmpfs of its own, in its own mount namespace), each file system once, seen through
        /proc/PID/root; where ranks have none, these are the world's, counted above."""
        total, seen = 0, set(self.scratch)
        for pid in pids:
            for path in OWN_SCRATCH:
                where = f"/proc/{pid}/root{path}"
                try:
                    device = os.stat(where).st_dev
                except OSError:
                    continue
                if device not in seen and (self.own or device not in self.shared):
                    seen.add(device)
                    total += _used(where)
        return total

    def read(self, pids: list) -> int:
        """What the world of `pids` (as /proc numbers them) holds outside Pss now, in bytes; its
        sockets' part of it in `sockets` (those dumped: not the machine's TCP standing in)."""
        by_pid, holders = self._files(pids)
        unowned, self.sockets = 0, 0
        for inode, size in kernel_sockets.held().items():
            if inode in holders:
                by_pid[holders[inode]] = by_pid.get(holders[inode], 0) + size
            elif self.own or not inode:   # in flight (no process holds it), or the machine's TCP standing in
                unowned += size
            self.sockets += size if inode and (inode in holders or self.own) else 0
        if self.own:
            unowned += sum(_used(path) for path in OWN_SCRATCH) + _sysv_shm()
        unowned += self._ranks_scratch(pids)
        self.by_pid = by_pid
        self.total = unowned + sum(by_pid.values())
        return self.total
