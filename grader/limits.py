"""What one world of a re-run may use: the rubric's `limits`, which the sandbox enforces, and how long.

Its own module so that the processes that run hand-in code import this and nothing else of the
rubric (no loader, no YAML, nothing a hand-in could find in its own memory).
"""

import math
from dataclasses import dataclass

# The rubric's `timeouts`, each default written once here (grader.rubric.Timeouts has them all,
# grader.rerun.protocol.Timeouts what a world's leader is told), in seconds.
PART_SECONDS = 20.0           # wall clock of one part in one world
PROCESS_GROUP_SECONDS = 10.0  # how long a collective waits for a missing rank
WORLD_START_SECONDS = 60.0    # from starting a world to every rank having loaded the code
HANDIN_SECONDS = 600.0        # all re-runs of one hand-in
HELPER_MB = 1024              # a grader's, or a re-run helper's, own memory beside its worlds (CUDA build: 0.6 GB)
# Open files of one rank (RLIMIT_NOFILE, soft and hard): a rank of the reference holds 12 at 4 ranks
# (its output, result and data pipes, gloo's sockets to each peer and its store), a world of 16 ranks
# about 30. Each open socket or pipe may hold kernel buffers no Pss shows; the watchdog counts the
# sockets' (grader.rerun.outside), and this bounds how many a rank can hold.
RANK_OPEN_FILES = 256


@dataclass
class Limits:
    """What one world of a re-run may use (grader.rerun.sandbox, cgroup and memory enforce them)."""
    # Memory of one world: its ranks and everything they start, together (the sum of their Pss), held
    # by a cgroup of the world's own where there is one and by a watchdog everywhere. A 4-rank world of
    # the reference at the stock rubric's largest check peaks near 260 MB with torch's CPU build and
    # 390 MB with its CUDA build (which maps 3 GB of address space at `import torch`, none of it a
    # limit's business): 4096 leaves a hand-in ten times that.
    memory_mb: int = 4096
    processes: int = 128       # processes and threads of one world, together (a 4-rank world runs about 20)
    file_mb: int = 64          # largest file a rank may write (its output included)
    tmp_mb: int = 64           # size of the world's /tmp
    cpu_s: int = 300           # CPU seconds of one rank


@dataclass
class SlurmTask:
    """What one grading array task asks Slurm for."""
    minutes: int
    cpus: int
    mem_gb: int

    def __str__(self) -> str:
        return f"{self.minutes} min, {self.cpus} CPUs, {self.mem_gb} GB"


def slurm_task(chunk: int, jobs: int, handin_s: float = HANDIN_SECONDS,
               memory_mb: int = Limits.memory_mb) -> SlurmTask:
    """What an array task grading `chunk` hand-ins, `jobs` at once, needs at most (`handin_s`, the
    rubric's timeouts.handin; `memory_mb`, its limits.memory_mb):

        minutes = (ceil(chunk / jobs) + 1) x handin_s / 60 + 5: every hand-in may run out its
                  timeout, and so may the canary before them (the reference at every check);
                  5 for the helpers to start
        cpus    = max(2, jobs): a world's ranks compute on one thread each, and wait on each other
        mem_gb  = (jobs x (memory_mb + HELPER_MB) + HELPER_MB) / 1024: every world at its limit,
                  its helper, and the grader
    """
    rounds = math.ceil(chunk / max(1, jobs)) + 1
    return SlurmTask(minutes=math.ceil(rounds * handin_s / 60) + 5, cpus=max(2, jobs),
                     mem_gb=math.ceil((jobs * (memory_mb + HELPER_MB) + HELPER_MB) / 1024))
