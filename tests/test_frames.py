"""Every reply between a zygote and its executor is delivered, and delivered as its own world's: the
framed stream (grader.rerun.wire.channel) over real pipes and real processes, writers killed mid-frame
included; and a world's supervisor orders its ranks' code loaded only once every rank joined."""

import os
import signal
import sys
import textwrap

import pytest

from grader.rerun.wire import channel, protocol
from grader.rerun.executor import WarmExecutor
from grader.rerun.supervise import _Watch
from grader.rerun.wire.protocol import WorldJob, WorldReport


def frame(world: int, message) -> bytes:
    read, write = os.pipe()
    channel.send_framed(write, world, protocol.encode(message))
    os.close(write)
    with os.fdopen(read, "rb") as f:
        return f.read()


def report(detail: str) -> WorldReport:
    return WorldReport(output={0: detail * 2000})   # large: written in several pieces


def test_frames_fed_a_byte_at_a_time_come_out_whole_and_in_order():
    data = frame(1, report("a")) + frame(1, protocol.Hello()) + frame(2, report("b"))
    reader = channel.FramedReader()
    pairs = [pair for i in range(len(data)) for pair in reader.feed(data[i:i + 1])]
    assert [(world, message["type"]) for world, message in pairs] == [(1, "world_report"), (1, "hello"),
                                                                        (2, "world_report")]
    assert pairs[2][1]["output"]["0"] == "b" * 2000 and reader.skipped == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="F_SETPIPE_SZ is Linux's")
def test_a_widened_pipe_takes_a_whole_report_in_one_write():
    """A report of 350 KB crosses a widened pipe in one write, where a pipe's 64 KB would take six turns."""
    import fcntl
    read, write = os.pipe()
    try:
        channel.widen(read, write)
        assert fcntl.fcntl(write, fcntl.F_GETPIPE_SZ) == channel.PIPE_BYTES
        os.set_blocking(write, False)   # a write that did not fit would raise BlockingIOError
        channel.send_framed(write, 3, protocol.encode(WorldReport(output={0: "x" * 350_000})))
        pairs = channel.FramedReader().feed(os.read(read, channel.PIPE_BYTES))
        assert [(world, m["type"], len(m["output"]["0"])) for world, m in pairs] == [(3, "world_report", 350_000)]
    finally:
        os.close(read)
        os.close(write)


@pytest.mark.timeout(60)
def test_a_writer_killed_in_the_middle_of_a_frame_costs_only_that_frame():
    """A leader killed half-way through its report, then the zygote's own frames on the same pipe:
    the reader steps over the torn frame and delivers every whole one after it."""
    read, write = os.pipe()
    whole = frame(7, report("x"))
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(write, whole[:len(whole) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(pid, 0)
    channel.send_framed(write, 7, protocol.encode(protocol.stopped(None, protocol.StopReason.RANK_DIED, "killed")))
    channel.send_framed(write, 7, protocol.encode(protocol.Hello()))
    os.close(write)
    reader, pairs = channel.FramedReader(), []
    while chunk := os.read(read, 1000):
        pairs += reader.feed(chunk)
    os.close(read)
    assert [(world, m["type"]) for world, m in pairs] == [(7, "world_report"), (7, "hello")]
    assert pairs[0][1]["abort"]["detail"] == "killed" and reader.skipped == 1


def test_what_a_dead_leader_left_unread_is_stepped_over_and_the_next_request_read_exactly():
    """The zygote's reader: the job and data key of a world whose leader died before reading them
    are stepped over unread; the next world's request is read and not a byte of the frame after it."""
    read, write = os.pipe()
    key = protocol.DataKey(key="ab" * 32)
    data = frame(5, job(["baseline"])) + frame(5, key) + frame(6, protocol.WorldRequest()) + frame(6, key)
    os.write(write, data)
    os.close(write)
    assert channel.read_framed(read, skip_world=5) == (6, {"type": "world"})
    assert os.read(read, len(data)) == frame(6, key)
    os.close(read)


def test_a_frame_whose_bytes_changed_is_stepped_over():
    bad = bytearray(frame(3, report("y")))
    bad[-5] ^= 1
    reader = channel.FramedReader()
    pairs = reader.feed(bytes(bad) + frame(4, protocol.Hello()))
    assert [(world, m["type"]) for world, m in pairs] == [(4, "hello")] and reader.skipped == 1


# A zygote whose leader of world 1 reported and was then killed: it sends the world's report twice
# (the leader's, then its own), as a real zygote does in that case. Every frame is a real one. Its
# leaders read no data key: the zygote steps over each, as a real one does after a leader that died.
TWICE = textwrap.dedent("""
    import sys
    from grader.rerun.wire import channel, protocol
    send = lambda world, message: channel.send_framed(1, world, protocol.encode(message))
    send(0, protocol.Hello(isolation={"sandbox": "none"}))
    channel.read_framed(0)   # Setup: the kit's folder
    world = None
    while True:
        frame = channel.read_framed(0, skip_world=world)   # the data key its leader left unread
        if frame is None or frame[1]["type"] == "exit":
            break
        world, job = frame[0], channel.read_framed(0)[1]
        done = protocol.WorldReport(completed=job["parts"], output={0: f"world {world}"})
        send(world, done)
        if world == 1:
            send(world, protocol.stopped(None, protocol.StopReason.RANK_DIED, "the world's leader was killed (-9)"))
        send(world, protocol.Hello())
""")


class ReportsTwice(WarmExecutor):
    def _command(self):
        return [sys.executable, "-c", TWICE], [], None, []


def job(parts: list) -> WorldJob:
    return WorldJob(work_dir="/nonexistent", code={}, store="", world_size=1, parts=parts, check={},
                    pg_timeout=1.0, limits={})


@pytest.mark.timeout(60)
def test_a_second_report_of_a_world_is_never_taken_for_the_next_worlds_answer():
    executor = ReportsTwice(sandbox="off")
    try:
        first = executor.run_world(job(["baseline"]))
        second = executor.run_world(job(["data_parallel"]))
        third = executor.run_world(job(["tensor_parallel"]))
    finally:
        executor.close()
    assert (first.completed, first.output) == (["baseline"], {0: "world 1"}) and first.abort is None
    assert (second.completed, second.output) == (["data_parallel"], {0: "world 2"}) and second.abort is None
    assert (third.completed, third.output) == (["tensor_parallel"], {0: "world 3"})
    assert executor.stepped_over == 1   # world 1's second report, read and set aside
    assert executor.worlds == 3


@pytest.mark.timeout(300)
def test_a_real_zygote_answers_each_world_with_its_own_report(tmp_path):
    """Several worlds on one warm executor, in the sandbox: each report is its own world's."""
    from grader.rerun.check import prepare_code, run_check
    from grader.rubric import load_rubric
    from tests.corpus import REFERENCE
    rubric = load_rubric()
    executor = WarmExecutor("auto", rubric.limits)
    try:
        for parts in (["baseline"], ["grad_accumulation", "data_parallel"], ["tensor_parallel"]):
            runs = run_check(executor, prepare_code(REFERENCE), rubric.checks[0], rubric, tmp_path, parts=parts)
            assert sorted(runs) == sorted(parts) and {r.status.value for r in runs.values()} == {"passed"}
        if sys.platform.startswith("linux"):   # its job and its reports cross in one write each
            import fcntl
            assert {fcntl.fcntl(p.fileno(), fcntl.F_GETPIPE_SZ) for p in (executor._proc.stdin, executor._proc.stdout)} \
                == {channel.PIPE_BYTES}
    finally:
        executor.close()
    assert executor.stepped_over == 0 and executor.worlds == 3


def test_no_rank_loads_the_handins_code_before_every_rank_joined_gloo():
    """gloo's first side of a connection is done once it has written to it: a rank sent its code
    while a peer still joins could end (a hand-in that crashes at once) and close the connection
    under it, a join failing as the machine's. The supervisor's orders, over real pipes: Load to
    each rank only once every rank said Joined; an infrastructure error before that, or a rank not
    joined in the world's start clock, is the machine's, and the world ends on it."""
    def framed(message) -> bytes:   # what a rank writes to its result pipe
        read, write = os.pipe()
        protocol.send(write, message)
        os.close(write)
        with os.fdopen(read, "rb") as f:
            return f.read()

    def pending(fd: int) -> list:   # the orders a rank has not read yet
        reader, found = channel.Reader(), []
        try:
            while data := os.read(fd, 1 << 16):
                found += [protocol.decode(m, protocol.ORDERS) for m in reader.feed(data)]
        except BlockingIOError:
            pass
        return found

    job = protocol.WorldJob(work_dir="", code={}, store="", world_size=3, parts=["baseline"], check={},
                            pg_timeout=5, limits={}, timeouts=protocol.Timeouts(world_start=30))
    pipes = {rank: os.pipe() for rank in range(3)}
    for read, _ in pipes.values():
        os.set_blocking(read, False)
    try:
        watch = _Watch(job, dict.fromkeys(pipes), {rank: write for rank, (_, write) in pipes.items()}, {})
        for rank in (2, 0):
            watch.received(rank, framed(protocol.Joined()))
            assert all(pending(read) == [] for read, _ in pipes.values()), rank
        watch.received(1, framed(protocol.Joined()))
        assert all(pending(read) == [protocol.Load()] for read, _ in pipes.values())
        assert watch.abort is None and "joined" in watch.timeline

        late = _Watch(job, dict.fromkeys(pipes), {rank: write for rank, (_, write) in pipes.items()}, {})
        late.received(0, framed(protocol.Joined()))
        late.received(1, framed(protocol.InfraError(error=protocol.ErrorInfo(exception="RuntimeError: closed by peer"))))
        assert late.abort.reason == protocol.StopReason.INFRA_ERROR, late.abort
        assert late.abort.detail == "rank 1 could not join gloo: RuntimeError: closed by peer", late.abort
        assert all(pending(read) == [] for read, _ in pipes.values())

        # Past the world's start clock: a rank that has not joined is the machine's; a rank that
        # joined but has not loaded the code, the hand-in's.
        for joined, reason, detail in (((0, 2), protocol.StopReason.INFRA_ERROR, "ranks [1] did not join gloo within 30 s"),
                                       ((0, 1, 2), protocol.StopReason.START_TIMEOUT,
                                        "ranks [0, 1, 2] did not load the code within 30 s")):
            slow = _Watch(job, dict.fromkeys(pipes), {rank: write for rank, (_, write) in pipes.items()}, {})
            for rank in joined:
                slow.received(rank, framed(protocol.Joined()))
            slow.next_deadline(slow.start_deadline + 1)
            assert (slow.abort.reason, slow.abort.detail) == (reason, detail), slow.abort
    finally:
        for fds in pipes.values():
            for fd in fds:
                os.close(fd)


def test_a_supervisor_the_kernel_killed_for_its_worlds_memory_reports_out_of_memory():
    """The init of a world's PID namespace killed (SIGKILL) while its cgroup counted an out-of-memory
    kill (the ranks' memory, mid-teardown, not yet given back) ends the world out of memory, with
    the verdict every layer gives; killed otherwise, the world is lost (its parts crashed)."""
    from grader.rerun.sandbox import memory
    from grader.rerun.world import killed_report
    job = WorldJob(work_dir="/tmp/world", code={}, store="/tmp/world/store", world_size=2,
                   parts=["baseline", "grad_accumulation"], check={}, pg_timeout=1.0, limits={"memory_mb": 800})
    report = killed_report(job, "the world's supervisor", -signal.SIGKILL, out_of_memory=True)
    assert report.abort.reason == protocol.StopReason.OUT_OF_MEMORY and report.abort.part is None
    assert report.abort.detail == memory.verdict(800) and set(report.results) == {"baseline", "grad_accumulation"}
    for code, kills in ((-signal.SIGKILL, False), (1, True)):
        lost = killed_report(job, "the world's supervisor", code, out_of_memory=kills)
        assert lost.abort.reason == protocol.StopReason.RANK_DIED, (code, kills)
        assert lost.abort.detail == f"the world's supervisor ended with {code}"


def test_what_no_reader_can_take_is_the_senders_malformed_message_never_the_readers_failure():
    """A number too long to read (Python 3.11's limit of 4300 digits), a whole number past any float,
    text with lone surrogates, an empty tensor: each a rank can put on its pipe. The first two are
    malformed messages (ChannelError, the rank's), the others read as they can be written."""
    import json
    import torch
    with pytest.raises(channel.ChannelError):
        channel._message(b'{"type": "done", "n": ' + b"9" * 5000 + b"}")
    result = protocol.encode(protocol.Result(part="baseline", status=protocol.RankStatus.OK, seconds=1.0))
    result["seconds"] = 10 ** 400
    with pytest.raises(channel.ChannelError):
        protocol.decode(json.loads(json.dumps(result)), protocol.RANK_MESSAGES)
    read = channel._message(json.dumps({"type": "done", "text": "boom \udc80 \U0001F600"}).encode())
    assert read["text"] == "boom \ufffd \U0001F600"
    for empty in (torch.empty(0), torch.empty(3, 0)):
        assert channel.decode_tensor(channel.encode_tensor(empty)).shape == empty.shape
