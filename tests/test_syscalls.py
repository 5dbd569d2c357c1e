"""The calls every rank is refused (grader.rerun.rank.syscalls), tried on this kernel: each in a
forked process that installs the filter as a rank does, after no_new_privs."""

import ctypes
import errno
import fcntl
import mmap
import os
import platform
import socket
import struct
import tempfile
import threading

import pytest

from grader.rerun.rank import syscalls
from grader.rerun.sandbox import namespaces

pytestmark = pytest.mark.skipif(platform.machine() not in syscalls.REFUSED or not namespaces.LINUX,
                                reason="the filter is written for Linux on x86-64 and arm64")

libc = ctypes.CDLL(None, use_errno=True)
IO_URING_SETUP = 425   # the same number on x86-64 and arm64


def refused(call) -> bool:
    """Whether `call` (returning -1 and setting errno, or raising OSError) failed with EPERM."""
    try:
        result = call()
    except OSError as e:
        return e.errno == errno.EPERM
    return result == -1 and ctypes.get_errno() == errno.EPERM


def in_filtered_child(body) -> str:
    """'' where `body` ran without raising in a forked process that had the filter installed first."""
    def run():
        syscalls.check()
        body()
    return namespaces.in_child(run)


def test_each_refused_call_fails_with_eperm_in_the_filtered_process_its_threads_and_children():
    def body():
        assert refused(lambda: os.memfd_create("a4"))
        assert refused(lambda: libc.shmget(0, 4096, 0o600))
        assert refused(lambda: libc.msgget(0, 0o600))
        assert refused(lambda: libc.semget(0, 32000, 0o600))   # a set of semaphores: 2 MB of the kernel's
        assert refused(lambda: libc.syscall(ctypes.c_long(IO_URING_SETUP), 8, ctypes.create_string_buffer(120)))
        with tempfile.TemporaryFile() as f:   # a record lock: every byte range one more kernel object
            assert refused(lambda: fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0))
            assert refused(lambda: fcntl.lockf(f, fcntl.LOCK_SH, 1, 5))
            lock = struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 1, 0)   # struct flock, l_pid 0 as OFD locks want
            assert refused(lambda: fcntl.fcntl(f, getattr(fcntl, "F_OFD_SETLK", 37), lock))
        seen = []
        thread = threading.Thread(target=lambda: seen.append(refused(lambda: os.memfd_create("a4"))))
        thread.start()
        thread.join()
        assert seen == [True], seen
        pid = os.fork()
        if pid == 0:
            os._exit(0 if refused(lambda: libc.shmget(0, 4096, 0o600)) else 1)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert in_filtered_child(body) == ""


def test_a_filtered_process_and_its_children_stay_in_their_session():
    """setsid would make a scheduling group as heavy as the executor's whole session (autogroup):
    refused, where a process of the same kind without the filter may (setsid's own EPERM, for a
    process group's leader, ruled out)."""
    def body(filtered: bool):
        def run():
            if filtered:
                syscalls.check()
            pid = os.fork()
            if pid == 0:
                assert os.getpgrp() != os.getpid()
                os._exit(0 if refused(os.setsid) == filtered else 1)
            assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        return run
    assert namespaces.in_child(body(filtered=False)) == ""
    assert namespaces.in_child(body(filtered=True)) == ""


def test_a_thread_started_before_the_filter_is_filtered_too():
    """seccomp(2)'s TSYNC: a thread a rank had before its filter (torch's pools) is held as well."""
    def run():
        ready, go, seen = threading.Event(), threading.Event(), []
        def waiting():
            ready.set()
            go.wait()
            seen.append(refused(lambda: os.memfd_create("a4")))
        thread = threading.Thread(target=waiting)
        thread.start()
        ready.wait()
        syscalls.check()
        go.set()
        thread.join()
        assert seen == [True], seen
    assert namespaces.in_child(run) == ""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x32 numbers exist on x86-64 only")
def test_the_x32_numbers_of_the_calls_are_refused_too():
    def body():
        for number in (319, 29, 68, 425):
            assert refused(lambda: libc.syscall(ctypes.c_long(syscalls.X32 | number), 0, 0, 0)), number
    assert in_filtered_child(body) == ""


def test_what_a_rank_needs_still_works_under_the_filter(tmp_path):
    def body():
        anonymous = mmap.mmap(-1, 1 << 20)
        anonymous[:4] = b"a4a4"
        with open(tmp_path / "file", "w+b") as f:
            f.write(b"x" * 4096)
            f.flush()
            mapped = mmap.mmap(f.fileno(), 4096)
            assert mapped[:1] == b"x"
        left, right = socket.socketpair()
        left.sendall(b"ping")
        assert right.recv(4) == b"ping"
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
        read, write = os.pipe()
        os.write(write, b"1")
        assert os.read(read, 1) == b"1"
        with open(tmp_path / "store", "w+b") as f:   # torch's FileStore locks its file whole, with flock
            fcntl.flock(f, fcntl.LOCK_EX)
            fcntl.flock(f, fcntl.LOCK_UN)
            assert fcntl.fcntl(f, fcntl.F_GETFL) & os.O_RDWR
            probe = struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 1, 0)
            assert struct.unpack("hhqqi", fcntl.fcntl(f, fcntl.F_GETLK, probe))[0] == fcntl.F_UNLCK   # asking is not locking
    assert in_filtered_child(body) == ""


def run_filter(code: bytes, arch: int, nr: int, args=(0, 0, 0)) -> int:
    """What the kernel's classic BPF would return for `code` on this call: a small interpreter of
    the instructions the filter uses."""
    rows = [struct.unpack("=HBBI", code[i:i + 8]) for i in range(0, len(code), 8)]
    data = {syscalls.NR: nr, syscalls.ARCH: arch, **dict(zip(syscalls.ARG, args))}
    at, accumulator = 0, 0
    while True:
        op, jt, jf, k = rows[at]
        if op == syscalls.RET:
            return k
        if op == syscalls.LD_ABS:
            accumulator, at = data[k], at + 1
        elif op == syscalls.AND:
            accumulator, at = accumulator & k, at + 1
        elif op == syscalls.JA:
            at += 1 + k
        elif op in (syscalls.JEQ, syscalls.JSET):
            taken = accumulator == k if op == syscalls.JEQ else bool(accumulator & k)
            at += 1 + (jt if taken else jf)
        else:
            raise AssertionError(f"instruction {op:#x} at {at}")
        assert at < len(rows), "ran off the end"


DENY, NOSYS = syscalls.SECCOMP_RET_ERRNO | errno.EPERM, syscalls.SECCOMP_RET_ERRNO | errno.ENOSYS
ALLOW = syscalls.SECCOMP_RET_ALLOW


def test_the_program_refuses_each_number_of_the_matching_architecture_and_allows_the_rest():
    """Read back as the kernel runs it, for two made-up architectures: every refused number of the
    matching one is EPERM, its clone3 ENOSYS; any other number, or architecture, is allowed."""
    made_up = {1: syscalls.Calls(refused=(10, 11), clone3=(12,), unshare=(13,), clone=(14,), sockets=(15, 16)),
               2: syscalls.Calls(refused=(20,), clone3=(), unshare=(), clone=(), sockets=())}
    code = syscalls.program(made_up)
    assert [run_filter(code, 1, 10), run_filter(code, 1, 11), run_filter(code, 2, 20)] == [DENY] * 3
    assert run_filter(code, 1, 12) == NOSYS
    assert {run_filter(code, 1, 20), run_filter(code, 2, 10), run_filter(code, 3, 10), run_filter(code, 1, 17),
            run_filter(code, 2, 12)} == {ALLOW}


def test_the_program_reads_the_arguments_of_namespace_socket_and_fcntl_calls():
    """unshare and clone are refused with any CLONE_NEW* flag, allowed without; a socket only of
    the families and protocols the watchdog counts (the machine's own table); fcntl only where it
    sets a record lock."""
    table = syscalls.REFUSED[platform.machine()]
    arch, calls = next(iter(table.items()))
    code = syscalls.program(table)
    unshare, clone, sock = calls.unshare[0], calls.clone[0], calls.sockets[0]
    new_user, new_net, new_time, clone_files, sigchld = 0x10000000, 0x40000000, 0x80, 0x400, 17
    assert run_filter(code, arch, unshare, (new_user,)) == DENY
    assert run_filter(code, arch, unshare, (new_time,)) == DENY
    assert run_filter(code, arch, unshare, (clone_files,)) == ALLOW
    assert run_filter(code, arch, clone, (new_net | sigchld,)) == DENY
    assert run_filter(code, arch, clone, (sigchld,)) == ALLOW
    assert run_filter(code, arch, calls.clone3[0]) == NOSYS
    nonblock = socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
    allowed = [(socket.AF_UNIX, socket.SOCK_STREAM, 0), (socket.AF_UNIX, socket.SOCK_SEQPACKET, 0),
               (socket.AF_INET, socket.SOCK_STREAM, 0), (socket.AF_INET6, socket.SOCK_STREAM | nonblock, 6),
               (socket.AF_INET, socket.SOCK_DGRAM, 17), (socket.AF_NETLINK, socket.SOCK_RAW, 0)]
    refused_sockets = [(socket.AF_INET, socket.SOCK_DGRAM, 136), (socket.AF_INET6, socket.SOCK_STREAM, 262),
                       (socket.AF_INET, socket.SOCK_SEQPACKET, 0), (socket.AF_INET, socket.SOCK_STREAM, 132),
                       (socket.AF_NETLINK, socket.SOCK_RAW, 4), (40, socket.SOCK_STREAM, 0), (17, socket.SOCK_RAW, 0)]
    for number in calls.sockets:
        assert [run_filter(code, arch, number, a) for a in allowed] == [ALLOW] * len(allowed), number
        assert [run_filter(code, arch, number, a) for a in refused_sockets] == [DENY] * len(refused_sockets), number
    assert run_filter(code, arch, sock + 1000, refused_sockets[0]) == ALLOW   # another call: its arguments unread
    f_getfl, f_setfl, f_getlk, f_setlk, f_setlkw, f_ofd_setlk = 3, 4, 5, 6, 7, 37
    for number in calls.fcntl:
        assert [run_filter(code, arch, number, (3, cmd)) for cmd in (f_getfl, f_setfl, f_getlk)] == [ALLOW] * 3
        assert [run_filter(code, arch, number, (3, cmd)) for cmd in (f_setlk, f_setlkw, f_ofd_setlk)] == [DENY] * 3
    assert calls.fcntl and run_filter(code, arch, calls.fcntl[0] + 1000, (3, f_setlk)) == ALLOW


def test_new_namespaces_mounts_inotify_and_uncounted_sockets_are_refused_and_what_needs_threads_still_works():
    """A rank's child may not make a user, mount or network namespace of its own (where it could
    mount a tmpfs, or queue socket memory, that its world's watchdog never reads), join another's,
    mount, watch files (each watch pins kernel memory), nor open a socket the watchdog does not count; threads, fork, subprocesses and the
    interface lookup gloo makes (getifaddrs, over netlink's routing protocol) work as before."""
    import subprocess

    def body():
        pid = os.fork()   # one thread: where unshare(CLONE_NEWUSER) would otherwise work
        if pid == 0:
            ok = refused(lambda: libc.unshare(0x10000000 | 0x00020000)) and refused(lambda: libc.unshare(0x40000000))
            os._exit(0 if ok else 1)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, "a child made a namespace of its own"
        # a target that is not there: should the filter let it through, the call fails otherwise, harmlessly
        assert refused(lambda: libc.mount(b"none", b"/a4-not-there", b"tmpfs", 0, None))
        assert refused(lambda: libc.inotify_init1(0))
        with open("/proc/self/ns/net") as own:
            assert refused(lambda: libc.setns(own.fileno(), 0))
        for family, kind, protocol in ((socket.AF_INET, socket.SOCK_DGRAM, 136), (socket.AF_INET, socket.SOCK_STREAM, 262),
                                       (socket.AF_NETLINK, socket.SOCK_RAW, 4), (40, socket.SOCK_STREAM, 0)):
            assert refused(lambda: socket.socket(family, kind, protocol)), (family, kind, protocol)
        seen = []
        thread = threading.Thread(target=lambda: seen.append(1))
        thread.start()
        thread.join()
        assert seen == [1]
        assert subprocess.run(["true"]).returncode == 0
        assert "lo" in [name for _, name in socket.if_nameindex()]
        socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).close()
        socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET).close()
    assert in_filtered_child(body) == ""
