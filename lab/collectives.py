"""The lecture's collectives, one after another, on small tensors: what every rank holds before and after.

    torchrun --standalone --nproc-per-node 4 lab/collectives.py     # 4 ranks: gloo on CPUs, NCCL on GPUs
    python lab/collectives.py                                       # one rank: every collective is a copy

With n ranks, c numbers per chunk (CHUNK) and rank r in 0..n-1 (the lecture's notes number the
ranks 1..n in places; torch numbers them from 0), rank r starts from

    x_r = [100r, 100r+1, ..., 100r+c-1]         c numbers: "rank r's tensor t_r"
    a_r = [100r, 100r+1, ..., 100r+n*c-1]       n chunks of c: a_r[k] = a_r[k*c:(k+1)*c]

and each collective leaves (rank 0 is the root where there is one):

    broadcast       every rank: x_0
    scatter         rank r: a_0[r]                          (rank 0 splits its a_0)
    gather          rank 0: [x_0, x_1, ..., x_{n-1}]        (the others: nothing)
    reduce          rank 0: x_0 + x_1 + ... + x_{n-1}       (the others: nothing)
    all-gather      every rank: [x_0, x_1, ..., x_{n-1}]
    reduce-scatter  rank r: a_0[r] + a_1[r] + ... + a_{n-1}[r]
    all-reduce      every rank: a_0 + a_1 + ... + a_{n-1}
    all-reduce = reduce-scatter + all-gather: all-gather the reduce-scatter's chunks, get the all-reduce

Every rank logs one line per collective; barriers keep the collectives' lines apart.
"""

import sys
from dataclasses import dataclass
from pathlib import Path

_KIT = str(Path(__file__).resolve().parents[1])
if _KIT not in sys.path:        # run as a script only lab/ is on the path; `lab` lives one above
    sys.path.insert(0, _KIT)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from lab.common import all_gather, fmt, log, reduce_scatter, result_line, run_as_script  # noqa: E402
from utils import get_device  # noqa: E402

CHUNK = 2   # numbers per chunk: small enough to read every value in the output


@dataclass
class Step:
    """One collective as one rank saw it: its tensor before and after (None: it has none)."""
    name: str
    before: object
    after: object
    note: str = ""


# What each collective does, for the line rank 0 prints before it.
DESCRIPTIONS = {
    "broadcast": "rank 0 sends its tensor to every rank",
    "scatter": "rank 0 sends chunk r of its tensor to rank r",
    "gather": "rank 0 receives every rank's tensor, in rank order",
    "reduce": "rank 0 receives the sum of every rank's tensor",
    "all-gather": "every rank receives every rank's tensor, in rank order",
    "reduce-scatter": "rank r receives the sum over ranks of chunk r",
    "all-reduce": "every rank receives the sum of every rank's tensor",
    "reduce-scatter + all-gather": "all-gather of the reduce-scatter's chunks: the all-reduce again",
}


def rank_tensor(rank: int, numel: int, device) -> torch.Tensor:
    """[100r, 100r+1, ..., 100r+numel-1] in float32: whole numbers, so every sum is exact."""
    return torch.arange(numel, dtype=torch.float32, device=device) + 100 * rank


def run_collectives(rank: int, world_size: int, chunk: int = CHUNK, device=None, force_fallback=False) -> dict:
    """Run every collective of the lecture once; return {name: Step} as this rank saw them.

    Needs an initialised process group of `world_size` ranks. `force_fallback` makes
    reduce-scatter use common.reduce_scatter's fallback even where the backend has its own.
    """
    device = get_device() if device is None else device
    n, c = world_size, chunk
    steps = {}

    x = rank_tensor(rank, c, device)
    out = x.clone()
    dist.broadcast(out, src=0)
    steps["broadcast"] = Step("broadcast", x, out)

    a = rank_tensor(rank, n * c, device)
    out = torch.empty(c, device=device)
    # Only the source has something to scatter; the others pass None.
    dist.scatter(out, list(a.chunk(n)) if rank == 0 else None, src=0)
    steps["scatter"] = Step("scatter", a if rank == 0 else None, out)

    gathered = [torch.empty(c, device=device) for _ in range(n)] if rank == 0 else None
    dist.gather(x, gathered, dst=0)
    steps["gather"] = Step("gather", x, torch.cat(gathered) if rank == 0 else None)

    # reduce works in place, and what it leaves on the other ranks is unspecified: reduce a copy.
    out = x.clone()
    dist.reduce(out, dst=0)
    steps["reduce"] = Step("reduce", x, out if rank == 0 else None)

    out = torch.empty(n * c, device=device)
    all_gather(out, x)
    steps["all-gather"] = Step("all-gather", x, out)

    chunk_sum = torch.empty(c, device=device)
    how = reduce_scatter(chunk_sum, a, force_fallback=force_fallback)
    note = "" if how == "native" else "FALLBACK: all-reduce, then keep this rank's chunk"
    steps["reduce-scatter"] = Step("reduce-scatter", a, chunk_sum, note)

    total = a.clone()
    dist.all_reduce(total)
    steps["all-reduce"] = Step("all-reduce", a, total)

    # The ring all-reduce is exactly these two: each rank reduces one chunk, then shares it.
    composed = torch.empty(n * c, device=device)
    all_gather(composed, chunk_sum)
    same = torch.equal(composed, total)
    steps["reduce-scatter + all-gather"] = Step("reduce-scatter + all-gather", a, composed,
                                                f"equals the all-reduce: {same}")
    return steps


def expected_results(rank: int, world_size: int, chunk: int = CHUNK) -> dict:
    """{name: what `run_collectives` should leave on this rank} (None where the rank gets nothing)."""
    n, c = world_size, chunk
    xs = [rank_tensor(s, c, "cpu") for s in range(n)]
    a_s = [rank_tensor(s, n * c, "cpu") for s in range(n)]
    a_sum = torch.stack(a_s).sum(0)
    mine = slice(rank * c, (rank + 1) * c)
    root = rank == 0
    return {
        "broadcast": xs[0], "scatter": a_s[0][mine],
        "gather": torch.cat(xs) if root else None, "reduce": torch.stack(xs).sum(0) if root else None,
        "all-gather": torch.cat(xs), "reduce-scatter": a_sum[mine],
        "all-reduce": a_sum, "reduce-scatter + all-gather": a_sum,
    }


def matches(steps: dict, expected: dict) -> bool:
    """Whether every step left exactly the expected tensor (or nothing where nothing is expected)."""
    for name, want in expected.items():
        got = steps[name].after
        if (got is None) != (want is None):
            return False
        if got is not None and not torch.equal(got.detach().cpu(), want):
            return False
    return True


def show(rank: int, world_size: int, chunk: int = CHUNK) -> bool:
    """Run the collectives, log before/after per rank, and one result line; return whether all matched."""
    steps = run_collectives(rank, world_size, chunk)
    for name, step in steps.items():
        if rank == 0:
            log(f"[lab:collectives] --- {name}: {DESCRIPTIONS[name]}")
        dist.barrier()
        note = f"   ({step.note})" if step.note else ""
        log(f"[lab:collectives][Rank {rank}] {name:<27} before {fmt(step.before)} -> after {fmt(step.after)}{note}")
        dist.barrier()
    ok = matches(steps, expected_results(rank, world_size, chunk))
    result_line("collectives", rank, ok, f"{len(steps)} collectives on {world_size} rank(s) "
                f"{'left the expected tensors' if ok else 'left a wrong tensor: see the lines above'}")
    return ok


def main():
    run_as_script(show)


if __name__ == "__main__":
    main()
