"""The calls every rank is refused (grader.rerun.rank.syscalls), tried on this kernel: each in a
forked process that installs the filter as a rank does, after no_new_privs."""

import ctypes
import errno
import mmap
import os
import platform
import socket
import struct
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
        assert refused(lambda: libc.syscall(ctypes.c_long(IO_URING_SETUP), 8, ctypes.create_string_buffer(120)))
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
    assert in_filtered_child(body) == ""


def test_the_program_jumps_to_the_refusal_from_each_number_and_past_each_other_architecture():
    """Read back as the kernel runs it, for two made-up architectures: every listed number of the
    matching one reaches the last instruction (EPERM); any other number, or architecture, allows."""
    code = syscalls.program({1: (10, 11), 2: (20,)})
    rows = [struct.unpack("=HBBI", code[i:i + 8]) for i in range(0, len(code), 8)]

    def run(arch: int, nr: int) -> int:
        at, loaded = 0, 0
        while True:
            op, jt, jf, k = rows[at]
            if op == syscalls.RET:
                return k
            if op == syscalls.LD_ABS:
                loaded, at = (arch if k == 4 else nr), at + 1
            else:
                at += 1 + (jt if loaded == k else jf)

    deny = syscalls.SECCOMP_RET_ERRNO | errno.EPERM
    assert [run(1, 10), run(1, 11), run(2, 20)] == [deny] * 3
    assert {run(1, 20), run(2, 10), run(3, 10), run(1, 12)} == {syscalls.SECCOMP_RET_ALLOW}
