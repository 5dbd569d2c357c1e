"""Watch one world's ranks until the world is complete or must end, and say which part ended it.

`supervise` reads every rank's messages (grader.rerun.protocol) from its own pipe and decides:

- all ranks reported every part: the world is complete;
- a part's results disagree across ranks (ok on some, an error on others) or a collective failed:
  the ranks may be out of step, so the world is ended and the report says at which part;
- a part runs past its wall clock, or a rank dies: likewise, naming the part;
- the code does not load, or gloo does not start: the world ends before any part;
- a rank sends a malformed message or one out of order (hand-in code writing to the pipe): the
  world ends at the earliest part not yet settled.
"""

import os
import selectors
import signal
import time

from grader.rerun import channel, protocol
from grader.rerun.protocol import Abort, RankStatus, StopReason, WorldJob, WorldReport

OUTPUT_HEAD = 4096
OUTPUT_TAIL = 8192


def _output(work_dir: str, world_size: int) -> dict:
    """Head and tail of what each rank wrote to stdout/stderr."""
    out = {}
    for rank in range(world_size):
        path = os.path.join(work_dir, f"rank{rank}.out")
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(OUTPUT_HEAD)
                if size > OUTPUT_HEAD + OUTPUT_TAIL:
                    f.seek(size - OUTPUT_TAIL)
                    head += b"\n[... %d bytes left out ...]\n" % (size - OUTPUT_HEAD - OUTPUT_TAIL)
                head += f.read()
            out[rank] = head.decode("utf-8", "replace")
        except OSError:
            out[rank] = ""
    return out


PROGRESS_TAIL = 65536


def _progress(work_dir: str, world_size: int) -> dict:
    """The tail of each rank's record of its last part's collectives (grader.rerun.hooks), read
    after the world ended: what a rank that never reported was waiting in."""
    out = {}
    for rank in range(world_size):
        try:
            with open(os.path.join(work_dir, f"rank{rank}.calls"), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(0, size - PROGRESS_TAIL))
                out[rank] = f.read(PROGRESS_TAIL).decode("utf-8", "replace")
        except OSError:
            pass
    return out


def _end(pgid: int, pids: list, grace: float = 0.0) -> dict:
    """Kill the world's process group and reap its ranks; return each rank's exit code (-signal)."""
    deadline = time.monotonic() + grace
    codes = {}
    while grace and time.monotonic() < deadline and len(codes) < len(pids):
        for rank, pid in enumerate(pids):
            if rank not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[rank] = os.waitstatus_to_exitcode(status)
        time.sleep(0.005)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for rank, pid in enumerate(pids):
        if rank not in codes:
            try:
                codes[rank] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            except ChildProcessError:
                codes[rank] = None
    return codes


def _in_order(expecting: dict, rank: int, message, parts: list) -> bool:
    """Whether `message` is the one rank `rank` may send now: ready, then start/result for each part
    in the job's order, then done. Advances the rank's expectation."""
    kind, part = message.TYPE, getattr(message, "part", None)
    want = expecting[rank]
    if want == "ready":
        ok = kind == "ready"
        nxt = ("start", parts[0]) if parts else "done"
    elif isinstance(want, tuple) and want[0] == "start":
        ok = kind == "start" and part == want[1]
        nxt = ("result", want[1])
    elif isinstance(want, tuple) and want[0] == "result":
        ok = kind == "result" and part == want[1]
        i = parts.index(want[1]) + 1
        nxt = ("start", parts[i]) if i < len(parts) else "done"
    else:
        ok, nxt = kind == "done", "nothing"
    if ok:
        expecting[rank] = nxt
    return ok


class _Watch:
    """The supervisor's state for one world: what every rank has said, and when."""

    def __init__(self, job: WorldJob, fds: dict):
        self.job, self.parts, self.size = job, job.parts, job.world_size
        self.started = time.monotonic()
        self.start_deadline = self.started + job.timeouts.world_start
        self.timeline = {}      # when (s after the ranks were forked) every rank was ready, was done
        self.readers = {rank: channel.Reader() for rank in fds}
        self.ranks = set(fds)
        self.ready, self.done, self.closed = set(), set(), set()
        self.gave_up = set()    # ranks that reported a failed collective and then ended on purpose
        self.expecting = {rank: "ready" for rank in fds}   # the only message each rank may send next
        self.in_part = {}       # rank -> the part it last started
        self.results = {p: {} for p in self.parts}
        self.part_started = {}
        self.skipped = []
        self.judged = 0         # parts[:judged] have a consistent result from every rank
        self.abort = None

    def stop(self, reason: StopReason, part=None, detail: str = "", error=None) -> None:
        if self.abort is None:
            self.abort = Abort(reason=reason, part=part, detail=detail, error=error)

    @property
    def current(self):
        return self.parts[self.judged] if self.judged < len(self.parts) else None

    def settle(self) -> None:
        """Advance `judged` over the parts every rank has reported; stop where they disagree.
        Once the world is stopping, nothing more is settled: the part it stopped at stays failed."""
        while self.abort is None and self.judged < len(self.parts) and len(self.results[self.current]) == self.size:
            statuses = sorted({m.status.value for m in self.results[self.current].values()})
            if RankStatus.DIST_ERROR.value in statuses:
                return self.stop(StopReason.DIST_ERROR, self.current)
            if len(statuses) > 1:
                return self.stop(StopReason.RANKS_DISAGREE, self.current, " / ".join(statuses))
            self.judged += 1

    @property
    def complete(self) -> bool:
        return self.judged == len(self.parts) and len(self.done) == self.size

    def next_deadline(self, now: float):
        """The nearest wall clock, after stopping the world if one has run out."""
        deadlines = []
        if len(self.ready) < self.size:
            deadlines.append(self.start_deadline)
            if now >= self.start_deadline:
                self.stop(StopReason.START_TIMEOUT, None, f"ranks {sorted(self.ranks - self.ready)} did not "
                                                          f"load the code within {self.job.timeouts.world_start:g} s")
        if self.current in self.part_started:
            deadline = self.part_started[self.current] + self.job.timeouts.part
            deadlines.append(deadline)
            if now >= deadline:
                late = sorted(self.ranks - set(self.results[self.current]))
                self.stop(StopReason.TIMEOUT, self.current,
                          f"ranks {late} still running after {self.job.timeouts.part:g} s")
        return min(deadlines) if deadlines else None

    def closed_pipe(self, rank: int) -> None:
        self.closed.add(rank)
        if rank not in self.done and rank not in self.gave_up:
            self.stop(StopReason.RANK_DIED, self.current, f"rank {rank} exited before it finished")

    def received(self, rank: int, data: bytes) -> None:
        try:
            messages = [protocol.decode(m, protocol.RANK_MESSAGES) for m in self.readers[rank].feed(data)]
        except channel.ChannelError as e:
            return self.stop(StopReason.PROTOCOL, self.current, f"rank {rank} sent a malformed message: {e}")
        for message in messages:
            if self.abort is not None:
                return
            self.on_message(rank, message)

    def on_message(self, rank: int, message) -> None:
        if not isinstance(message, (protocol.LoadFailed, protocol.InfraError)) and \
                not _in_order(self.expecting, rank, message, self.parts):
            # Blame the earliest part not yet settled: the rank's own, even if a forged result had
            # completed it, or an earlier one that processes of this rank ran ahead of.
            blamed = self.in_part.get(rank, self.current)
            if blamed in self.parts:
                self.judged = min(self.judged, self.parts.index(blamed))
            return self.stop(StopReason.PROTOCOL, self.current,
                             f"rank {rank} sent {message.TYPE!r} out of order (a second result, or a "
                             f"message written by the hand-in itself)")
        if isinstance(message, protocol.Ready):
            self.ready.add(rank)
            if len(self.ready) == self.size:
                self.timeline["ready"] = round(time.monotonic() - self.started, 4)
            self.skipped = message.skipped_lines
        elif isinstance(message, protocol.Start):
            self.part_started.setdefault(message.part, time.monotonic())
            self.in_part[rank] = message.part
        elif isinstance(message, protocol.Result):
            self.results[message.part].setdefault(rank, message)
            if message.status == RankStatus.DIST_ERROR:
                self.gave_up.add(rank)
        elif isinstance(message, protocol.Done):
            self.done.add(rank)
            if len(self.done) == self.size:
                self.timeline["done"] = round(time.monotonic() - self.started, 4)
        elif isinstance(message, protocol.LoadFailed):
            self.stop(StopReason.LOAD_FAILED, None, message.error.exception, error=message.error)
        elif isinstance(message, protocol.InfraError):
            self.stop(StopReason.INFRA_ERROR, None, message.error.exception)


def supervise(job: WorldJob, fds: dict, pids: list, pgid: int, collect_output=None,
              launcher_exited=None) -> WorldReport:
    """Watch the ranks of one world until it is complete or must end; see the module docstring.

    `fds` maps each rank to the read end of its result pipe. `launcher_exited`, when given, says
    whether the process that started the ranks has ended (torchrun); the world cannot finish after.
    """
    watch = _Watch(job, fds)
    selector = selectors.DefaultSelector()
    for rank, fd in fds.items():
        selector.register(fd, selectors.EVENT_READ, rank)
    while True:
        watch.settle()
        if watch.abort is not None or watch.complete:
            break
        now = time.monotonic()
        deadline = watch.next_deadline(now)
        if watch.abort is not None:
            break
        if len(watch.closed) == watch.size or (launcher_exited and launcher_exited() and len(watch.done) < watch.size
                                               and not any(selector.select(timeout=0))):
            watch.stop(StopReason.RANK_DIED, watch.current, "the ranks exited before the world was complete")
            break
        wait = 1.0 if deadline is None else min(max(0.0, deadline - now), 1.0)
        for key, _ in selector.select(timeout=wait):
            data = os.read(key.fd, 1 << 16)
            if not data:
                selector.unregister(key.fd)
                watch.closed_pipe(key.data)
            else:
                watch.received(key.data, data)
            if watch.abort is not None:
                break
    exit_codes = _end(pgid, pids, grace=0.5 if watch.abort is None else 0.0)
    for fd in fds.values():
        os.close(fd)
    selector.close()
    watch.timeline["ended"] = round(time.monotonic() - watch.started, 4)
    output = collect_output() if collect_output else _output(job.work_dir, job.world_size)
    progress = _progress(job.work_dir, job.world_size) if watch.abort is not None else {}
    return WorldReport(completed=watch.parts[:watch.judged], results=watch.results, abort=watch.abort,
                       exit_codes=exit_codes, output=output, progress=progress, skipped_lines=watch.skipped,
                       seconds=round(time.monotonic() - watch.started, 3), timeline=watch.timeline)
