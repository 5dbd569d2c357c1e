"""Pipeline parallelism on the lecture's MLP, forward and backward: each rank holds consecutive layers
(a stage); micro-batches go forward with send/recv and their gradients come back the same way;
checked against the single-process MLP (lab/mlp.py).

    torchrun --standalone --nproc-per-node 2 lab/pipeline_parallel.py    # the lecture's 2 stages
    torchrun --standalone --nproc-per-node 4 lab/pipeline_parallel.py
    python lab/pipeline_parallel.py                                      # one stage: gradient accumulation

With n stages and L layers (`show` rounds L up to a multiple of n), rank r holds the s = L/n
layers W_{r*s} .. W_{(r+1)*s-1}. The batch X [B, d] goes through in m micro-batches X^j [B/m, d]
(GPipe's schedule: every forward, then every backward; no overlap, so the bubble stays):

    forward j:   h = X^j on rank 0, h = recv from rank r-1 elsewhere         [B/m, d]
                 out = this stage's layers applied to h                       [B/m, d]
                 rank r < n-1: send out to rank r+1;  last rank: loss_j = mean(out^2) / m
    backward j:  last rank: loss_j.backward();  others: g = recv from rank r+1, out.backward(g)
                 rank r > 0: send dL/dh (h.grad) to rank r-1                  [B/m, d]

The micro-batches are of equal size, so L = loss_0 + ... + loss_{m-1} is the whole batch's mean;
backward() adds each micro-batch's gradient into W.grad, so their sum is dL/dW: that is why each
loss_j is divided by m.
"""

import sys
from dataclasses import replace
from pathlib import Path

_KIT = str(Path(__file__).resolve().parents[1])
if _KIT not in sys.path:        # run as a script only lab/ is on the path; `lab` lives one above
    sys.path.insert(0, _KIT)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from lab.common import run_as_script  # noqa: E402
from lab.mlp import MLPConfig, Result, forward, init_weights, loss_of, make_data, reference, report  # noqa: E402
from utils import divide, get_device  # noqa: E402


def pipeline_config(cfg: MLPConfig, world_size: int) -> MLPConfig:
    """cfg with its layers rounded up to a whole number per stage (4 layers on 8 ranks become 8)."""
    per_stage = -(-cfg.num_layers // world_size)
    return replace(cfg, num_layers=per_stage * world_size)


def run_pipeline_parallel(rank: int, world_size: int, cfg: MLPConfig = MLPConfig(), device=None) -> Result:
    """One forward and backward pass of every micro-batch through this rank's stage; returns the
    whole batch's loss (sent from the last stage to all) and the gradients of this stage's layers."""
    device = get_device() if device is None else device
    n, m = world_size, cfg.num_micro_batches
    s = divide(cfg.num_layers, n, "num_layers", "world_size")
    mb = divide(cfg.batch_size, m, "batch_size", "num_micro_batches")
    first, last = rank == 0, rank == n - 1
    # Draw the whole model from the one seed, keep this stage's layers.
    layers = [w.requires_grad_() for w in init_weights(cfg, device)[rank * s:(rank + 1) * s]]
    micro_batches = make_data(cfg, device).chunk(m) if first else None

    # Forward: keep each micro-batch's input and output; backward needs both.
    saved = []
    loss = torch.zeros((), device=device)
    for j in range(m):
        if first:
            h = micro_batches[j]
        else:
            h = torch.empty(mb, cfg.dim, device=device)
            dist.recv(h, src=rank - 1)
            h.requires_grad_()           # so that backward leaves dL/dh in h.grad, for rank r-1
        out = forward(h, layers)
        if last:
            out = loss_of(out) / m       # loss_j; divided by m because backward() adds gradients
            loss += out.detach()
        else:
            dist.send(out.detach().contiguous(), dst=rank + 1)
        saved.append((h, out))

    # Backward, micro-batch by micro-batch; each adds its share into the layers' .grad.
    for h, out in saved:
        if last:
            out.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, src=rank + 1)
            out.backward(grad)
        if not first:
            dist.send(h.grad.contiguous(), dst=rank - 1)

    dist.broadcast(loss, src=n - 1)      # only the last stage computed it
    return Result(loss.item(), [w.grad for w in layers])


def expected_grads(ref: Result, rank: int, world_size: int) -> list:
    """The single-process gradients of the layers stage `rank` holds."""
    s = len(ref.grads) // world_size
    return ref.grads[rank * s:(rank + 1) * s]


def show(rank: int, world_size: int, cfg: MLPConfig = MLPConfig()) -> bool:
    cfg = pipeline_config(cfg, world_size)
    got = run_pipeline_parallel(rank, world_size, cfg)
    s = cfg.num_layers // world_size
    mine = f"layer {rank * s}" if s == 1 else f"layers {rank * s}..{(rank + 1) * s - 1}"
    got.notes.append(f"stage {rank} of {world_size}: {mine} of {cfg.num_layers}, "
                     f"{cfg.num_micro_batches} micro-batches of {cfg.batch_size // cfg.num_micro_batches}")
    ref = reference(cfg)
    return report("pipeline_parallel", rank, got, ref.loss, expected_grads(ref, rank, world_size))


def main():
    run_as_script(show)


if __name__ == "__main__":
    main()
