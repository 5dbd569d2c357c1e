"""What the lab's scripts share: the kit's utils on the path, reduce-scatter with a labelled
fallback, tensor printing, the tolerance of every "matches" check, and the one-line result format.

    python -c "import lab.common"        # a library; the scripts beside it import it

Every lab script reports each check as one line per rank,

    [lab:<part>][Rank <r>] ok: <True|False> | <details>

written by `result_line` and read back by `parse_results` (the tests and the Slurm test read logs
with it, so the format lives here only).
"""

import re
import sys
from pathlib import Path

import torch
import torch.distributed as dist

_UTILS = str(Path(__file__).resolve().parents[1] / "assignment_4")
if _UTILS not in sys.path:        # the kit's utils.py (init_distributed, log, leave, ...)
    sys.path.insert(0, _UTILS)

from utils import init_distributed, leave, log  # noqa: E402

# float32 sums taken in another order (a sharded matmul, gradients summed over ranks) differ from
# the single-process result by about 1e-6 relative; 1e-4 leaves room without hiding a real error.
RTOL = 1e-4
# Absolute slack as a fraction of the largest expected value: gradients of a mean over B*d numbers
# are tiny (1e-6 and less), and a fixed absolute tolerance of that size would pass anything.
ATOL_FRACTION = 1e-6

_RESULT = re.compile(r"^\[lab:(?P<part>[\w-]+)\]\[Rank (?P<rank>\d+)\] ok: (?P<ok>True|False)\b", re.M)

_NATIVE_REDUCE_SCATTER = {}   # backend name -> whether its reduce-scatter exists

# torch 2.13 renamed the lecture's all_gather_into_tensor and reduce_scatter_tensor to *_single
# (the old names still work, with a FutureWarning on every call); older torch, which a cluster's
# CUDA build may be, has only the old names.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def world() -> tuple:
    """(rank, world_size) of the default process group, (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_gather(output: torch.Tensor, input: torch.Tensor, group=None) -> None:
    """output = [input of rank 0, input of rank 1, ...] concatenated along dim 0, on every rank
    (of `group`; None: the default group).

    Shapes: input [k, ...], output [n*k, ...]. (dist.all_gather_into_tensor, by its current name.)
    """
    _ALL_GATHER(output, input.contiguous(), group=group)


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, force_fallback: bool = False, group=None) -> str:
    """output = sum over ranks s of chunk r of input_s, on rank r (of `group`; None: the default group).

    Shapes: input [n*k, ...] (n chunks along dim 0), output [k, ...]. Returns "native" when the
    backend's reduce-scatter (dist.reduce_scatter_tensor) did it, "fallback" otherwise.

    FALLBACK (gloo builds without a reduce-scatter, or `force_fallback`): all-reduce a copy of
    the whole input and keep this rank's chunk. Same result, but every rank receives the full sum,
    n times what a reduce-scatter delivers, so its timing is not a reduce-scatter's.
    """
    backend = dist.get_backend()
    if not force_fallback and _NATIVE_REDUCE_SCATTER.get(backend, True):
        try:
            _REDUCE_SCATTER(output, input.contiguous(), group=group)
            _NATIVE_REDUCE_SCATTER[backend] = True
            return "native"
        except (RuntimeError, NotImplementedError) as e:
            # An unsupported collective is refused by the backend before anything is sent, and
            # the same way on every rank, so every rank takes the fallback together.
            if "not support" not in str(e) and "not implemented" not in str(e).lower():
                raise
            _NATIVE_REDUCE_SCATTER[backend] = False
    full = input.contiguous().clone()   # all_reduce works in place; the caller's input stays
    dist.all_reduce(full, group=group)
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    output.copy_(full.chunk(world_size, dim=0)[rank])
    return "fallback"


def fmt(t) -> str:
    """A tensor as a short list: [0, 1, 2.5]; a list of tensors as a list of those; None as '-'."""
    if t is None:
        return "-"
    if isinstance(t, (list, tuple)):
        return "[" + ", ".join(fmt(x) for x in t) + "]"
    return "[" + ", ".join(f"{v:g}" for v in t.detach().flatten().tolist()) + "]"


def close(actual: torch.Tensor, expected: torch.Tensor) -> tuple:
    """(whether |actual - expected| <= RTOL*|expected| + ATOL_FRACTION*max|expected| everywhere,
    the largest absolute difference). Tensors of different shapes are not close."""
    a = actual.detach().to("cpu", torch.float64)
    b = expected.detach().to("cpu", torch.float64)
    if a.shape != b.shape:
        return False, float("inf")
    diff = (a - b).abs()
    atol = ATOL_FRACTION * b.abs().max().item() if b.numel() else 0.0
    ok = bool((diff <= RTOL * b.abs() + atol).all())
    return ok, diff.max().item() if diff.numel() else 0.0


def result_line(part: str, rank: int, ok: bool, details: str) -> str:
    """Log one check's outcome in the lab's result format and return the line."""
    line = f"[lab:{part}][Rank {rank}] ok: {bool(ok)} | {details}"
    log(line)
    return line


def parse_results(text: str) -> dict:
    """{(part, rank): ok} for every result line in a log (a later line for the same part and rank wins)."""
    return {(m["part"], int(m["rank"])): m["ok"] == "True" for m in _RESULT.finditer(text)}


def run_as_script(show) -> None:
    """A lab script's life: join the world (torchrun's, or a world of one rank), run
    `show(rank, world_size)`, and leave with status 0 when it said every check matched."""
    rank, _, world_size = init_distributed()
    ok = show(rank, world_size)
    dist.destroy_process_group()
    leave(0 if ok else 1)
