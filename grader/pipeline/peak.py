"""What a world of the reference used, measured from outside (doctor and the canary's limits cause):
the most memory and tasks of the processes started below this one while it ran."""

import os
import threading
import time

from grader.rerun.sandbox.pss import HAS_PROC, descendants, tree, used


class Peak:
    """The most memory (sum of Pss, MB) and tasks the processes below this one that were not there
    at the start used together, polled every 20 ms while a world runs."""

    def __init__(self):
        self.before = set(descendants(os.getpid())) if HAS_PROC else set()
        self.memory_mb = self.tasks = 0
        self._running = True
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self):
        if HAS_PROC:
            self._thread.start()
        return self

    def __exit__(self, *_):
        self._running = False
        if self._thread.is_alive():
            self._thread.join()

    def _poll(self):
        while self._running:
            children, threads = tree()
            new = [p for p in descendants(os.getpid(), children) if p not in self.before]
            self.memory_mb = max(self.memory_mb, used(new) >> 20)
            self.tasks = max(self.tasks, sum(threads.get(p, 1) for p in new))
            time.sleep(0.02)
