"""The executors by name, for the batch, `check` and Gradescope: `make_executor("warm" | "torchrun")`.

Apart from grader.rerun.executor, which holds what both executors share and the warm one, so that
the torchrun executor, which builds on it, is loaded only when it is asked for.
"""

from grader.limits import Limits
from grader.rerun.executor import WarmExecutor

EXECUTORS = ("warm", "torchrun")   # and "slurm": grader.batch.array spreads hand-ins over a job array


def make_executor(name: str, sandbox: str = "auto", limits: Limits = None, key: bytes = None, jobs: int = 1):
    """A new executor of kind `name` (not started: its first world, or `start`, starts it); `jobs`:
    how many its batch runs at once (the user's task headroom must fit them all)."""
    if name == "warm":
        return WarmExecutor(sandbox, limits, key, jobs)
    if name == "torchrun":
        from grader.rerun.torchrun import TorchrunExecutor   # the cold path, loaded when it is asked for
        return TorchrunExecutor(sandbox, limits, key)
    raise ValueError(f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")
