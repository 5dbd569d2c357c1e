"""The fork-and-gloo floor a world is measured against: `world_size` ranks forked from a warm
process (torch imported, one step taken), each joining gloo over the store a world's ranks join
over (grader.rerun.rank.store: rank 0 serves it on a socket the parent opened) and all-reducing
once, then exiting. What a world of the warm executor cannot do without; benchmarks/world_layers.py
and benchmarks/grading_throughput.py divide by it. A helper, not a benchmark (its name starts with _).

`work`, where given, replaces the all-reduce: each rank calls it after joining gloo. With the
reference's part functions (`reference_parts`), the floor is the world's own work done bare, no
grader around it: what the ranks cannot be spared, so that a world's ratio to it is what the
grader's layers cost.
"""

import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist

from grader.rerun.rank import store as rendezvous
from grader.rerun.rank import worker
from grader.rerun.sandbox import environment


def busy_seconds():
    """The machine's CPU time so far, every process's, user and system (/proc/stat), in seconds;
    None where there is no /proc/stat. What a world costs the machine, whichever process paid it."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")   # all but idle and iowait


def fork_gloo_floor(repeats: int = 20, world_size: int = 4, work=None, cpu: dict = None) -> float:
    """Median seconds to fork `world_size` ranks from a warm process, join gloo, all-reduce once
    (or call `work`), exit. The process is warmed as the zygote is, its memory in huge pages too
    (grader.rerun.sandbox.environment.fold_into_huge_pages): the floor forks no slower than a world.
    `cpu`, where given, gets "per_world": the machine's CPU seconds (busy_seconds) a world."""
    worker.warm_up()
    environment.fold_into_huge_pages()
    times, busy = [], busy_seconds()
    for _ in range(repeats):
        started = time.perf_counter()
        pids = []
        listener = rendezvous.listen(world_size)
        port = listener.getsockname()[1]
        for rank in range(world_size):
            pid = os.fork()
            if pid == 0:
                code = 1   # a rank that failed ends too, never going on as a copy of this process
                try:
                    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
                    os.dup2(listener.fileno(), rendezvous.FD)
                    dist.init_process_group("gloo", store=rendezvous.join(rank, world_size, port, "", 30), rank=rank,
                                            world_size=world_size, timeout=datetime.timedelta(seconds=30))
                    work() if work else dist.all_reduce(torch.ones(4))
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
        listener.close()
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        times.append(time.perf_counter() - started)
        if any(codes):   # a floor whose ranks did not do the work would measure less than it
            raise RuntimeError(f"a rank of the floor's world failed (exit codes {codes})")
    if cpu is not None and busy is not None:
        cpu["per_world"] = (busy_seconds() - busy) / repeats
    return statistics.median(times)


def reference_parts(parts: list):
    """A `work` for fork_gloo_floor: the reference's functions of `parts` (part ids), each called as
    a rank of the grader calls it (seed 42, the CPU), what they print thrown away. The reference is
    loaded here, in the warm process, as the grader's zygote loads nothing of a hand-in's: its
    import is not the floor's to pay in every world."""
    import importlib.util
    import sys
    from pathlib import Path
    from grader.parts import BY_ID
    from grader.rerun.rank.hooks import disarm_cuda_calls
    root = Path(__file__).resolve().parent.parent / "assignment_4"
    sys.path.insert(0, str(root))
    spec = importlib.util.spec_from_file_location("a4_floor_reference", root / "reference" / "assignment4.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    functions = [getattr(module, BY_ID[part].function) for part in parts]

    def work():
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        disarm_cuda_calls()   # as a rank: seeding no accelerator (grader.rerun.rank.hooks)
        for function in functions:
            function(seed=42, device="cpu")
    return work
