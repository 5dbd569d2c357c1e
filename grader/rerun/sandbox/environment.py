"""What a re-run's processes get of the environment: the Python's own variables, one compute thread
per rank, and no GPU, however many cores and GPUs the machine has.

A cluster's module Python (`module load python`, `module load pytorch`) works only with the
variables the module set: its libraries through LD_LIBRARY_PATH, torch through PYTHONPATH. Those
(`PYTHON`) reach the zygote and every rank, their folders bound read only in the sandbox
(grader.rerun.sandbox.bwrap); nothing else of the grader's environment does.

Every thread pool a rank could start is bounded before the zygote's first fork: the variables
OpenMP, MKL, OpenBLAS, Apple's Accelerate and numexpr read when they load (`ONE_THREAD`, set in the
environment the zygote starts with, before it imports torch), then torch's own intra-op and
inter-op pools (`bound_zygote`). gloo starts two threads per network device, one device (the
loopback) here, whatever the cores. A 128-core node then runs a world as a 2-core laptop does: the
same tasks (which limits.processes counts), the same memory.

In a rank, a hand-in's `torch.set_num_threads(32)` (tuned for a GPU node) keeps its one thread
(`hold_rank`): 4 ranks x 32 OpenMP threads would otherwise need more tasks than a world may have,
and crash correct code on any machine.

GPUs stay out of sight (CUDA_VISIBLE_DEVICES is empty before torch is imported): re-runs are on
the CPU, and a forked rank never touches a CUDA context. Hand-in code that asks for "cuda" anyway
lands on the CPU (grader.rerun.rank.hooks).
"""

import os

PYTHON = ("LD_LIBRARY_PATH", "PYTHONPATH")
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                     "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "BLIS_NUM_THREADS")}
NO_GPU = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": ""}
ENVIRONMENT = {**ONE_THREAD, **NO_GPU}   # what the zygote, and every rank, starts with


def python_variables(environ=None) -> dict:
    """The variables of `PYTHON` set in `environ` (ours by default), PYTHONPATH without the engine's
    own folder (the zygote's, put first by the executor): what a rank keeps of them."""
    environ = os.environ if environ is None else environ
    engine = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    found = {name: environ[name] for name in PYTHON if environ.get(name)}
    if "PYTHONPATH" in found:
        rest = [p for p in found.pop("PYTHONPATH").split(os.pathsep) if p and os.path.abspath(p) != engine]
        if rest:
            found["PYTHONPATH"] = os.pathsep.join(rest)
    return found


def bound_zygote() -> None:
    """In the zygote, once torch is imported and before any fork: one intra-op and one inter-op thread."""
    import torch
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass   # set once per process, or the pool already started: it then has the size asked before


def hold_rank() -> None:
    """In a rank, before hand-in code: torch's thread settings keep one thread whatever is asked."""
    import torch
    os.environ.update(ONE_THREAD)
    original = torch.set_num_threads
    original(1)

    def set_num_threads(n, *args, **kwargs):
        original(1)

    def set_num_interop_threads(n, *args, **kwargs):
        return None

    torch.set_num_threads = set_num_threads
    torch.set_num_interop_threads = set_num_interop_threads
