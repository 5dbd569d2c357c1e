"""Watch one world's ranks until the world is complete or must end, and say which part ended it.

`supervise` drives every rank through the job's parts: when a rank is ready, and each time it
reports a part, it is sent the next part to run (Run, on its data pipe, with the part's data
(grader.rerun.wire.secret) and a fresh token). It reads every rank's messages
(grader.rerun.wire.protocol) from its own pipe and decides:

- every part is settled (all ranks reported it, alike): the world is complete, and its ranks are
  ended at once, all together (rank 0 serves the world's store): nothing of a rank's is waited
  for after its last result, so a rank that would not end costs nothing;
- a part's results disagree across ranks (ok on some, an error on others) or a collective failed:
  the ranks may be out of step, so the world is ended and the report says at which part;
- a part raised on a rank (crashed, out of memory) and another rank has not reported it a tenth of
  the part's clock later (as long as the reference took for its whole check, PART_FACTOR): the
  part has failed whatever the others do, and they are likely waiting for the failed rank in a
  collective, so the world ends then, not at the part's clock. Ranks that all raise report within
  that time and settle the part as any other; a rank ahead of the others fails its own part once
  the parts before it are settled, never the one they are still running;
- a part runs past its wall clock, or a rank dies: likewise, naming the part (past the clock, with
  what the ranks had of the CPU: grader.rerun.starved). Every gap has a clock: loading
  (world_start) and each part from the moment a rank was sent it (part); a world out of time keeps
  the parts it settled;
- the code does not load: the world ends before any part. Gloo that does not start is the
  machine's failure, believed only before the rank says it loads the hand-in's code; no rank is
  sent Load (its code loaded) before every rank joined, so no hand-in can end a rank under a peer
  still joining it, and a join not done within the start clock is the machine's too;
- a rank sends a malformed message, one out of order, or a result for a part it was not sent
  (no token of a Run it was given): that is hand-in code writing to the pipe, and the world ends at
  the part that rank was running (at loading, before any).
"""

import os
import selectors
import time

from grader.limits import PART_FACTOR
from grader.parts import kind_of
from grader.rerun import ending
from grader.rerun.wire import bounds, channel, protocol
from grader.rerun.wire.protocol import FAILED_ALONE, Abort, RankStatus, StopReason, WorldJob, WorldReport

class _Watch:
    """The supervisor's state for one world: what every rank has said, and when."""

    def __init__(self, job: WorldJob, fds: dict, orders: dict, secrets: dict):
        self.job, self.parts, self.size = job, job.parts, job.world_size
        self.started = time.monotonic()
        self.start_deadline = self.started + job.timeouts.world_start
        self.timeline = {}      # when (s after the ranks were forked) every rank was ready, every part settled
        self.readers = {rank: channel.Reader() for rank in fds}
        self.orders, self.secrets = orders, secrets
        self.ranks = set(fds)
        self.joined, self.ready, self.closed = set(), set(), set()
        self.through = set()    # ranks that reported every part
        self.gave_up = set()    # ranks that reported a failed collective and then ended on purpose
        # What each rank may send next: "joined", "nothing" until every rank joined, then "loading",
        # "load" (Ready or LoadFailed), ("result", i, token) for part i, "nothing".
        self.expecting = {rank: "joined" for rank in fds}
        self.results = {p: {} for p in self.parts}
        self.part_started = {}
        self.failed_at = {}     # part -> when a rank first reported it failed on its own (FAILED_ALONE)
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
        if self.complete and "done" not in self.timeline:
            self.timeline["done"] = round(time.monotonic() - self.started, 4)
        failed = self.abort is None and any(m.status in FAILED_ALONE for m in self.results.get(self.current, {}).values())
        if failed and self.current not in self.failed_at:   # not every rank has reported it, or it was judged above
            self.failed_at[self.current] = time.monotonic()

    @property
    def complete(self) -> bool:
        """Every part settled (every rank loaded the code: a world of no parts loads it, then ends)."""
        return self.judged == len(self.parts) and len(self.ready) == self.size

    def next_deadline(self, now: float):
        """The nearest wall clock, after stopping the world if one has run out."""
        deadlines = []
        if len(self.ready) < self.size:
            deadlines.append(self.start_deadline)
            if now >= self.start_deadline and len(self.joined) < self.size:   # nothing of the hand-in ran yet
                self.stop(StopReason.INFRA_ERROR, None, f"ranks {sorted(self.ranks - self.joined)} did not join "
                                                        f"gloo within {self.job.timeouts.world_start:g} s")
            elif now >= self.start_deadline:
                self.stop(StopReason.START_TIMEOUT, None, f"ranks {sorted(self.ranks - self.ready)} did not "
                                                          f"load the code within {self.job.timeouts.world_start:g} s")
        if self.current in self.part_started:
            deadline = self.part_started[self.current] + self.job.timeouts.part
            deadlines.append(deadline)
            if now >= deadline:
                late = sorted(self.ranks - set(self.results[self.current]))
                self.stop(StopReason.TIMEOUT, self.current,
                          f"ranks {late} still running after {self.job.timeouts.part:g} s")
        if self.current in self.failed_at:
            deadline = self.failed_at[self.current] + self.job.timeouts.part / PART_FACTOR
            deadlines.append(deadline)
            if now >= deadline:
                late = sorted(self.ranks - set(self.results[self.current]))
                self.stop(StopReason.RANK_FAILED, self.current, f"ranks {late} had not finished the part "
                                                                f"{self.job.timeouts.part / PART_FACTOR:g} s after a rank failed it")
        return min(deadlines) if deadlines else None

    def closed_pipe(self, rank: int) -> None:
        self.closed.add(rank)
        if rank not in self.through and rank not in self.gave_up:
            self.stop(StopReason.RANK_DIED, self.running(rank), f"rank {rank} exited before it finished")

    def running(self, rank: int):
        """The part rank `rank` was sent last and has not reported (or the earliest unsettled)."""
        want = self.expecting.get(rank)
        return self.parts[want[1]] if isinstance(want, tuple) else self.current

    def joined_all(self, rank: int) -> None:
        """`rank` joined gloo: once every rank has, each is sent Load (its hand-in's code runs)."""
        self.expecting[rank] = "nothing"
        self.joined.add(rank)
        if len(self.joined) == self.size:
            self.timeline["joined"] = round(time.monotonic() - self.started, 4)
            for each in sorted(self.joined):
                self.expecting[each] = "loading"
                self.order(each, protocol.Load())

    def send_next(self, rank: int, index: int) -> None:
        """Start part `index` on `rank`; where there is none, the rank is through: it waits for an
        order that does not come, until the world ends all its ranks together (rank 0 serves the
        world's store, grader.rerun.rank.store, which a rank still in its last part may be using)."""
        if index < len(self.parts):
            part = self.parts[index]
            token = os.urandom(16).hex()
            self.expecting[rank] = ("result", index, token)
            self.part_started.setdefault(part, time.monotonic())
            from grader.rerun.wire.secret import view   # torch's, loaded in the world that runs this
            return self.order(rank, protocol.Run(part=part, token=token, data=view(self.secrets[part], rank)))
        self.expecting[rank] = "nothing"
        self.through.add(rank)

    def order(self, rank: int, message) -> None:
        try:
            protocol.send(self.orders[rank], message)
        except OSError:
            pass   # the rank closed its data pipe (its hand-in did, or it is gone): its clock runs out

    def received(self, rank: int, data: bytes) -> None:
        try:
            messages = [protocol.decode(m, protocol.RANK_MESSAGES) for m in self.readers[rank].feed(data)]
        except (channel.ChannelError, RecursionError) as e:   # RecursionError: decoding a message nested too deep
            return self.forged(rank, f"sent a malformed message: {e or type(e).__name__}")
        for message in messages:
            if self.abort is not None:
                return
            self.on_message(rank, message)

    def forged(self, rank: int, what: str) -> None:
        """A message the rank's worker could not have sent now: the hand-in's, at the part it ran."""
        want = self.expecting[rank]
        if isinstance(want, tuple):
            self.judged = min(self.judged, want[1])
            return self.stop(StopReason.PROTOCOL, self.parts[want[1]],
                             f"rank {rank} {what} while it ran this part (hand-in code writing to the "
                             f"grader's pipe)")
        if want in ("load", "joined", "loading"):
            return self.stop(StopReason.PROTOCOL, None, f"rank {rank} {what} while assignment4.py was loading")
        return self.stop(StopReason.PROTOCOL, self.current, f"rank {rank} {what} after its last part")

    def on_message(self, rank: int, message) -> None:
        want, kind = self.expecting[rank], message.TYPE
        if isinstance(message, protocol.InfraError):
            if want != "joined":   # after the hand-in's code is loaded, the hand-in speaks for the rank
                return self.forged(rank, "claimed an infrastructure error")
            self.expecting[rank] = "nothing"
            return self.stop(StopReason.INFRA_ERROR, None, f"rank {rank} could not join gloo: {message.error.exception}")
        if isinstance(message, protocol.Result):
            if not (isinstance(want, tuple) and message.part == self.parts[want[1]]):
                return self.forged(rank, f"sent a result for {message.part!r} out of order, a part it was not running")
            if message.token != want[2]:
                return self.forged(rank, f"sent a result for {message.part!r} out of order, without the token "
                                         f"the part was started with")
            self.results[message.part].setdefault(rank, bounds.hold(message, self.job.check, self.size))
            if message.status == RankStatus.DIST_ERROR:
                self.gave_up.add(rank)
                self.expecting[rank] = "nothing"
            else:
                self.send_next(rank, want[1] + 1)
            return
        allowed = {"joined": ("joined",), "loading": ("loading",), "load": ("ready", "load_failed")}
        if not isinstance(want, str) or kind not in allowed.get(want, ()):
            return self.forged(rank, f"sent {kind!r} out of order")
        if isinstance(message, protocol.Joined):
            self.joined_all(rank)
        elif isinstance(message, protocol.Loading):
            self.expecting[rank] = "load"
        elif isinstance(message, protocol.Ready):
            self.ready.add(rank)
            if len(self.ready) == self.size:
                self.timeline["ready"] = round(time.monotonic() - self.started, 4)
            self.skipped = message.skipped_lines
            self.send_next(rank, 0)
        elif isinstance(message, protocol.LoadFailed):
            self.expecting[rank] = "nothing"
            self.stop(StopReason.LOAD_FAILED, None, message.error.exception, error=message.error)


def draw_secrets(job: WorldJob, key: bytes = None) -> dict:
    """The data of every part of the world (grader.rerun.wire.secret): derived from the data `key`, or
    fresh where there is none. Call only once the ranks are forked: no rank may inherit it."""
    from grader.rerun.wire import secret   # torch: the grader's side imports this module before it loads torch
    if key:
        return {part: secret.derive(key, job.check, part, job.world_size) for part in job.parts}
    return {part: secret.draw(part, job.world_size, kind_of(job.check)) for part in job.parts}


def supervise(job: WorldJob, fds: dict, orders: dict, pids: list, pgid: int, secrets: dict,
              collect_output=None, launcher_exited=None, cpu_time=None) -> WorldReport:
    """Watch the ranks of one world until it is complete or must end; see the module docstring.

    `fds` maps each rank to the read end of its result pipe, `orders` to the write end of its data
    pipe; `secrets` (draw_secrets') are the parts' data. `launcher_exited`, when given, says
    whether the process that started the ranks has ended (torchrun); the world cannot finish after.
    `cpu_time()`, when given, is what the ranks had of the CPU, read when a part runs past its clock."""
    watch = _Watch(job, fds, orders, secrets)
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
        if len(watch.closed) == watch.size or (launcher_exited and launcher_exited()
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
    if watch.abort is not None and watch.abort.reason == StopReason.TIMEOUT and watch.abort.part:
        watch.abort.cpu = cpu_time() if cpu_time else None
        late = watch.ranks - set(watch.results[watch.abort.part])
        watch.abort.unread = [r for r in sorted(late) if channel.unread(orders[r])]
    exit_codes = ending.end_ranks(pgid, pids)
    for fd in list(fds.values()) + list(orders.values()):
        os.close(fd)
    selector.close()
    watch.timeline["ended"] = round(time.monotonic() - watch.started, 4)
    output = collect_output() if collect_output else ending.output(job.work_dir, job.world_size)
    progress = ending.progress(job.work_dir, job.world_size) if watch.abort is not None else {}
    return WorldReport(completed=watch.parts[:watch.judged], results=watch.results, abort=watch.abort,
                       exit_codes=exit_codes, output=output, progress=progress, skipped_lines=watch.skipped,
                       seconds=round(time.monotonic() - watch.started, 3), timeline=watch.timeline,
                       secrets=secrets)
