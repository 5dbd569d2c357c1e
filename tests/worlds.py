"""Real multi-process gloo worlds for tests, and the single-process math they are checked against.

`run_world(world_size, target, *args)` starts `world_size` processes, joins them into one gloo
process group over a FileStore in a fresh temporary folder (no port to collide with), calls
`target(rank, world_size, *args)` in each and returns the per-rank results. Every process group
has a short timeout and the whole world a wall clock; a rank that raises, hangs or dies fails the
call with that rank's traceback.
"""

import datetime
import importlib.util
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import traceback
import uuid
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "assignment_4" / "reference" / "assignment4.py"
SKELETON = ROOT / "assignment_4" / "assignment4.py"
UTILS_DIR = ROOT / "assignment_4"

PG_TIMEOUT_S = 30


def load_module(path, name=None):
    """Import the file at `path` as a fresh module (utils.py of the kit importable)."""
    if str(UTILS_DIR) not in sys.path:
        sys.path.insert(0, str(UTILS_DIR))
    name = name or f"a4_{Path(path).stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rank_main(rank, world_size, store_path, target, args, results):
    import torch.distributed as dist
    try:
        torch.set_num_threads(1)
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
        try:
            value = target(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, value))
    except BaseException:  # noqa: BLE001 - a rank reports whatever ended it, to the parent
        results.put((rank, False, traceback.format_exc()))


def _context():
    """Ranks forked from a server process that imported torch once (its first world starts it),
    not spawned each with an import of its own: a rank starts in a fraction of a second instead of
    two. Nothing of the test process is inherited, as with spawn."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "tests.worlds"])
    return ctx


def run_world(world_size, target, *args, timeout=120):
    """Run `target(rank, world_size, *args)` on every rank of a new gloo world; return [result of rank r]."""
    ctx = _context()
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_rank_main, args=(r, world_size, store_path, target, args, results))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        collected = {}
        try:
            deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout)
            while len(collected) < world_size:
                left = (deadline - datetime.datetime.now()).total_seconds()
                if left <= 0:
                    raise TimeoutError(f"world of {world_size} did not finish in {timeout} s; "
                                       f"ranks that reported: {sorted(collected)}")
                try:
                    rank, ok, value = results.get(timeout=min(left, 1.0))
                    collected[rank] = (ok, value)
                except queue.Empty:
                    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in collected]
                    if dead:
                        raise RuntimeError(f"rank(s) {dead} died with exit codes "
                                           f"{[procs[r].exitcode for r in dead]}")
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join()
    failures = {r: v for r, (ok, v) in collected.items() if not ok}
    if failures:
        raise AssertionError("\n".join(f"--- rank {r} failed:\n{tb}" for r, tb in sorted(failures.items())))
    return [collected[r][1] for r in range(world_size)]


def closed_form_step(seed, batch_size, input_dim, output_dim, lr):
    """W1 = W0 - lr * 2/(B*O) * X^T (X W0 - Y), seeded as the handout seeds it, in float64.

    torch.manual_seed(seed) draws W0 [input_dim, output_dim]; torch.manual_seed(seed) again draws
    X [B, input_dim] and then Y [B, output_dim]. Written here from the math, not from utils.
    """
    torch.manual_seed(seed)
    w0 = torch.randn(input_dim, output_dim, dtype=torch.float32).double()
    torch.manual_seed(seed)
    x = torch.randn(batch_size, input_dim, dtype=torch.float32).double()
    y = torch.randn(batch_size, output_dim, dtype=torch.float32).double()
    return w0 - lr * 2.0 / (batch_size * output_dim) * x.T @ (x @ w0 - y)
