"""The executors by name, for the batch, `check` and Gradescope: `make_executor("warm" | "torchrun")`.

Apart from grader.rerun.executor, which holds what both executors share and the warm one, so that
the torchrun executor, which builds on it, is loaded only when it is asked for.
"""

import contextlib

from grader.limits import Limits
from grader.rerun.executor import WarmExecutor

EXECUTORS = ("warm", "torchrun")   # and "slurm": grader.batch.array spreads hand-ins over a job array


_LAUNCHED = {}   # (sandbox, limits) -> a warm executor launched early, for the first make_executor of them


@contextlib.contextmanager
def prelaunched(sandbox: str = "auto", limits: Limits = None):
    """Within the block, a zygote launched on entering it, before this process imports torch (this
    module and the executor's load none): the command's import and the zygote's then run side by
    side, not one after the other, and the block's first `make_executor("warm", sandbox, limits)`
    takes it, ready or nearly. One the block never took is closed on leaving it, so no later
    command in the same process takes a helper started for another (with another environment).
    Where it cannot launch, nothing is: `start` then does what it always does."""
    wanted = (sandbox, repr(limits or Limits()))
    executor = WarmExecutor(sandbox, limits)
    try:
        executor.launch()
        _LAUNCHED[wanted] = executor
    except Exception:  # noqa: BLE001 - whatever failed, `start` meets it again and says it
        executor.close()
    try:
        yield
    finally:
        if _LAUNCHED.get(wanted) is executor:
            del _LAUNCHED[wanted]
            executor.close()


def make_executor(name: str, sandbox: str = "auto", limits: Limits = None, key: bytes = None, jobs: int = 1):
    """A new executor of kind `name` (not started: its first world, or `start`, starts it; a warm one
    launched by `prelaunched` with these arguments is taken instead); `jobs`: how many its batch runs at once (the
    user's task headroom must fit them all)."""
    if name == "warm":
        early = _LAUNCHED.pop((sandbox, repr(limits or Limits())), None)
        if early is not None:
            early.key, early.jobs = key, jobs
            return early
        return WarmExecutor(sandbox, limits, key, jobs)
    if name == "torchrun":
        from grader.rerun.torchrun import TorchrunExecutor   # the cold path, loaded when it is asked for
        return TorchrunExecutor(sandbox, limits, key)
    raise ValueError(f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")
