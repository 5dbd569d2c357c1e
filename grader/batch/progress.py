"""The batch's progress line: hand-ins done, the last one's result, the time so far and an ETA that
stays honest while a hand-in is slow.

The line is written when a hand-in is graded, and again while one runs much longer than the others
(a hang runs out its clock, grader.limits.part_clock): the ETA then grows with it, and the line
names the slow hand-in, instead of standing still on an estimate made before it started.
"""

import sys
import threading
import time

SLOW = 3.0          # a hand-in running this many times the mean of those done so far is slow
SLOW_SECONDS = 10   # ... and at least this long
TICK = {True: 1.0, False: 30.0}   # seconds between lines while a hand-in is slow: on a terminal, in a log


def eta(durations: list, running: list, left: int, workers: int) -> float:
    """Seconds until the batch ends: `durations` of the hand-ins done, `running` the seconds so far
    of those being graded, `left` not started, `workers` graded at once.

        m      = the mean time of a hand-in, a slow one's time so far counted in: (sum of durations
                 + sum of e_i over the slow ones) / (done + slow ones); a running one is slow when
                 its e_i passes m computed without it
        r_i    = m - e_i for one that is not slow; m for a slow one, which has run longer than the
                 others took and whose end is unknown: at least as long again as a typical hand-in
        eta    = max(max r_i, (sum r_i + left x m) / workers)
    """
    if not durations and not running:
        return 0.0
    base = sum(durations) / len(durations) if durations else max(running)
    slow = [e for e in running if e > base]
    m = (sum(durations) + sum(slow)) / (len(durations) + len(slow)) if durations else base
    remaining = [m if e > base else m - e for e in running]
    return max(max(remaining, default=0.0), (sum(remaining) + left * m) / max(1, workers))


class Progress:
    """The progress line of a batch of `total` hand-ins graded `workers` at once (on stderr)."""

    def __init__(self, total: int, enabled: bool, workers: int = 1):
        self.total, self.done, self.enabled, self.workers = total, 0, enabled, workers
        self.started = time.monotonic()
        self.durations, self.running = [], {}   # student -> when its grading started
        self.tty = sys.stderr.isatty()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.last = ""
        if enabled:
            threading.Thread(target=self._watch, name="a4-progress", daemon=True).start()

    def begin(self, student: str) -> None:
        with self.lock:
            self.running[student] = time.monotonic()

    def step(self, student: str, text: str) -> None:
        with self.lock:
            self.done += 1
            began = self.running.pop(student, None)
            if began is not None:
                self.durations.append(time.monotonic() - began)
            self.last = f"{student}: {text}"
            self._write()

    def close(self) -> None:
        self.stopped.set()

    def _slow(self, now: float) -> list:
        """(seconds so far, student) of the hand-ins running far longer than the mean, longest first."""
        mean = sum(self.durations) / len(self.durations) if self.durations else 0.0
        return sorted(((now - t, s) for s, t in self.running.items()
                       if now - t > max(SLOW * mean, SLOW_SECONDS)), reverse=True)

    def line(self, now: float) -> str:
        """The line as it reads at `now`."""
        elapsed = now - self.started
        left = self.total - self.done - len(self.running)
        seconds = eta(self.durations, [now - t for t in self.running.values()], left, self.workers)
        width = 24
        bar = "#" * int(width * self.done / max(self.total, 1))
        slow = self._slow(now)
        said = f"; {slow[0][1]} still grading, {slow[0][0]:.0f} s so far" if slow else ""
        return (f"[{bar:<{width}}] {self.done}/{self.total}  {self.last}  "
                f"({elapsed:.0f} s, about {seconds:.0f} s left{said})")

    def _write(self) -> None:
        if not self.enabled:
            return
        line = self.line(time.monotonic())
        if self.tty:
            sys.stderr.write("\r\033[K" + line[:160] + ("\n" if self.done == self.total else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def _watch(self) -> None:
        """While a hand-in is slow, write the line again every TICK: its ETA grows with the hand-in."""
        while not self.stopped.wait(TICK[self.tty]):
            with self.lock:
                if self.done < self.total and self._slow(time.monotonic()):
                    self._write()
