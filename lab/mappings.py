"""The regions of tensor and sequence parallelism, as Megatron-LM's `mpu/mappings.py` has them, in a
group of ranks: the transformer's building blocks (lab/gpt_parallel.py, lab/vocab_parallel.py).

    python -c "import lab.mappings"        # lab/mappings.py is a library: lab/transformer.py runs it

Four private primitives, each the identity in a group of one rank (n ranks, this one r):

    _reduce(x)                          sum over the ranks                         all-reduce
    _gather_along_first_dim(x)          [k, ...] -> [n*k, ...], rank 0's rows first  all-gather
    _split_along_first_dim(x)           [n*k, ...] -> rows r*k .. (r+1)*k-1         (no communication)
    _reduce_scatter_along_first_dim(x)  [n*k, ...] -> rows r*k .. of the sum          reduce-scatter

and the regions built from them, each an autograd Function whose backward is its forward's conjugate
(the paper's f and g; with sequence parallelism, arXiv 2205.05198, g-bar and its transpose):

    CopyToTensorParallelRegion              f: forward identity, backward all-reduce
    ReduceFromTensorParallelRegion          g: forward all-reduce, backward identity
    GatherFromSequenceParallelRegion        forward all-gather (sequence), backward reduce-scatter
    ReduceScatterToSequenceParallelRegion   forward reduce-scatter (sequence), backward all-gather

The tensors are [s, b, h], sequence first, so "along the sequence" is along the first dimension.
Every primitive works in the group `tensor_parallel_group` set (the default group otherwise), so one
world of 4 ranks can hold groups of 1, 2 and 4, and records the collective it called in CALLS.
"""

from contextlib import contextmanager

import torch
import torch.distributed as dist

from lab.common import all_gather, reduce_scatter

_GROUP = None   # the process group of the tensor-parallel ranks; None: the default group
CALLS = []      # (collective, shape of the tensor handed in), in the order called: tests read it


@contextmanager
def tensor_parallel_group(group):
    """Within the block, the regions communicate in `group` (a ProcessGroup; None: the default one)."""
    global _GROUP
    before, _GROUP = _GROUP, group
    try:
        yield
    finally:
        _GROUP = before


def group():
    return _GROUP


def tp_rank() -> int:
    return dist.get_rank(_GROUP) if dist.is_available() and dist.is_initialized() else 0


def tp_size() -> int:
    return dist.get_world_size(_GROUP) if dist.is_available() and dist.is_initialized() else 1


# --- the primitives ---------------------------------------------------------------------------------

def _reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of x over the group's ranks, in a new tensor (autograd may still need x itself)."""
    if tp_size() == 1:
        return x
    total = x.contiguous().clone()
    CALLS.append(("all_reduce", tuple(total.shape)))
    dist.all_reduce(total, group=_GROUP)
    return total


def _gather_along_first_dim(x: torch.Tensor) -> torch.Tensor:
    """[k, ...] on each rank -> [n*k, ...]: every rank's rows, rank 0's first."""
    n = tp_size()
    if n == 1:
        return x
    out = torch.empty((n * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    CALLS.append(("all_gather", tuple(x.shape)))
    all_gather(out, x, group=_GROUP)
    return out


def _split_along_first_dim(x: torch.Tensor) -> torch.Tensor:
    """[n*k, ...] -> this rank's rows [k, ...] (the caller checked that n divides the first dimension)."""
    n = tp_size()
    if n == 1:
        return x
    k = x.shape[0] // n
    return x[tp_rank() * k:(tp_rank() + 1) * k].contiguous()


def _reduce_scatter_along_first_dim(x: torch.Tensor) -> torch.Tensor:
    """[n*k, ...] on each rank -> rows r*k .. (r+1)*k-1 of the sum over ranks, [k, ...]."""
    n = tp_size()
    if n == 1:
        return x
    out = torch.empty((x.shape[0] // n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    CALLS.append(("reduce_scatter", tuple(x.shape)))
    reduce_scatter(out, x, group=_GROUP)
    return out


# --- the regions ------------------------------------------------------------------------------------

class CopyToTensorParallelRegion(torch.autograd.Function):
    """f. forward: identity, backward: all-reduce (every rank's share of dL/dx added up)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return _reduce(grad)


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    """g. forward: all-reduce (the ranks' partial sums added up), backward: identity."""

    @staticmethod
    def forward(ctx, x):
        return _reduce(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class GatherFromSequenceParallelRegion(torch.autograd.Function):
    """Sequence parallel's f. forward: all-gather along the sequence, backward: reduce-scatter along it
    (each rank's share of the gradient of every row added up, and the rank keeps its own rows)."""

    @staticmethod
    def forward(ctx, x):
        return _gather_along_first_dim(x)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_along_first_dim(grad)


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Sequence parallel's g. forward: reduce-scatter along the sequence, backward: all-gather along it."""

    @staticmethod
    def forward(ctx, x):
        return _reduce_scatter_along_first_dim(x)

    @staticmethod
    def backward(ctx, grad):
        return _gather_along_first_dim(grad)


def all_reduce_grads(params) -> None:
    """Sum the gradients of `params` over the group: those of weights every rank holds whole but
    applies to its own rows of the sequence only (LayerNorm's, the biases after g, the positions')."""
    for p in params:
        if p.grad is not None and tp_size() > 1:
            CALLS.append(("all_reduce", tuple(p.grad.shape)))
            dist.all_reduce(p.grad, group=_GROUP)
