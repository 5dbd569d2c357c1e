"""Why a machine cannot grade, in the grader's own process: the cause, with its numbers, and the fix.

When the canary (the reference, re-run first by every batch) or a student's `check` cannot run,
what the engine reports is a symptom ("Resource temporarily unavailable", a helper that did not
start, a world out of memory). `explain` turns it into a cause measured on this machine now (the
user's tasks against `ulimit -u`, limits.memory_mb against what a world of this Python holds, the
namespace the kernel refused) and the fix, and says whether a second try can help (`transient`):
only then do messages say "grade it again". `torch_build` says which torch this is (doctor, the
messages): the CPU or the CUDA build, its version, whether a GPU is visible (re-runs use the CPU
either way).
"""

from dataclasses import dataclass

from grader.limits import Limits
from grader.rerun import bwrap
from grader.rerun.sandbox import tasks

DOCTOR = "`python -m grader doctor` runs a world here and says what holds"


@dataclass
class Diagnosis:
    cause: str
    fix: str
    transient: bool = False

    def text(self) -> str:
        """"cause; fix" and, when a second try can help, "or try again"."""
        return self.cause + (f"; {self.fix}" if self.fix else "") + ("; or try again" if self.transient else "")


def torch_version() -> str:
    """"2.13.0+cpu (CPU build)", "2.13.0 (CUDA 13.0 build)": the torch that grades, as grading.json
    and the staff report name it (its local part, +cpu, names the CPU wheel; the CUDA wheel may have none)."""
    import torch
    cuda = getattr(torch.version, "cuda", None)
    return f"{torch.__version__} ({f'CUDA {cuda} build' if cuda else 'CPU build'})"


def torch_build() -> str:
    """"torch 2.13.0+cu130 (CUDA 13.0 build), no GPU visible" and the like."""
    try:
        import torch
    except ImportError:
        return "torch is not installed in this Python"
    cuda = getattr(torch.version, "cuda", None)
    try:
        count = torch.cuda.device_count() if cuda else 0
    except Exception:  # noqa: BLE001 - a broken driver sees no GPU
        count = 0
    seen = f"{count} GPU{'s' if count != 1 else ''} visible" if count else "no GPU visible"
    return f"torch {torch_version()}, {seen} (re-runs use the CPU either way)"


TASKS = ("resource temporarily unavailable", "can't start new thread", "thread creation failed", "errno 11")
MEMORY = ("cannot allocate memory", "memoryerror", "out of memory", "bad_alloc", "used more than")
NAMESPACES = ("unshare", "namespace", "uid map", "uid_map", "no space left on device", "operation not permitted",
              "sandbox could not be set up")
STARTING = ("did not start", "error while loading shared libraries", "no module named", "could not start")
REFUSALS = ("no re-run world can run right on this machine", "hand-in code cannot be isolated on this machine")
TRANSIENT = ("stopped answering", "is gone", "timed out", "did not finish", "still running")


def _tasks(limits: Limits) -> Diagnosis:
    room = tasks.headroom()
    if room.limit is None:
        return Diagnosis("a process of the world could not start a thread or a process (Resource temporarily "
                         "unavailable), though your user's processes are not limited (ulimit -u)",
                         f"look for a pids limit of your session or container; {DOCTOR}")
    cause = (f"a process of the world could not start a thread or a process (Resource temporarily unavailable): "
             f"your user runs {room.used} of the {room.limit} processes and threads `ulimit -u` allows")
    short = room.refusal(limits.processes + 8, limits.processes)
    return Diagnosis(cause, short.split(": ", 1)[1] if short else f"end other programs of your user; {DOCTOR}",
                     transient=not short)


def explain(status: str, text: str, limits: Limits = None) -> Diagnosis:
    """Why the reference (or a student's check) could not run: `status` is the result's status
    (infra_error, oom, timeout, crashed ...), `text` what the engine said."""
    limits = limits or Limits()
    said = (text or "").lower()
    for refused in REFUSALS:   # the engine's own refusals say the cause and the fix already
        if refused in said:
            return Diagnosis(text[said.index(refused):].strip().rstrip(")"), "")
    if any(s in said for s in TASKS) and "memory" not in said:
        return _tasks(limits)
    if status == "oom" or any(s in said for s in MEMORY):
        return Diagnosis(f"a world of the reference used more memory than limits.memory_mb ({limits.memory_mb} MB, "
                         f"for all of a world's ranks and their children) allows",
                         f"raise limits.memory_mb in the rubric (limits: {{memory_mb: {2 * limits.memory_mb}}}); "
                         f"{DOCTOR}, and how much a world takes")
    if any(s in said for s in NAMESPACES):
        return Diagnosis(f"the kernel refused the sandbox a namespace ({text.strip()[:300]})",
                         f"{bwrap.ADVICE}; or pass --sandbox off to accept the risk")
    if any(s in said for s in STARTING):
        return Diagnosis(f"the re-run helper (this Python, in the environment the grader gives it) could not "
                         f"start ({text.strip()[:300]})",
                         "run the grader with a Python that starts by itself, or with the variables it needs "
                         f"(LD_LIBRARY_PATH, PYTHONPATH: both reach the helper) set; {DOCTOR}")
    if status == "timeout" or any(s in said for s in TRANSIENT):
        return Diagnosis(f"the machine did not run a world of the reference in time ({text.strip()[:200]})",
                         "grade with fewer --jobs, on a machine less busy, or with longer timeouts in the rubric",
                         transient=True)
    return Diagnosis(f"a world of the reference could not run ({text.strip()[:300]})", DOCTOR, transient=True)
