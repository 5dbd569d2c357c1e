"""A run in which the last rank crashes (exit status 3) right after the process group is up.

The other ranks sleep (in no collective, so that they cannot fail on their own): the job must
end as failed because of that one rank, and say which node it ran on.
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "assignment_4"))
from utils import init_distributed, log

rank, _, world_size = init_distributed()
if rank == world_size - 1:
    log(f"[Rank {rank}] crashing on purpose")
    sys.exit(3)
time.sleep(120)
log(f"[Rank {rank}] done")
