"""The fork-and-gloo floor a world is measured against: `world_size` ranks forked from a warm
process (torch imported, one step taken), each joining gloo over a file store and all-reducing
once, then exiting. What a world of the warm executor cannot do without; benchmarks/world_layers.py
and benchmarks/grading_throughput.py divide by it. A helper, not a benchmark (its name starts with _).
"""

import datetime
import os
import shutil
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

from grader.rerun.rank import worker


def fork_gloo_floor(repeats: int = 20, world_size: int = 4) -> float:
    """Median seconds to fork `world_size` ranks from a warm process, join gloo, all-reduce once, exit."""
    worker.warm_up()
    times = []
    for _ in range(repeats):
        store = tempfile.mkdtemp(prefix="a4-floor-")
        started = time.perf_counter()
        pids = []
        for rank in range(world_size):
            pid = os.fork()
            if pid == 0:
                dist.init_process_group("gloo", store=dist.FileStore(f"{store}/s", world_size), rank=rank,
                                        world_size=world_size, timeout=datetime.timedelta(seconds=30))
                dist.all_reduce(torch.ones(4))
                os._exit(0)
            pids.append(pid)
        for pid in pids:
            os.waitpid(pid, 0)
        times.append(time.perf_counter() - started)
        shutil.rmtree(store, ignore_errors=True)
    return statistics.median(times)
