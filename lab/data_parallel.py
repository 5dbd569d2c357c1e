"""Data parallelism on the lecture's MLP: each rank takes B/n rows of the batch and the whole model,
and the gradients are all-reduced; checked against the single-process MLP (lab/mlp.py).

    torchrun --standalone --nproc-per-node 4 lab/data_parallel.py
    python lab/data_parallel.py                                      # one rank: the plain MLP

Rank r holds rows X_r = X[r*b:(r+1)*b] (b = B/n) and every W_i. Its local loss is
L_r = mean over its b*d numbers, so the whole batch's loss is L = (L_0 + ... + L_{n-1}) / n and

    dL/dW_i = (dL_0/dW_i + ... + dL_{n-1}/dW_i) / n      = all-reduce(sum) of the local gradients / n

Afterwards every rank holds the same gradients, so identical optimizer steps keep the replicas
identical; the local losses differ, since they are computed on different rows.
"""

import sys
from pathlib import Path

_KIT = str(Path(__file__).resolve().parents[1])
if _KIT not in sys.path:        # run as a script only lab/ is on the path; `lab` lives one above
    sys.path.insert(0, _KIT)

import torch.distributed as dist  # noqa: E402

from lab.common import run_as_script  # noqa: E402
from lab.mlp import MLPConfig, Result, forward, init_weights, loss_of, make_data, reference, report  # noqa: E402
from utils import divide, get_device  # noqa: E402


def run_data_parallel(rank: int, world_size: int, cfg: MLPConfig = MLPConfig(), device=None) -> Result:
    """One forward and backward pass with this rank's rows; returns the whole batch's loss and the
    all-reduced gradients of every W_i (each [d, d])."""
    device = get_device() if device is None else device
    b = divide(cfg.batch_size, world_size, "batch_size", "world_size")
    # Every rank draws the whole batch and keeps its rows (a real loader would read only those).
    rows = make_data(cfg, device)[rank * b:(rank + 1) * b]
    weights = [w.requires_grad_() for w in init_weights(cfg, device)]

    local_loss = loss_of(forward(rows, weights))
    local_loss.backward()

    for w in weights:
        # SUM, then divide: ReduceOp.AVG (the lecture's) exists only in newer gloo builds.
        dist.all_reduce(w.grad)
        w.grad /= world_size
    loss = local_loss.detach().clone()
    dist.all_reduce(loss)                 # the whole batch's loss, for the comparison
    return Result((loss / world_size).item(), [w.grad for w in weights], local_loss=local_loss.item())


def show(rank: int, world_size: int, cfg: MLPConfig = MLPConfig()) -> bool:
    """Run it, log this rank's local loss and whether it matches the single-process MLP."""
    got = run_data_parallel(rank, world_size, cfg)
    got.notes.append(f"rows {rank * cfg.batch_size // world_size}..{(rank + 1) * cfg.batch_size // world_size - 1}"
                     f" of {cfg.batch_size}: local loss {got.local_loss:.6f} (differs by rank)")
    ref = reference(cfg)
    return report("data_parallel", rank, got, ref.loss, ref.grads)


def main():
    run_as_script(show)


if __name__ == "__main__":
    main()
