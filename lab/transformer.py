"""The seed project's transformer runs, on CPU ranks or GPUs: the tiny GPT trained for 5 SGD steps on
one process and in tensor parallel (lab/gpt_parallel.py), plain, with loss parallel and with sequence
parallel, at every number of ranks that divides the world; the losses side by side, each rank's
memory and the time of a step.

    torchrun --standalone --nproc-per-node 4 lab/transformer.py                 # 1, 2 and 4 ranks
    torchrun --standalone --nproc-per-node 4 lab/transformer.py --hidden 256 --ffn 1024 --seq-len 128
    python lab/transformer.py                                                   # one rank

A world of n ranks runs every group size k that divides n at once: n/k groups of k ranks (so at 4
ranks: 1, 2 and 4). Every run starts from the same full model (one seed, lab/gpt.py) and the same
batch, so its losses must equal the one-process run's: within TOLERANCE, checked on every rank, and
the script exits 1 where they do not.

Memory, per rank, after the first step's backward (rank 0's printed, with whether every rank's is
the same): the bytes of the parameters and gradients the rank holds, and of the activations
autograd saved for backward (every tensor passed to a saved_tensors_hooks pack hook, counted once
per storage, the parameters left out). Each beside its ratio to the same run on one rank. Time: the
median of REPEATS steps (forward, backward, SGD), the ranks of one group only running, after a
barrier; at 4 ranks on 2 CPU cores the ranks share cores.
"""

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

_KIT = str(Path(__file__).resolve().parents[1])
if _KIT not in sys.path:        # run as a script only lab/ is on the path; `lab` lives one above
    sys.path.insert(0, _KIT)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.autograd.graph import saved_tensors_hooks  # noqa: E402

from lab import gpt, gpt_parallel  # noqa: E402
from lab.common import init_distributed, leave, log, result_line  # noqa: E402
from lab.mappings import tensor_parallel_group  # noqa: E402
from utils import get_device  # noqa: E402

TOLERANCE = 1e-5      # |loss - one process's loss|, every step: float32 sums in another order differ by ~1e-7
REPEATS = 5           # timed steps per run


@dataclass
class Run:
    """One training run of a rank: its losses, its memory after the first backward (bytes), a step's time."""
    label: str
    losses: list
    params: int = 0
    grads: int = 0
    activations: int = 0
    step_s: float = 0.0


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def saved_bytes(fn, params: dict):
    """(fn(), bytes of the tensors autograd saved for backward while it ran, the parameters left out)."""
    skip = {p.untyped_storage().data_ptr() for p in params.values()}
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(saved.values())


def train(cfg: gpt.GPTConfig, mode: gpt_parallel.Mode, label: str, device) -> Run:
    """cfg.iters SGD steps of this rank's shards, in the tensor-parallel group set by the caller."""
    params = gpt_parallel.init_shards(cfg, mode, device)
    inputs, targets = gpt.make_batch(cfg, device)
    run = Run(label, [], params=_bytes(params.values()))
    for step in range(cfg.iters):
        loss, saved = saved_bytes(lambda: gpt_parallel.loss_of(params, inputs, targets, cfg, mode, step), params)
        gpt_parallel.backward(loss, params, mode)
        if step == 0:
            run.activations, run.grads = saved, _bytes(p.grad for p in params.values())
        gpt.sgd(params, cfg.lr)
        run.losses.append(loss.item())
    return run


def step_time(cfg: gpt.GPTConfig, mode: gpt_parallel.Mode, device) -> float:
    """The median time of REPEATS training steps in the caller's group."""
    params = gpt_parallel.init_shards(cfg, mode, device)
    inputs, targets = gpt.make_batch(cfg, device)
    times = []
    for step in range(REPEATS + 1):                # the first one warms up
        if device.type == "cuda":
            torch.cuda.synchronize()
        begin = time.perf_counter()
        gpt_parallel.backward(gpt_parallel.loss_of(params, inputs, targets, cfg, mode, step), params, mode)
        gpt.sgd(params, cfg.lr)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - begin)
    return statistics.median(times[1:])


def groups(rank: int, world_size: int) -> dict:
    """{k: this rank's group of k ranks} for every k dividing the world; every rank makes every group."""
    mine = {}
    for k in range(1, world_size + 1):
        if world_size % k:
            continue
        for first in range(0, world_size, k):
            ranks = list(range(first, first + k))
            group = None if k == world_size else dist.new_group(ranks)
            if rank in ranks:
                mine[k] = group
    return mine


def label(mode: gpt_parallel.Mode, k: int) -> str:
    return f"{mode.name}, {k} rank{'s' * (k > 1)}"


def run_all(cfg: gpt.GPTConfig, rank: int, world_size: int, device) -> tuple:
    """(the one-process losses, [Run of this rank], {label: why it was not run})."""
    reference = gpt.train(cfg, device)
    runs, skipped = [], {}
    for mode in gpt_parallel.MODES:
        for k, group in groups(rank, world_size).items():
            try:
                gpt_parallel.check_sizes(cfg, k, mode)
            except ValueError as e:
                skipped[label(mode, k)] = str(e)
                continue
            with tensor_parallel_group(group):
                run = train(cfg, mode, label(mode, k), device)
                dist.barrier()                   # one group at a time on the clock
                if rank < k:
                    run.step_s = step_time(cfg, mode, device)
            runs.append(run)
            dist.barrier()
    return reference, runs, skipped


def report(cfg: gpt.GPTConfig, reference: list, runs: list, skipped: dict, others: list) -> None:
    """The three tables, on rank 0: losses side by side, memory per rank, time of a step. `others`:
    every rank's memory figures, to say whether rank 0's stand for all of them."""
    pad = int((gpt.make_batch(cfg, "cpu")[1] == gpt.IGNORE).sum())
    say = lambda text: log(f"[lab:transformer] {text}")       # noqa: E731
    say(f"losses of {cfg.iters} SGD steps (lr {cfg.lr:g}), V={cfg.vocab_size} s={cfg.seq_len} b={cfg.batch_size} "
        f"h={cfg.hidden} H={cfg.n_heads} f={cfg.ffn} L={cfg.n_layers}, {pad} of {cfg.seq_len * cfg.batch_size} "
        f"targets padding:")
    say(f"{'run':<21}" + "".join(f"{f'iter {i}':>12}" for i in range(1, cfg.iters + 1)) + "   max |diff|")
    say(f"{'1 process':<21}" + "".join(f"{x:12.6f}" for x in reference))
    for run in runs:
        worst = max(abs(a - b) for a, b in zip(run.losses, reference))
        say(f"{run.label:<21}" + "".join(f"{x:12.6f}" for x in run.losses) + f"   {worst:.1e}")
    for name, why in skipped.items():
        say(f"{name:<21}not run: {why}")
    base = {run.label.split(",")[0]: run for run in runs if run.label.endswith(", 1 rank")}
    differ = [r for r, theirs in enumerate(others) if theirs != others[0]]
    say("memory of rank 0 after the first backward, bytes (x: of the same run on 1 rank); "
        + (f"ranks {differ} hold other amounts:" if differ else f"the same on all {len(others)} ranks:"))
    say(f"{'run':<21}{'parameters':>20}{'gradients':>20}{'activations':>20}")
    for run in runs:
        one = base[run.label.split(",")[0]]
        cell = lambda mine, theirs: f"{mine:,} ({mine / theirs:.2f}x)"      # noqa: E731
        say(f"{run.label:<21}{cell(run.params, one.params):>20}{cell(run.grads, one.grads):>20}"
            f"{cell(run.activations, one.activations):>20}")
    say(f"time of a step (forward, backward, SGD; median of {REPEATS}, {dist.get_backend()} on {get_device().type}):")
    for run in runs:
        one = base[run.label.split(",")[0]]
        say(f"{run.label:<21}{run.step_s * 1e3:10.2f} ms ({run.step_s / one.step_s:.2f}x)")


def config(argv=None) -> gpt.GPTConfig:
    """GPTConfig from the command line: --<field> for each of its fields (--seq-len 128)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in fields(gpt.GPTConfig):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    return gpt.GPTConfig(**vars(parser.parse_args(argv)))


def show(rank: int, world_size: int, cfg: gpt.GPTConfig = gpt.GPTConfig()) -> bool:
    reference, runs, skipped = run_all(cfg, rank, world_size, get_device())
    others = [None] * world_size
    dist.all_gather_object(others, [(run.params, run.grads, run.activations) for run in runs])
    if rank == 0:
        report(cfg, reference, runs, skipped, others)
    dist.barrier()
    worst = max(abs(a - b) for run in runs for a, b in zip(run.losses, reference))
    ok = worst <= TOLERANCE and all(len(run.losses) == len(reference) for run in runs)
    return result_line("transformer", rank, ok, f"losses match the one-process run's: {ok} ({len(runs)} runs of "
                       f"{cfg.iters} steps, max diff {worst:.1e}, tolerance {TOLERANCE:g})") and ok


def main():
    cfg = config()
    rank, _, world_size = init_distributed()
    ok = show(rank, world_size, cfg)
    dist.destroy_process_group()
    leave(0 if ok else 1)


if __name__ == "__main__":
    main()
