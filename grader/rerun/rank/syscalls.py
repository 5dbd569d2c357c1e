"""The system calls a rank is refused, by a seccomp filter: those that make memory no process's Pss
shows and that its world's watchdog could not count, those that would take a rank out of the
world's view, and one that would take it more than its world's share of the CPU.

- memfd_create, memfd_secret: a memory file. The watchdog counts the memfds a world's processes hold
  open (grader.rerun.sandbox.outside), but not one only a unix message in flight holds
  (SCM_RIGHTS: up to RANK_OPEN_FILES of them per user, each as large as a file may be), nor one
  whose descriptor was closed while a page of it stays mapped.
- shmget, msgget, semget: SysV shared memory, message queues and semaphores. A segment nobody maps
  any longer, or a queue nobody reads, lives on in its IPC namespace, and a set of 32,000 semaphores
  holds 2 MB of the kernel's that no process shows (hundreds of sets a rank took gigabytes past an
  ordinary user's world's limit); each rank's own (grader.rerun.sandbox.scratch
  .rank_view) is one the world's leader cannot read.
- io_uring_setup: each ring's queues (up to 5 MB, 200 rings a gigabyte) are the kernel's, in no
  process's resident set.
- bpf: a map's memory is the kernel's too (where the machine lets users make one at all).
- inotify_init, inotify_init1, fanotify_init: each watch, and the inode it pins, is the kernel's:
  about 0.8 KB, up to fs.inotify.max_user_watches of them per user (a million on a large machine).
- new namespaces (unshare, clone with a CLONE_NEW* flag, clone3, setns) and mounts (mount and the
  new mount API, pivot_root): a rank's child in a user namespace of its own may mount a tmpfs
  the watchdog never looks at (it reads the world's /tmp and /dev/shm, and each rank's) and fill it,
  or open sockets in a network namespace of its own, which the watchdog does not dump. clone3 fails
  with ENOSYS, not EPERM: its flags are in memory a filter cannot read, and the C library then falls
  back to clone, whose flags it can.
- setsid: where the kernel shares the CPU between sessions (autogroup, on by default), a process in a
  session of its own weighs as much as its whole world (each world is a session of its own,
  grader.rerun.world.lead_world): 90 children each in a session of their own took the cores from
  every other world. Refused, a rank and its children stay in their world's session, one
  scheduling group among the others.
- fcntl's record locks (F_SETLK, F_SETLKW, the open file description's F_OFD_SETLK and F_OFD_SETLKW,
  and 32-bit F_SETLK64 and F_SETLKW64): each locked byte range is a kernel object (about 200 bytes),
  as many as a process asks for on one open file, charged to a cgroup but in no process's resident
  set. flock(2), one lock per open file (what torch's FileStore takes), stays.
- sockets of any family but unix, TCP and UDP (over IPv4 and IPv6) and netlink's routing protocol
  (which the C library's getifaddrs, and so gloo, needs): those are the sockets the watchdog counts
  (grader.rerun.sandbox.sockets); UDP-Lite, MPTCP, SCTP, vsock and the rest would queue memory it
  does not. (32-bit x86 reaches sockets through socketcall(2) as well: refused whole.)

A cgroup charges the memory ones; where the watchdog alone holds a world (an ordinary user without a
cgroup) they would pass its limit unseen, and a cgroup v1 charges no socket buffer. Nothing a part
needs makes them (torch, gloo, torch's CUDA build on the CPU), so each rank is refused them before
the hand-in's code runs: they fail with EPERM ("Operation not permitted"), and the part that called
one crashes saying so.

The filter, classic BPF over struct seccomp_data (nr at offset 0, arch at 4, the low 32 bits of
argument i at 16 + 8 i):

    for each architecture this machine's processes may call the kernel as (x86-64 and its 32-bit
    and x32 calls; arm64 and its 32-bit calls):
        arch == it  and  nr is one of its refused calls               ->  EPERM
                        nr is clone3                                  ->  ENOSYS
                        nr is unshare, clone and args[0] & CLONE_NEW* ->  EPERM
                        nr is fcntl, fcntl64 and args[1] sets a record lock ->  EPERM
                        nr is socket, socketpair and (args[0], args[1] & 0xf, args[2]) is not
                            (AF_UNIX, any, any), (AF_INET or AF_INET6, STREAM or DGRAM, 0 or TCP
                            or UDP) or (AF_NETLINK, any, NETLINK_ROUTE)   ->  EPERM
    anything else                                                     ->  SECCOMP_RET_ALLOW

It is installed with seccomp(2) and SECCOMP_FILTER_FLAG_TSYNC (every thread of the rank), or
prctl(2) (the calling thread and what it starts) on a kernel without seccomp(2). It needs
no_new_privs, which every rank sets (grader.rerun.sandbox.namespaces.limit_rank). Where the kernel
has no seccomp (or another architecture) `refuse` raises; the zygote tries it first in a process of
its own (`note`), and each result's isolation says whether the calls are refused.
"""

import ctypes
import dataclasses
import errno
import fcntl
import functools
import os
import platform
import socket
import struct
import tempfile

from grader.rerun.sandbox import namespaces

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
# BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_JMP|BPF_JSET|BPF_K, BPF_JMP|BPF_JA,
# BPF_ALU|BPF_AND|BPF_K, BPF_RET|BPF_K
LD_ABS, JEQ, JSET, JA, AND, RET = 0x20, 0x15, 0x45, 0x05, 0x54, 0x06
NR, ARCH = 0, 4
ARG = (16, 24, 32)                           # the low 32 bits of args[0], args[1], args[2] (little-endian)
X32 = 0x40000000                             # x32 calls are x86-64's numbers with this bit set
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET; unshare also takes CLONE_NEWTIME
# (clone's low byte is the exit signal instead)
NEW_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
NEW_NAMESPACES_UNSHARE = NEW_NAMESPACES | 0x00000080
RECORD_LOCKS = (6, 7, 13, 14, 37, 38)        # F_SETLK, F_SETLKW, F_SETLK64, F_SETLKW64, F_OFD_SETLK, F_OFD_SETLKW
SOCKET_TYPE = 0xF                            # SOCK_NONBLOCK and SOCK_CLOEXEC ride on the type's higher bits
NETLINK_ROUTE = 0


@dataclasses.dataclass(frozen=True)
class Calls:
    """One architecture's numbers of the calls the filter looks at."""
    refused: tuple          # refused whatever their arguments
    clone3: tuple
    unshare: tuple
    clone: tuple
    sockets: tuple          # socket and socketpair: the family, type and protocol are args 0 to 2
    fcntl: tuple = ()       # fcntl and fcntl64: the command is args[1]


# memfd_create, memfd_secret, shmget, msgget, semget, io_uring_setup, bpf, setns, mount, pivot_root,
# inotify_init (where there is one), inotify_init1, fanotify_init, setsid, and the new mount API (open_tree,
# move_mount, fsopen, fsmount, fspick: the same numbers everywhere)
_MOUNT_API = (428, 429, 430, 432, 433)
_X86_64 = Calls(refused=(319, 447, 29, 68, 64, 425, 321, 308, 165, 155, 253, 294, 300, 112) + _MOUNT_API, clone3=(435,),
                unshare=(272,), clone=(56,), sockets=(41, 53), fcntl=(72,))


def _x32(calls: Calls) -> Calls:
    """x86-64's numbers with their x32 twins added."""
    return Calls(*(numbers + tuple(X32 | n for n in numbers) for numbers in dataclasses.astuple(calls)))


# audit architecture -> its numbers (i386 also reaches SysV IPC through ipc(2) and sockets through
# socketcall(2): both refused whole)
REFUSED = {
    "x86_64": {0xC000003E: _x32(_X86_64),
               0x40000003: Calls(refused=(356, 447, 395, 399, 393, 425, 357, 346, 21, 217, 291, 332, 338, 66, 117, 102)
                                 + _MOUNT_API,
                                 clone3=(435,), unshare=(310,), clone=(120,), sockets=(359, 360), fcntl=(55, 221))},
    "aarch64": {0xC00000B7: Calls(refused=(279, 447, 194, 186, 190, 425, 280, 268, 40, 41, 26, 262, 157) + _MOUNT_API,
                                  clone3=(435,), unshare=(97,), clone=(220,), sockets=(198, 199), fcntl=(25,)),
                0x40000028: Calls(refused=(385, 447, 307, 303, 299, 425, 386, 375, 21, 218, 316, 360, 367, 66) + _MOUNT_API,
                                  clone3=(435,), unshare=(337,), clone=(120,), sockets=(281, 288), fcntl=(55, 221))},
}
SECCOMP_CALL = {"x86_64": 317, "aarch64": 277}
CALLS = ("memfd_create, memfd_secret, shmget, msgget, semget, io_uring_setup, bpf, inotify, new namespaces, mounts, "
         "new sessions, record locks and sockets but unix, TCP, UDP and netlink routing")

_libc = ctypes.CDLL(None, use_errno=True)


def program(refused: dict) -> bytes:
    """The filter's instructions (struct sock_filter: u16 code, u8 jt, u8 jf, u32 k) for `refused`
    (audit architecture -> Calls). Jumps name their target; each is resolved to its offset."""
    rows = []
    for at, (arch, calls) in enumerate(refused.items()):
        other = f"arch{at + 1}" if at + 1 < len(refused) else "allow"
        rows += [f"arch{at}", (LD_ABS, 0, 0, ARCH), (JEQ, 0, other, arch), (LD_ABS, 0, 0, NR)]
        for numbers, target in ((calls.refused, "deny"), (calls.clone3, "nosys"), (calls.unshare, "unshare"),
                                (calls.clone, "clone"), (calls.sockets, "socket"), (calls.fcntl, "fcntl")):
            rows += [(JEQ, target, 0, number) for number in numbers]
        rows += [(JA, 0, 0, other)]
    rows += ["unshare", (LD_ABS, 0, 0, ARG[0]), (JSET, "deny", "allow", NEW_NAMESPACES_UNSHARE),
             "clone", (LD_ABS, 0, 0, ARG[0]), (JSET, "deny", "allow", NEW_NAMESPACES),
             "fcntl", (LD_ABS, 0, 0, ARG[1]), *[(JEQ, "deny", 0, command) for command in RECORD_LOCKS], (JA, 0, 0, "allow"),
             "socket", (LD_ABS, 0, 0, ARG[0]), (JEQ, "allow", 0, socket.AF_UNIX), (JEQ, "inet", 0, socket.AF_INET),
             (JEQ, "inet", 0, socket.AF_INET6), (JEQ, 0, "deny", socket.AF_NETLINK),
             (LD_ABS, 0, 0, ARG[2]), (JEQ, "allow", "deny", NETLINK_ROUTE),
             "inet", (LD_ABS, 0, 0, ARG[1]), (AND, 0, 0, SOCKET_TYPE), (JEQ, "protocol", 0, socket.SOCK_STREAM),
             (JEQ, "protocol", "deny", socket.SOCK_DGRAM),
             "protocol", (LD_ABS, 0, 0, ARG[2]), (JEQ, "allow", 0, 0), (JEQ, "allow", 0, socket.IPPROTO_TCP),
             (JEQ, "allow", "deny", socket.IPPROTO_UDP),
             "allow", (RET, 0, 0, SECCOMP_RET_ALLOW),
             "nosys", (RET, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS),
             "deny", (RET, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM)]
    labels, code = {}, []
    for row in rows:
        if isinstance(row, str):
            labels[row] = len(code)
        else:
            code.append(row)

    def offset(target, at: int) -> int:
        jump = labels[target] - at - 1 if isinstance(target, str) else target
        assert 0 <= jump <= 255, (target, jump)   # classic BPF jumps forward only, a byte at most
        return jump

    packed = []
    for at, (op, jt, jf, k) in enumerate(code):
        if op == JA:   # an unconditional jump's offset is its k
            op, jt, jf, k = JA, 0, 0, offset(k, at)
        packed.append(struct.pack("=HBBI", op, offset(jt, at), offset(jf, at), k))
    return b"".join(packed)


@functools.lru_cache(maxsize=None)
def machine_program(machine: str) -> bytes:
    """The filter for this machine's architecture: made once, in the zygote (`note`), for every rank."""
    return program(REFUSED[machine])


def refuse() -> None:
    """Install the filter in this process (after no_new_privs); OSError where it cannot be."""
    machine = platform.machine()
    if machine not in REFUSED:
        raise OSError(errno.ENOSYS, f"no filter for this architecture ({machine})")
    code = machine_program(machine)
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
    if not why:
        machine_program(platform.machine())
    if why and isolation.watchdog and "memory" not in isolation.controllers:
        isolation.problems.append(f"a rank may make memory the watchdog cannot count once no process holds "
                                  f"it open ({CALLS} not refused: {why})")


def check() -> None:
    """In a process of its own, which it leaves filtered: the filter installed, memfd_create,
    shmget, semget, a new user namespace, a UDP-Lite socket and a record lock are refused; OSError where one
    is not so."""
    namespaces.prctl(namespaces.PR_SET_NO_NEW_PRIVS, 1)
    refuse()

    def still_works(call, name: str) -> None:
        try:
            if call() != -1 or ctypes.get_errno() != errno.EPERM:
                raise OSError(errno.EEXIST, f"{name} still works under the filter")
        except PermissionError:
            pass

    still_works(lambda: os.close(os.memfd_create("a4-probe")), "memfd_create")
    still_works(lambda: _libc.shmget(0, 4096, 0o600), "shmget")
    still_works(lambda: _libc.semget(0, 1, 0o600), "semget")
    still_works(lambda: _libc.unshare(0x10000000), "unshare(CLONE_NEWUSER)")
    still_works(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM, 136).close(), "a UDP-Lite socket")
    with tempfile.TemporaryFile() as f:
        still_works(lambda: fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB), "a record lock (fcntl F_SETLK)")
