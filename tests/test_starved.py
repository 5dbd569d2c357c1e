"""A part past its clock hung, or its world was kept from the CPU: the kernel's times say which
(grader.rerun.starved), read by the world's leader at the timeout and judged by the grader.

Real worlds of the reference with one part changed: asleep, looping forever, or doing a fixed
amount of work. The rule itself is checked on the cases its docstring names. A correct hand-in on
a machine whose every core is busy is in tests/test_hangs.py (make test-scale)."""

import dataclasses
import os
import time

import pytest

from grader.rerun.check import prepare_code, run_check
from grader.rerun.executor import WarmExecutor
from grader.rerun.starved import at_its_limit, cpu_time, said, starved
from grader.rerun.wire.protocol import CpuTime
from grader.rubric import load_rubric
from tests.corpus import REFERENCE

STEP = "    device = get_device() if device is None else device\n    # Same seed, same initial weight: on every rank and in every part.\n"
SLEEPS = "    __import__('time').sleep(10 ** 6)\n"
# The thread parked in state D: a clone sharing its memory (vfork's) whose child sleeps, the parent
# waiting for it, uninterruptibly, as a thread reading pages back from the disk would.
IN_STATE_D = """    import ctypes as _c, mmap as _m, os as _o
    _libc = _c.CDLL(None, use_errno=True)
    _stack = _m.mmap(-1, 1 << 16)
    _top = _c.addressof(_c.c_char.from_buffer(_stack)) + (1 << 16) - 256
    _libc.clone.restype = _c.c_int
    _libc.clone.argtypes = [_c.c_void_p, _c.c_void_p, _c.c_int, _c.c_void_p]
    _pid = _libc.clone(_c.cast(_libc.sleep, _c.c_void_p), _top, 0x100 | 0x4000 | 17, _c.c_void_p(30))
    if _pid > 0:
        _o.waitpid(_pid, 0)
"""
LOOPS = "    while True:\n        pass\n"
# What a student prints to find where a part hangs, neither line ended nor flushed: the rank is
# killed, and its output must still hold it (grader.rerun.rank.worker writes each call through).
PRINTS = "    print('before the loop', end='')\n    print('and on stderr', end='', file=__import__('sys').stderr)\n"


def _seconds(detail: str, after: str) -> float:
    """The seconds a timeout's message says right after `after` ("its ranks ran 0.5 s ...")."""
    return float(detail.split(after)[1].split(" s")[0])


def baseline_with(tmp_path, body: str) -> dict:
    """The reference whose Part 1 (single_step) first runs `body`."""
    text = REFERENCE.read_text()
    assert text.count(STEP) == 1
    path = tmp_path / "assignment4.py"
    path.write_text(text.replace(STEP, body + STEP))
    return prepare_code(path)


def test_the_rule_on_the_cases_its_docstring_names():
    clock = 2.0
    assert not starved(CpuTime(run=0.01, wait=0.0, cores=2), clock, 4)           # asleep, or in a collective
    assert not starved(CpuTime(run=4.0, wait=4.0, cores=2), clock, 4)            # 4 ranks looping on 2 cores
    assert not starved(CpuTime(run=2.0, wait=0.0, cores=16), clock, 4)           # one rank looping, the others waiting
    assert not starved(CpuTime(run=2.0, wait=6.0, cores=2), clock, 4)            # those 4 beside another world
    assert starved(CpuTime(run=0.6, wait=6.0, cores=2), clock, 4)                # a busy machine took the cores
    assert starved(CpuTime(run=3.0, wait=0.0, cores=2, disk=1, short=True), clock, 4)   # waiting for the disk
    assert not starved(CpuTime(run=3.0, wait=0.0, cores=2, disk=1), clock, 4)   # in state D with memory to spare
    # A machine so busy the leader read the times long after the clock: the ranks ran on meanwhile.
    assert starved(CpuTime(run=3.62, wait=438.8, cores=2), 1.5, 4)
    assert not starved(CpuTime(run=3.62, wait=25.0, cores=2), 1.5, 4)            # a loop given a seventh
    assert not starved(CpuTime(run=0.06, wait=0.53, cores=2), 1.5, 4)            # 4 ranks slow to start, then asleep
    assert starved(None, clock, 4)                                               # times the kernel does not keep
    # Asleep at the timeout, whatever its threads waited before (queued at load, or in the part before)
    assert not starved(CpuTime(run=0.6, wait=6.0, cores=2, busy=0.0), clock, 4)
    assert starved(CpuTime(run=0.6, wait=6.0, cores=2, busy=0.09), clock, 4)
    assert "could not be read" in said(None) and "ran 0.6 s and waited 6 s for a CPU, on 2 cores" in \
        said(CpuTime(run=0.6, wait=6.0, cores=2))


def test_this_process_times_are_read_from_every_thread():
    import threading
    stop = threading.Event()
    def spin():
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin)
    before = cpu_time([os.getpid()])
    spinner.start()
    stop.wait(0.3)
    after = cpu_time([os.getpid()])
    stop.set()
    spinner.join()
    assert after.run - before.run >= 0.1 and after.cores == len(os.sched_getaffinity(0)), (before, after)
    assert cpu_time([]) is None and cpu_time([2 ** 22 + 7]) is None   # nothing, or a process that is gone


def test_threads_a_rank_makes_queued_behind_each_other_are_not_a_machine_that_kept_it_out(monkeypatch):
    """A process of 32 threads hashing at once (the hash lets go of the interpreter's lock) on this
    machine's cores: its threads wait many seconds in all, behind each other, but it waited only
    as long as its thread that waited most. It had the CPU: not starved."""
    pid = os.fork()
    if pid == 0:   # the rank: its threads hash until it is killed
        import hashlib
        import threading
        block = bytes(1 << 20)
        for _ in range(32):
            threading.Thread(target=lambda: [hashlib.sha256(block).digest() for _ in iter(int, 1)], daemon=True).start()
        time.sleep(60)
        os._exit(0)
    try:
        time.sleep(1.0)
        cpu = cpu_time([pid])
        # A thread that ended between the listing of its process's threads and the reading of its
        # own times is passed by, not taken for times the kernel does not keep (which would count
        # as starved).
        listed = os.listdir
        monkeypatch.setattr(os, "listdir", lambda path: listed(path) + (["999999999"] if path.endswith("/task") else []))
        assert cpu_time([pid]) is not None
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert cpu.run > 0.5 and cpu.wait <= 1.5, cpu
    assert not starved(cpu, 0.3, 1), cpu


def test_a_processs_threads_are_read_twice_and_say_whether_they_are_still_at_work():
    """A process asleep however long it waited before is not busy in the window after the timeout;
    one that spins is."""
    import hashlib
    for spinning in (False, True):
        pid = os.fork()
        if pid == 0:
            if spinning:
                block = bytes(1 << 16)
                while True:
                    hashlib.sha256(block).digest()
            time.sleep(60)
            os._exit(0)
        try:
            time.sleep(0.3)
            cpu = cpu_time([pid])
        finally:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        assert (cpu.busy >= 0.05) == spinning, (spinning, cpu)


def test_a_worlds_cgroup_at_its_limit_makes_its_memory_stalls_its_own(tmp_path):
    for version, used, limit in ((2, "memory.current", "memory.max"), (1, "memory.usage_in_bytes", "memory.limit_in_bytes")):
        folder = tmp_path / f"v{version}"
        folder.mkdir()
        (folder / limit).write_text(f"{1 << 30}\n")
        (folder / used).write_text(f"{(1 << 30) - (1 << 20)}\n")
        assert at_its_limit([str(folder)])
        (folder / used).write_text(f"{1 << 29}\n")
        assert not at_its_limit([str(folder)])
    (tmp_path / "v2" / "memory.max").write_text("max\n")
    assert not at_its_limit([str(tmp_path / "v2")]) and not at_its_limit([])


@pytest.mark.timeout(300)
def test_a_rank_asleep_or_looping_alone_hung_and_its_message_says_what_it_had_of_the_cpu(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)   # as a TA's shell has it: the ranks' own buffering
    rubric = load_rubric()
    clock = 1.5
    clocked = dataclasses.replace(rubric, timeouts=dataclasses.replace(rubric.timeouts, part=clock))
    cores = min(4, len(os.sched_getaffinity(0)))
    executor = WarmExecutor("auto", rubric.limits)

    def hung(body: str):
        # Beside the suite's other tests (make test runs two at once) a world may truly be kept from
        # the CPU, and is then starved by its own times, never by the disk alone: tried again, as
        # the grader runs such a part again, until it ran on a quiet enough machine
        for _ in range(4):
            run = run_check(executor, baseline_with(tmp_path, body), rubric.default_check, clocked, tmp_path,
                            parts=["baseline"])["baseline"]
            if not run.starved:
                return run
            numbers = CpuTime(run=_seconds(run.detail, "its ranks ran "), wait=_seconds(run.detail, " and waited "),
                              cores=len(os.sched_getaffinity(0)))
            assert starved(numbers, clock, 4), ("starved, though its ranks had the CPU they wanted", run.detail)
        return run

    try:
        asleep, looping, parked = (hung(body) for body in (SLEEPS, PRINTS + LOOPS, IN_STATE_D))
    finally:
        executor.close()
    # Parked in state D on a machine with memory to spare: its own wait, not the disk's (the part
    # would otherwise run again on the rubric's own clock, every part of every check).
    assert "waiting for the disk" in parked.detail, parked.detail
    for run in (asleep, looping, parked):
        assert run.status.value == "timeout" and run.starved is False, (run.status, run.detail)
        assert f"still running after {clock:g} s" in run.detail and "waited" in run.detail, run.detail
    assert "before the loop" in looping.output and "and on stderr" in looping.output, looping.output
    ran, slept = _seconds(looping.detail, "its ranks ran "), _seconds(asleep.detail, "its ranks ran ")
    # Looping ranks ran at least a quarter of what the cores could give; sleeping ones hardly at all.
    assert ran >= clock * cores / 4 and slept < clock / 4, (looping.detail, asleep.detail)
