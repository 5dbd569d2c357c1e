"""The system calls a rank is refused, by a seccomp filter: those that make memory no process's Pss
shows and that its world's watchdog could not count.

- memfd_create, memfd_secret: a memory file. The watchdog counts the memfds a world's processes hold
  open (grader.rerun.sandbox.outside), but not one only a unix message in flight holds
  (SCM_RIGHTS: up to RANK_OPEN_FILES of them per user, each as large as a file may be), nor one
  whose descriptor was closed while a page of it stays mapped.
- shmget, msgget: SysV shared memory and message queues. A segment nobody maps any longer, or a
  queue nobody reads, lives on in its IPC namespace; each rank's own (grader.rerun.sandbox.scratch
  .rank_view) is one the world's leader cannot read.
- io_uring_setup: each ring's queues (up to 5 MB, 200 rings a gigabyte) are the kernel's, in no
  process's resident set.
- bpf: a map's memory is the kernel's too (where the machine lets users make one at all).

A cgroup charges all of these; where the watchdog alone holds a world (an ordinary user without a
cgroup) they would pass its limit unseen. Nothing a part needs makes them (torch, gloo, torch's CUDA
build on the CPU), so each rank is refused them before the hand-in's code runs: they fail with
EPERM ("Operation not permitted"), and the part that called one crashes saying so.

The filter, classic BPF over struct seccomp_data (nr at offset 0, arch at offset 4):

    for each architecture this machine's processes may call the kernel as (x86-64 and its 32-bit
    and x32 calls; arm64 and its 32-bit calls):
        arch == it  and  nr is one of its numbers for these calls   ->  SECCOMP_RET_ERRNO | EPERM
    anything else                                                   ->  SECCOMP_RET_ALLOW

(32-bit x86 reaches SysV IPC through ipc(2) as well: refused whole.) It is installed with
seccomp(2) and SECCOMP_FILTER_FLAG_TSYNC (every thread of the rank), or prctl(2) (the calling thread
and what it starts) on a kernel without seccomp(2). It needs no_new_privs, which every rank sets
(grader.rerun.sandbox.namespaces.limit_rank). Where the kernel has no seccomp (or another
architecture) `refuse` raises; the zygote tries it first in a process of its own (`note`), and
each result's isolation says whether the calls are refused.
"""

import ctypes
import errno
import os
import platform
import struct

from grader.rerun.sandbox import namespaces

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
LD_ABS, JEQ, RET = 0x20, 0x15, 0x06          # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
X32 = 0x40000000                             # x32 calls are x86-64's numbers with this bit set
# audit architecture -> its numbers of memfd_create, memfd_secret, shmget, msgget, io_uring_setup,
# bpf (and i386's ipc)
_X86_64 = (319, 447, 29, 68, 425, 321)
REFUSED = {
    "x86_64": {0xC000003E: _X86_64 + tuple(X32 | number for number in _X86_64),
               0x40000003: (356, 447, 395, 399, 425, 357, 117)},
    "aarch64": {0xC00000B7: (279, 447, 194, 186, 425, 280), 0x40000028: (385, 447, 307, 303, 425, 386)},
}
SECCOMP_CALL = {"x86_64": 317, "aarch64": 277}
CALLS = "memfd_create, memfd_secret, shmget, msgget, io_uring_setup and bpf"

_libc = ctypes.CDLL(None, use_errno=True)


def program(refused: dict) -> bytes:
    """The filter's instructions (struct sock_filter: u16 code, u8 jt, u8 jf, u32 k) for `refused`
    (audit architecture -> call numbers)."""
    rows = []
    for arch, numbers in refused.items():
        rows += [(LD_ABS, 0, 0, 4), (JEQ, 0, len(numbers) + 1, arch), (LD_ABS, 0, 0, 0)]
        rows += [(JEQ, "deny", 0, number) for number in numbers]
    rows += [(RET, 0, 0, SECCOMP_RET_ALLOW), (RET, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM)]
    deny = len(rows) - 1
    return b"".join(struct.pack("=HBBI", code, deny - at - 1 if jt == "deny" else jt, jf, k)
                    for at, (code, jt, jf, k) in enumerate(rows))


def refuse() -> None:
    """Install the filter in this process (after no_new_privs); OSError where it cannot be."""
    machine = platform.machine()
    if machine not in REFUSED:
        raise OSError(errno.ENOSYS, f"no filter for this architecture ({machine})")
    code = program(REFUSED[machine])
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("=HxxxxxxQ", len(code) // 8, ctypes.addressof(buffer))   # struct sock_fprog
    fprog_buffer = ctypes.create_string_buffer(fprog, len(fprog))
    result = _libc.syscall(ctypes.c_long(SECCOMP_CALL[machine]), ctypes.c_ulong(SECCOMP_SET_MODE_FILTER),
                           ctypes.c_ulong(SECCOMP_FILTER_FLAG_TSYNC), fprog_buffer)
    if result != 0 and ctypes.get_errno() == errno.ENOSYS:   # a kernel before seccomp(2): this thread and its children
        result = _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, fprog_buffer, 0, 0)
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"the seccomp filter was refused: {os.strerror(err)}")


def note(isolation) -> None:
    """Whether this machine's ranks can be refused the calls, tried in a process of its own: in
    `isolation` (grader.rerun.sandbox.namespaces.Isolation), the calls refused, or a problem where
    the watchdog alone holds a world's memory."""
    why = namespaces.in_child(check) if namespaces.LINUX else "not Linux"
    isolation.refused = "" if why else CALLS
    if why and isolation.watchdog and "memory" not in isolation.controllers:
        isolation.problems.append(f"a rank may make memory the watchdog cannot count once no process holds "
                                  f"it open ({CALLS} not refused: {why})")


def check() -> None:
    """In a process of its own, which it leaves filtered: the filter installed, memfd_create and
    shmget are refused; OSError where either is not so."""
    namespaces.prctl(namespaces.PR_SET_NO_NEW_PRIVS, 1)
    refuse()
    try:
        os.close(os.memfd_create("a4-probe"))
    except PermissionError:
        if _libc.shmget(0, 4096, 0o600) == -1 and ctypes.get_errno() == errno.EPERM:
            return
        raise OSError(errno.EEXIST, "shmget still works under the filter") from None
    raise OSError(errno.EEXIST, "memfd_create still works under the filter")
