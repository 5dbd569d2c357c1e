"""A run in which the last rank crashes (exit status 3) right after the process group is up.

The other ranks wait at a barrier for it; the job must end as failed, saying a rank crashed.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "assignment_4"))
from utils import init_distributed, log  # noqa: E402

import torch.distributed as dist  # noqa: E402

rank, _, world_size = init_distributed()
if rank == world_size - 1:
    log(f"[Rank {rank}] crashing on purpose")
    sys.exit(3)
dist.barrier()
log(f"[Rank {rank}] done")
