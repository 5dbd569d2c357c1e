"""What a re-run's processes get of the environment: the Python's own variables, one compute thread
per rank, and no GPU, however many cores and GPUs the machine has.

A cluster's module Python (`module load python`, `module load pytorch`) works only with the
variables the module set: its libraries through LD_LIBRARY_PATH, torch through PYTHONPATH. Those
(`PYTHON`) reach the zygote and every rank, their folders bound read only in the sandbox
(grader.rerun.bwrap); nothing else of the grader's environment does.

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
import time

PYTHON = ("LD_LIBRARY_PATH", "PYTHONPATH")
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                     "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "BLIS_NUM_THREADS")}
NO_GPU = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": ""}
ENVIRONMENT = {**ONE_THREAD, **NO_GPU}   # what the zygote, and every rank, starts with
# The zygote's alone: glibc's malloc asks for transparent huge pages for its heap as torch's import
# grows it (glibc 2.35 and later; others ignore it), and so leaves fold_into_huge_pages half as much to do.
ZYGOTE = {**ENVIRONMENT, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


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


MADV_COLLAPSE = 25   # Linux 6.1 and later
HUGE = 2 << 20
THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_pages_refused() -> str:
    """Why the zygote's memory cannot be folded into huge pages here ('' when it can)."""
    try:
        with open(THP) as f:
            mode = f.read().split("[", 1)[1].split("]", 1)[0]
    except (OSError, IndexError):
        return "this kernel has no transparent huge pages"
    if mode == "never":
        return f"transparent huge pages are off ({THP}: never)"
    release = tuple(int(n) for n in os.uname().release.split("-")[0].split(".")[:2] if n.isdigit())
    return "" if release >= (6, 1) else f"Linux {os.uname().release} is older than 6.1 (no MADV_COLLAPSE)"


def fold_into_huge_pages(budget_s: float = 1.0) -> int:
    """In the zygote, once everything the ranks share is loaded and frozen, before the first fork:
    its private writable memory (the heap, Python's arenas, torch's allocations: about 200 MB
    with torch loaded) folded into transparent huge pages (madvise MADV_COLLAPSE), each 2 MB
    aligned span at once. A fork copies one page-table entry per page it shares, and an exit
    drops each: 512 times fewer entries for every leader and rank forked after, in the six
    processes of a world (about 14 ms of a 150 ms world on 2 cores). A huge page a rank writes is
    split back into small ones, and only the small one written is copied. Paid once per zygote:
    about 0.25 s for torch's CPU build (0.5 s without ZYGOTE's heap already in huge pages); no
    more than `budget_s` (a kernel that must compact much memory first leaves the rest as it is).
    Returns the bytes folded; 0 where the kernel will not (huge_pages_refused, asked outside the
    sandbox): nothing changes then."""
    # Not gated on huge_pages_refused: inside the sandbox /sys is not mounted to ask it, and a kernel
    # that will not fold refuses each call at once (EINVAL).
    import ctypes
    libc = ctypes.CDLL(None)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    try:
        with open("/proc/self/maps") as maps:
            spans = [line.split() for line in maps]
    except OSError:
        return 0
    folded, deadline = 0, time.monotonic() + budget_s
    for fields in spans:
        start, end = (int(x, 16) for x in fields[0].split("-"))
        # Anonymous (no file) or the heap, writable and private: what a fork copies entry by entry.
        if fields[1][:2] != "rw" or fields[1][3] != "p" or (len(fields) > 5 and fields[5] != "[heap]"):
            continue
        start, end = (start + HUGE - 1) & ~(HUGE - 1), end & ~(HUGE - 1)
        if end > start and time.monotonic() < deadline and libc.madvise(start, end - start, MADV_COLLAPSE) == 0:
            folded += end - start
    return folded


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
