"""The whole lab in one world, as the Slurm job (slurm/lab.sbatch) runs it: the collectives, data,
tensor and pipeline parallelism on the MLP, loss parallel and the tiny transformer's runs, then the
bandwidth benchmark.

    torchrun --standalone --nproc-per-node 4 lab/run_all.py
    python lab/run_all.py                                       # one rank
    A4_LAB_MAX_SIZE=64M A4_LAB_OUT=runs torchrun --standalone --nproc-per-node 4 lab/run_all.py

Each part logs its own lines (see the part's file); every rank ends with

    [lab:all][Rank <r>] ok: True | collectives, data_parallel, tensor_parallel, pipeline_parallel, vocab_parallel, transformer

(a students' copy of the lab may lack the parts that answer the assignment: the line then names them)

and the exit status is 1 when a part did not match. The benchmark takes its largest size from
A4_LAB_MAX_SIZE and writes its CSV and plot into A4_LAB_OUT (lab/bandwidth.py's defaults otherwise).
"""

import sys
from pathlib import Path

_KIT = str(Path(__file__).resolve().parents[1])
if _KIT not in sys.path:        # run as a script only lab/ is on the path; `lab` lives one above
    sys.path.insert(0, _KIT)

import importlib  # noqa: E402

import torch.distributed as dist  # noqa: E402

from lab import bandwidth  # noqa: E402
from lab.common import result_line  # noqa: E402
from utils import init_distributed, leave  # noqa: E402

# The checked parts, in the lecture's order; each show(rank, world_size) logs and returns whether it
# matched. A students' copy of the lab may lack the parts that answer the assignment (the release
# leaves them out): those it does not hold are named, not run.
NAMES = ("collectives", "data_parallel", "tensor_parallel", "pipeline_parallel", "vocab_parallel", "transformer")


def parts() -> tuple:
    """({name: show} of the parts this copy of the lab holds, [the names it does not])."""
    found, absent = {}, []
    for name in NAMES:
        try:
            found[name] = importlib.import_module(f"lab.{name}").show
        except ModuleNotFoundError as e:
            if e.name != f"lab.{name}":
                raise
            absent.append(name)
    return found, absent


def main():
    rank, _, world_size = init_distributed()
    outcome, (found, absent) = {}, parts()
    for name, show in found.items():
        outcome[name] = show(rank, world_size)
        dist.barrier()           # keep one part's lines before the next part's
    bandwidth.show(rank, world_size, argv=[])   # its knobs come from the environment here
    ok = all(outcome.values())
    failed = [name for name, good in outcome.items() if not good]
    result_line("all", rank, ok, ", ".join(outcome) + ("" if ok else f" | did not match: {', '.join(failed)}")
                + (f" | not in this copy of the lab: {', '.join(absent)}" if absent else ""))
    dist.destroy_process_group()
    leave(0 if ok else 1)


if __name__ == "__main__":
    main()
