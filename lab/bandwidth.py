"""How fast the collectives move data: all-reduce, all-gather, reduce-scatter and broadcast, reported
as nccl-tests reports them (algorithm and bus bandwidth), as a table, a CSV and a plot.

    torchrun --standalone --nproc-per-node 4 lab/bandwidth.py                 # 1 KiB .. 1 MiB (gloo), .. 256 MiB (NCCL)
    torchrun --standalone --nproc-per-node 4 lab/bandwidth.py --max-size 1G   # up to 1 GiB
    python lab/bandwidth.py                                                   # one rank (bus bandwidth is 0)

The math, for n ranks and one collective about S bytes that takes t seconds:

    S       all-reduce, broadcast: the tensor; all-gather: the gathered output (n chunks);
            reduce-scatter: the input (n chunks). S is always the full size, as in nccl-tests.
    t       the median over ITERS timed runs (after WARMUP untimed ones) of the slowest rank's
            time: a collective is over only when its last rank is done.
    algbw = S / t
    busbw = algbw * 2(n-1)/n   all-reduce (a ring sends and receives 2(n-1)/n * S per rank)
            algbw * (n-1)/n    all-gather, reduce-scatter ((n-1)/n * S per rank)
            algbw * 1          broadcast
    Bus bandwidth is the per-rank traffic over t: comparable with a link's speed at any n.

GB/s means 1e9 bytes per second (as nccl-tests); sizes take binary suffixes, 1K = 1024 bytes.
The lecture's benchmark divided "bytes sent" by n*t, a time nothing takes. For all-reduce the
spurious n happens to turn 2(n-1)*S/(n*t) into busbw (reported in GiB/s and rounded); for
reduce-scatter it counted only the output, S/n, and reported busbw / n. It also timed one run.
"""

import argparse
import csv
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

_KIT = str(Path(__file__).resolve().parents[1])
if _KIT not in sys.path:        # run as a script only lab/ is on the path; `lab` lives one above
    sys.path.insert(0, _KIT)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from lab.common import all_gather, log, reduce_scatter  # noqa: E402
from utils import get_device, init_distributed, leave  # noqa: E402

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
MIN_SIZE = "1K"            # the smallest S
MAX_SIZE_CPU = "1M"        # the largest S by default under gloo: loopback TCP on shared CPUs
MAX_SIZE_GPU = "256M"      # ... and under NCCL (the lecture measured 400 MB)
WARMUP = 3                 # untimed runs per size: connections, buffers, NCCL's kernels
ITERS = 10                 # timed runs per size; the median is reported
ELEMENT = torch.float32    # the numbers moved
ELEMENT_BYTES = torch.finfo(ELEMENT).bits // 8
OUT = "build/lab"          # where the CSV and the plot go


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' factor from algorithm to bus bandwidth for n = world_size ranks."""
    n = world_size
    factors = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
               "broadcast": 1.0}
    if op not in factors:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    return factors[op]


def algbw(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth S / t, in bytes per second."""
    return size_bytes / seconds


def busbw(op: str, size_bytes: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth: S / t times nccl-tests' factor for `op` at `world_size` ranks, in bytes per second."""
    return algbw(size_bytes, seconds) * bus_factor(op, world_size)


def parse_size(text: str) -> int:
    """'4096' -> 4096, '1K' -> 1024, '64M'/'64MB'/'64MiB' -> 64 * 1024**2, '1G' -> 1024**3."""
    t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(t[-1:], 1)
    try:
        value = float(t[:-1] if scale > 1 else t) * scale
    except ValueError:
        raise ValueError(f"not a size: {text!r} (examples: 4096, 64K, 256M, 1G)") from None
    if value < 1:
        raise ValueError(f"not a size: {text!r} (must be at least 1 byte)")
    return int(value)


def human(size_bytes: int) -> str:
    """1024 -> '1K', 3 * 2**20 -> '3M', 996 -> '996', 1536 -> '1.5K'."""
    for suffix, scale in (("G", 1024 ** 3), ("M", 1024 ** 2), ("K", 1024)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:.3g}{suffix}"
    return str(size_bytes)


def sizes_between(low: int, high: int) -> list:
    """low, 2*low, 4*low, ... up to high, and high itself when it is not such a power."""
    if high < low:
        raise ValueError(f"the largest size ({high} bytes) is below the smallest ({low} bytes)")
    out = [low]
    while out[-1] * 2 <= high:
        out.append(out[-1] * 2)
    return out if out[-1] == high else out + [high]


def fit_size(size_bytes: int, world_size: int, element_size: int = 4) -> int:
    """The size at or below `size_bytes` that splits into world_size chunks of whole elements
    (all-gather and reduce-scatter need it); at least one element per rank."""
    unit = world_size * element_size
    return max(unit, size_bytes // unit * unit)


@dataclass
class Row:
    """One collective at one size: the median time and both bandwidths."""
    op: str
    size_bytes: int       # S, the full size (see the module's docstring)
    world_size: int
    time_us: float        # median over iterations of the slowest rank, microseconds
    algbw_gbps: float     # S / t, GB/s (1e9 bytes per second)
    busbw_gbps: float     # algbw times nccl-tests' factor
    impl: str = "native"  # "fallback" where common.reduce_scatter had to stand in

    def to_dict(self) -> dict:
        return asdict(self)


def row_from_times(op: str, size_bytes: int, world_size: int, slowest_times: list, impl="native") -> Row:
    """The row for `op` at `size_bytes` from the slowest rank's time of each iteration (seconds)."""
    t = statistics.median(slowest_times)
    return Row(op, size_bytes, world_size, t * 1e6, algbw(size_bytes, t) / 1e9,
               busbw(op, size_bytes, t, world_size) / 1e9, impl)


def collective(op: str, size_bytes: int, world_size: int, device):
    """(a function running `op` once on buffers of S = size_bytes, which implementation it uses)."""
    numel = size_bytes // ELEMENT_BYTES
    # Zeros: sums stay zero (no overflow or slow denormals over many runs); the speed is the same.
    full = torch.zeros(numel, dtype=ELEMENT, device=device)
    part = torch.zeros(numel // world_size, dtype=ELEMENT, device=device)
    impl = ["native"]     # which reduce-scatter ran is known only once it has: run() fills it in
    if op == "all_reduce":
        return (lambda: dist.all_reduce(full)), impl
    if op == "all_gather":
        return (lambda: all_gather(full, part)), impl
    if op == "reduce_scatter":
        def run():
            impl[0] = reduce_scatter(part, full)
        return run, impl
    if op == "broadcast":
        return (lambda: dist.broadcast(full, src=0)), impl
    raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")


def time_collective(fn, warmup: int, iters: int, device) -> list:
    """This rank's time of each of `iters` runs of fn (seconds), every run started together."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        dist.barrier()    # start together, so one rank's wait for a late one is not counted
        sync()
        start = time.perf_counter()
        fn()
        sync()            # NCCL returns once the work is queued on the GPU; wait for it to finish
        times.append(time.perf_counter() - start)
    return times


def run_bandwidth(rank: int, world_size: int, sizes: list, ops=OPS, warmup=WARMUP, iters=ITERS, device=None) -> list:
    """Measure every op at every size; every rank returns the same rows (times agreed by all-reduce)."""
    device = get_device() if device is None else device
    rows = []
    for op in ops:
        for size in sizes:
            size = fit_size(size, world_size, ELEMENT_BYTES)
            fn, impl = collective(op, size, world_size, device)
            times = torch.tensor(time_collective(fn, warmup, iters, device), dtype=torch.float64, device=device)
            dist.all_reduce(times, op=dist.ReduceOp.MAX)     # each run lasts as long as its slowest rank
            rows.append(row_from_times(op, size, world_size, times.tolist(), impl[0]))
    return rows


def format_table(rows: list) -> str:
    """The rows as an nccl-tests-like table, one block per collective."""
    head = f"{'collective':<15}{'size (B)':>12}{'':>7}{'time (us)':>12}{'algbw (GB/s)':>14}{'busbw (GB/s)':>14}  note"
    lines = [head, "-" * len(head)]
    for i, r in enumerate(rows):
        if i and r.op != rows[i - 1].op:
            lines.append("")
        note = "FALLBACK: all-reduce + own chunk" if r.impl == "fallback" else ""
        lines.append(f"{r.op:<15}{r.size_bytes:>12}{human(r.size_bytes):>7}{r.time_us:>12.1f}{r.algbw_gbps:>14.3f}{r.busbw_gbps:>14.3f}  {note}".rstrip())
    return "\n".join(lines)


def write_csv(rows: list, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(Row.__dataclass_fields__))
        writer.writeheader()
        writer.writerows(r.to_dict() for r in rows)


def plot(rows: list, path: Path) -> str:
    """Bus bandwidth against size, one line per collective, into `path` (PNG, drawn by the kit's
    plotting module, grader/plots.py); returns what it did."""
    try:
        from grader import plots
        import matplotlib  # noqa: F401  (drawn only when it is installed)
    except ImportError:
        return "no plot: matplotlib is not installed (pip install matplotlib); the CSV has the numbers"
    series = {op: ([r.size_bytes for r in rows if r.op == op], [r.busbw_gbps for r in rows if r.op == op])
              for op in dict.fromkeys(r.op for r in rows)}
    n = rows[0].world_size if rows else 0
    image = plots.lines(series, "size S (bytes)", "bus bandwidth (GB/s)", log2_x=True,
                        x_format=lambda x: human(int(x)),
                        title=f"bus bandwidth, {n} rank(s), {dist.get_backend() if dist.is_initialized() else ''}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(image)
    return f"plot: {path}"


def parse_args(argv=None, backend="gloo"):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_max = os.environ.get("A4_LAB_MAX_SIZE") or (MAX_SIZE_GPU if backend == "nccl" else MAX_SIZE_CPU)
    ap.add_argument("--min-size", default=MIN_SIZE, help=f"smallest S (default {MIN_SIZE})")
    ap.add_argument("--max-size", default=default_max,
                    help=f"largest S (default: $A4_LAB_MAX_SIZE, else {MAX_SIZE_CPU} on gloo, {MAX_SIZE_GPU} on NCCL)")
    ap.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS, help="collectives to measure")
    ap.add_argument("--warmup", type=int, default=WARMUP, help=f"untimed runs per size (default {WARMUP})")
    ap.add_argument("--iters", type=int, default=ITERS, help=f"timed runs per size (default {ITERS})")
    ap.add_argument("--out", default=os.environ.get("A4_LAB_OUT") or OUT,
                    help=f"folder for the CSV and the plot (default: $A4_LAB_OUT, else {OUT})")
    return ap.parse_args(argv)


def show(rank: int, world_size: int, argv=None) -> bool:
    """Measure, and on rank 0 log the table and write the CSV and the plot; returns True."""
    backend = dist.get_backend()
    args = parse_args(argv, backend)
    sizes = sizes_between(parse_size(args.min_size), parse_size(args.max_size))
    rows = run_bandwidth(rank, world_size, sizes, args.ops, args.warmup, args.iters)
    if rank == 0:
        stem = Path(args.out) / f"bandwidth-{backend}-{world_size}ranks"
        write_csv(rows, stem.with_suffix(".csv"))
        log(f"[lab:bandwidth] {world_size} rank(s), {backend}, median of {args.iters} runs after {args.warmup} warm-up")
        for line in format_table(rows).splitlines():
            log(f"[lab:bandwidth] {line}")
        if world_size == 1:
            log("[lab:bandwidth] one rank: nothing crosses a link, so bus bandwidth is 0 by definition")
        if any(r.impl == "fallback" for r in rows):
            log(f"[lab:bandwidth] reduce_scatter: {backend} has none here; the FALLBACK all-reduces and "
                "keeps one chunk, so its times are an all-reduce's")
        if backend == "gloo":
            log("[lab:bandwidth] gloo: on one machine this measures memory copies and the TCP stack, not "
                "a network; gloo builds reduce_scatter from all-reduce, so its busbw understates the link")
        log(f"[lab:bandwidth] csv: {stem.with_suffix('.csv')}")
        log(f"[lab:bandwidth] {plot(rows, stem.with_suffix('.png'))}")
    return True


def main():
    rank, _, world_size = init_distributed()
    ok = show(rank, world_size, sys.argv[1:])
    dist.destroy_process_group()
    leave(0 if ok else 1)


if __name__ == "__main__":
    main()
