"""Ranks for `make gpu-check` (benchmarks/gpu_check.py): several ranks on one GPU.

    torchrun --standalone --nproc-per-node 2 benchmarks/_gpu_ranks.py gloo   # gloo with CUDA tensors
    torchrun --standalone --nproc-per-node 2 benchmarks/_gpu_ranks.py nccl   # NCCL, two ranks on one GPU

Rank r computes on GPU r mod (GPUs): with more ranks than GPUs, some share one. Each rank all-reduces
a 64 MB float32 tensor holding r + 1 on its GPU, checks that every element is the sum 1 + ... + n,
then times five more all-reduces; rank 0 prints one line, `GPU_RANKS {json}`: the backend, ranks,
GPUs, the tensor's device, whether the sum was right, the median time and the bus bandwidth
(lab/bandwidth.py's busbw, nccl-tests' factor), or the error that stopped it.
"""

import datetime
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist

from lab.bandwidth import busbw

ELEMENTS = 16 << 20   # 64 MB of float32
REPEATS = 5


def all_reduce_on_gpus(backend: str, rank: int, world_size: int, device: torch.device) -> dict:
    """One checked all-reduce on `device`, then the median of REPEATS timed ones."""
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=30),
                            device_id=device if backend == "nccl" else None)
    x = torch.full((ELEMENTS,), float(rank + 1), device=device)
    dist.all_reduce(x)
    torch.cuda.synchronize(device)
    right = bool((x == world_size * (world_size + 1) / 2).all().item())
    times = []
    for _ in range(REPEATS):
        dist.barrier()
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        dist.all_reduce(x)
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    seconds = sorted(times)[REPEATS // 2]
    size = x.numel() * x.element_size()
    dist.destroy_process_group()
    return {"ok": right, "tensor_device": str(x.device), "size_mb": size / 1e6, "time_ms": seconds * 1e3,
            "busbw_gbps": busbw("all_reduce", size, seconds, world_size) / 1e9}


def main(backend: str) -> int:
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gpus = torch.cuda.device_count()
    out = {"backend": backend, "ranks": world_size, "gpus": gpus}
    try:
        if not gpus:
            raise RuntimeError("no GPU is visible to the ranks (torch.cuda.device_count() is 0)")
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % gpus)
        torch.cuda.set_device(device)
        out.update(all_reduce_on_gpus(backend, rank, world_size, device))
    except Exception as e:  # noqa: BLE001 - the figure is the refusal itself: say it, in one line
        words = str(e).strip().splitlines()
        out.update(ok=False, error=f"{type(e).__name__}: {words[0][:300] if words else ''}")
    if rank == 0:
        print("GPU_RANKS " + json.dumps(out), flush=True)
    return 0 if out.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
