"""Tensor parallelism on the lecture's MLP, forward and backward: each rank holds a slice of every
layer's columns; checked against the single-process MLP (lab/mlp.py).

    torchrun --standalone --nproc-per-node 4 lab/tensor_parallel.py
    python lab/tensor_parallel.py                                    # one rank: the plain MLP

Each layer is column-parallel: W_i = [W_i^0 ... W_i^{n-1}] split along its columns, rank r holds
W_i^r of shape [d, d/n]. With the whole activation x [B, d] on every rank, one layer is

    x  -> f (copy to the parallel region)      x                     forward: identity
                                                                     backward: all-reduce
       -> y_r = gelu(x @ W_i^r)                [B, d/n]              this rank's columns
       -> gather from the parallel region      [y_0 ... y_{n-1}]     forward: all-gather (last dim)
                                               [B, d]                backward: split (keep own columns)

Backward, why both: x feeds every rank's y_r, so dL/dx = sum_r dL/dy_r @ (W_i^r)^T, a sum over
ranks; each rank computes one term, f's all-reduce adds them. Every rank then holds the same full
dL/dx, and the gather's backward hands each y_r its own columns of it. The names and meanings are
Megatron-LM's (mpu/mappings.py; f is the paper's f). The lecture's forward only all-gathered
("backward pass: homework"); without f, every layer but the last gets wrong weight gradients.

Beside it, Megatron's layout (the paper's MLP block): layers go in pairs, the first split by
columns and the second by rows (W^r of shape [d/n, d], rows r*d/n .. (r+1)*d/n-1):

    x  -> f                                    x                     backward: all-reduce
       -> h_r = gelu(x @ W_a^r)                [B, d/n]              no gather: the next layer
       -> z_r = h_r @ W_b^r                    [B, d]                takes exactly these columns
       -> g (reduce from the parallel region)  z = sum_r z_r         forward: all-reduce
       -> gelu(z)                              [B, d]                backward: identity

Per pair of layers that is one all-reduce of [B, d] forward and one backward, against two
all-gathers forward and two all-reduces backward in the column-only layout (the first layer's f
never runs backward in either: the batch needs no gradient). Both layouts count
what they hand to the collectives (`Traffic`) and print the bytes each rank sends per step, as a
ring sends them: (n-1) pieces for an all-gather, 2(n-1)/n of the tensor for an all-reduce.
"""

import sys
from pathlib import Path

_KIT = str(Path(__file__).resolve().parents[1])
if _KIT not in sys.path:        # run as a script only lab/ is on the path; `lab` lives one above
    sys.path.insert(0, _KIT)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from dataclasses import dataclass, field  # noqa: E402

from lab.common import log, world, run_as_script  # noqa: E402
from lab.mlp import MLPConfig, Result, init_weights, loss_of, make_data, reference, report  # noqa: E402
from utils import divide, get_device  # noqa: E402


# --- what one step hands to the collectives -----------------------------------------------------

@dataclass
class Traffic:
    """The collectives this rank called, as (op, bytes of the tensor it handed in)."""
    calls: list = field(default_factory=list)

    def sent(self, n: int) -> int:
        """Bytes this rank sends over a ring of n ranks: an all-gather passes on the n-1 other
        pieces, an all-reduce (reduce-scatter, then all-gather) 2(n-1)/n of its tensor."""
        per_call = {"all_gather": lambda b: (n - 1) * b, "all_reduce": lambda b: 2 * (n - 1) * b // n}
        return sum(per_call[op](size) for op, size in self.calls)

    def line(self, n: int) -> str:
        counts = {op: sum(1 for o, _ in self.calls if o == op) for op in ("all_gather", "all_reduce")}
        return (f"{counts['all_gather']} all-gathers, {counts['all_reduce']} all-reduces per step: "
                f"{self.sent(n):,} bytes sent per rank")


TRAFFIC = Traffic()   # the step being run records into it (run_* start it afresh)


# --- the communication primitives: each is the identity on a one-rank world ---------------------

def _reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of x over all ranks, in a new tensor (x itself is left alone: autograd may reuse it)."""
    if world()[1] == 1:
        return x
    total = x.contiguous().clone()
    TRAFFIC.calls.append(("all_reduce", total.numel() * total.element_size()))
    dist.all_reduce(total)
    return total


def _gather_along_last_dim(x: torch.Tensor) -> torch.Tensor:
    """[..., k] on each rank -> [..., n*k], rank 0's columns first."""
    _, n = world()
    if n == 1:
        return x
    TRAFFIC.calls.append(("all_gather", x.numel() * x.element_size()))
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def _split_along_last_dim(x: torch.Tensor) -> torch.Tensor:
    """[..., n*k] -> this rank's [..., k]: columns r*k .. (r+1)*k-1."""
    rank, n = world()
    if n == 1:
        return x
    k = divide(x.shape[-1], n, "the last dimension", "world_size")
    return x[..., rank * k:(rank + 1) * k].contiguous()


# --- the regions: autograd Functions named after where the tensor goes --------------------------

class CopyToParallelRegion(torch.autograd.Function):
    """Megatron's f. forward: identity; backward: all-reduce."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return _reduce(grad)


class GatherFromParallelRegion(torch.autograd.Function):
    """forward: all-gather along the last dimension; backward: split along it."""

    @staticmethod
    def forward(ctx, x):
        return _gather_along_last_dim(x)

    @staticmethod
    def backward(ctx, grad):
        return _split_along_last_dim(grad)


class ReduceFromParallelRegion(torch.autograd.Function):
    """Megatron's g. forward: all-reduce (the ranks' partial sums added up); backward: identity."""

    @staticmethod
    def forward(ctx, x):
        return _reduce(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def column_parallel_layer(x: torch.Tensor, w_shard: torch.Tensor) -> torch.Tensor:
    """gelu(x @ W) with W split by columns: x [B, d] on every rank, w_shard [d, d/n] -> [B, d]."""
    x = CopyToParallelRegion.apply(x)            # backward: add up every rank's share of dL/dx
    y = F.gelu(x @ w_shard)                      # [B, d/n]; gelu is elementwise, so per shard is exact
    return GatherFromParallelRegion.apply(y)     # [B, d]: the next layer needs every column


def run_tensor_parallel(rank: int, world_size: int, cfg: MLPConfig = MLPConfig(), device=None) -> Result:
    """One forward and backward pass with this rank's column shards; returns the loss (the same on
    every rank) and the gradients of the shards W_i^r, each [d, d/n]."""
    device = get_device() if device is None else device
    k = divide(cfg.dim, world_size, "dim", "world_size")
    TRAFFIC.calls.clear()
    # Draw the full weights from the one seed, keep this rank's columns.
    shards = [w[:, rank * k:(rank + 1) * k].clone().requires_grad_() for w in init_weights(cfg, device)]
    x = make_data(cfg, device)                   # every rank has the whole batch
    for w in shards:
        x = column_parallel_layer(x, w)
    loss = loss_of(x)                            # every rank holds all of x_L, so the same loss
    loss.backward()
    return Result(loss.item(), [w.grad for w in shards])


def megatron_pair(x: torch.Tensor, w_columns: torch.Tensor, w_rows: torch.Tensor) -> torch.Tensor:
    """gelu(gelu(x @ W_a) @ W_b), W_a split by columns ([d, d/n] here), W_b by rows ([d/n, d])."""
    x = CopyToParallelRegion.apply(x)                         # backward: sum the shares of dL/dx
    h = F.gelu(x @ w_columns)                                 # [B, d/n]: kept split
    z = ReduceFromParallelRegion.apply(h @ w_rows)            # [B, d]: the partial sums added up
    return F.gelu(z)


def megatron_shards(weights: list, rank: int, k: int) -> list:
    """This rank's piece of each layer: columns of the first of each pair, rows of the second; an
    odd last layer stays column-parallel, as in the other layout."""
    paired = len(weights) - len(weights) % 2
    return [w[rank * k:(rank + 1) * k, :] if i % 2 and i < paired else w[:, rank * k:(rank + 1) * k]
            for i, w in enumerate(weights)]


def run_megatron(rank: int, world_size: int, cfg: MLPConfig = MLPConfig(), device=None) -> Result:
    """One forward and backward pass in Megatron's layout; the loss and this rank's shards' gradients."""
    device = get_device() if device is None else device
    k = divide(cfg.dim, world_size, "dim", "world_size")
    TRAFFIC.calls.clear()
    shards = [w.clone().requires_grad_() for w in megatron_shards(init_weights(cfg, device), rank, k)]
    x = make_data(cfg, device)
    paired = len(shards) - len(shards) % 2
    for i in range(0, paired, 2):
        x = megatron_pair(x, shards[i], shards[i + 1])
    if paired < len(shards):
        x = column_parallel_layer(x, shards[-1])
    loss = loss_of(x)
    loss.backward()
    return Result(loss.item(), [w.grad for w in shards])


def expected_grads(ref: Result, rank: int, world_size: int) -> list:
    """The columns of the single-process gradients that rank `rank` holds."""
    k = ref.grads[0].shape[1] // world_size
    return [g[:, rank * k:(rank + 1) * k] for g in ref.grads]


def show(rank: int, world_size: int, cfg: MLPConfig = MLPConfig()) -> bool:
    ref = reference(cfg)
    k = cfg.dim // world_size
    got = run_tensor_parallel(rank, world_size, cfg)
    columns = TRAFFIC.line(world_size)
    got.notes.append(f"holds columns {rank * k}..{(rank + 1) * k - 1} of each of the {cfg.num_layers} layers")
    ok = report("tensor_parallel", rank, got, ref.loss, expected_grads(ref, rank, world_size))
    megatron = run_megatron(rank, world_size, cfg)
    megatron.notes.append(f"Megatron's layout: holds columns, then rows, {rank * k}..{(rank + 1) * k - 1} of each "
                          f"pair of layers")
    ok = report("tensor_parallel:megatron", rank, megatron, ref.loss,
                megatron_shards(ref.grads, rank, k)) and ok
    if rank == 0:
        log(f"[lab:tensor_parallel] communication, B={cfg.batch_size} d={cfg.dim} L={cfg.num_layers} "
            f"n={world_size}:")
        log(f"[lab:tensor_parallel]   all-gather layout: {columns}")
        log(f"[lab:tensor_parallel]   Megatron's layout: {TRAFFIC.line(world_size)}")
    return ok


def main():
    run_as_script(show)


if __name__ == "__main__":
    main()
