"""What one rank of a re-run may use: the rubric's `limits`, which the sandbox enforces, and how long.

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
    """What one rank of a re-run may use (the sandbox enforces them)."""
    memory_mb: int = 2048      # address space of one rank (a rank needs about 1 GB)
    processes: int = 128       # processes and threads of one world's user
    file_mb: int = 64          # largest file a rank may write (its output included)
    tmp_mb: int = 64           # size of the world's /tmp
    cpu_s: int = 300           # CPU seconds of one rank
