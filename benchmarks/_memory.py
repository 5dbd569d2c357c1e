"""The memory of a benchmark's grader and of the processes re-running its hand-ins, sampled as it runs."""

import os
import threading
import time
from pathlib import Path


def memory_mb(pid="self", field="Rss") -> float:
    """A process's resident memory (Rss), or its proportional share of pages shared with others (Pss)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class MemorySampler:
    """Samples the grader's memory and that of the processes re-running hand-ins (the zygotes and
    every rank forked from them, counted by proportional share since they share most pages)."""

    def __init__(self):
        self.grader, self.helpers = [], []
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _helpers(self) -> float:
        """The re-run processes of this benchmark alone: on a shared machine other suites' zygotes
        are in /proc too, and are not its own."""
        parent, zygotes = {}, []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                parent[pid] = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
                if b"grader.rerun.zygote" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    zygotes.append(pid)
            except (OSError, IndexError):
                pass
        return sum(memory_mb(pid, "Pss") for pid in zygotes if _descends(pid, str(os.getpid()), parent))

    def _run(self):
        while self.running:
            self.grader.append(memory_mb())
            self.helpers.append(self._helpers())
            time.sleep(0.2)

    def stop(self):
        self.running = False
        self.thread.join()


def _descends(pid: str, ancestor: str, parent: dict) -> bool:
    """Whether `pid` is `ancestor` or one of its descendants, by the parent ids in `parent`."""
    for _ in range(64):
        if pid == ancestor:
            return True
        if pid not in parent:
            return False
        pid = parent[pid]
    return False
