"""What one world of a re-run may use: the rubric's `limits`, which the sandbox enforces, and how long.

Its own module so that the processes that run hand-in code import this and nothing else of the
rubric (no loader, no YAML, nothing a hand-in could find in its own memory).
"""

from dataclasses import dataclass

# The rubric's `timeouts` a re-run needs inside its world (grader.rubric.Timeouts has them all, and
# grader.rerun.protocol.Timeouts what a world's leader is told), written once here.
PART_SECONDS = 20.0          # wall clock of one part in one world
WORLD_START_SECONDS = 60.0   # from starting a world to every rank having loaded the code


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
