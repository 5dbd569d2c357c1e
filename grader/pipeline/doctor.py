"""`python -m grader doctor`: whether re-run worlds run on this machine, for this user and this Python,
under the rubric's limits, and what holds them.

It starts the sandbox exactly as `grade` does, prints torch's build and each layer, what each limit
is measured against (the world's cgroup, the watchdog, the user's `ulimit -u` and the tasks the user
runs now, a Slurm job's cgroup), and then runs one real world of the reference at the rubric's
largest check, measuring its memory and its tasks from outside. It exits 1 when no world can run
(the sandbox refused, the machine unfit, a part of the reference that did not come back), with the
cause. Where it ran, it re-runs the reference at every check as a batch's canary does
(grader.pipeline.canary) and checks its answers: 1 when they are wrong or the rubric's limits are
too small for it, naming which; 0 when all is right (the layers that do not hold are listed either way).
"""

import dataclasses
import getpass
import os
import shutil
import sys
import time
from pathlib import Path

from grader import kit
from grader.parts import BACKWARD
from grader.pipeline.canary import canary, lowered
from grader.pipeline.peak import Peak
from grader.rerun import bwrap
from grader.rerun.sandbox import cgroup, environment, tasks
from grader.rerun import machine, starved
from grader.rerun.executor import CannotGrade, WarmExecutor
from grader.rerun.executors import make_executor
from grader.rerun.sandbox.namespaces import scratch_dir
from grader.results import Status
from grader.rubric import RubricError, load_rubric

LAYERS = ("sandbox", "files", "network", "processes", "user", "limits", "memory", "tasks", "scratch")


def _limits_text(limits, isolation: dict, world_cgroup) -> list:
    """What each limit is measured against, here (`world_cgroup`: the executor's, or None)."""
    room = tasks.headroom()
    user = ("not limited (root)" if room.limit is None else
            f"your user runs {room.used} of the {room.limit} tasks `ulimit -u` allows ({room.left} left)")
    job_mb = cgroup.slurm_job_limit()
    lines = [f"memory_mb  {limits.memory_mb} MB per world, its ranks and their children together (Pss): "
             f"{isolation.get('memory', '').split(': ', 1)[-1]}",
             f"processes  {limits.processes} tasks per world, threads included: "
             f"{isolation.get('tasks', '').split(': ', 1)[-1]}; {user}",
             f"per rank   data past what it holds at its fork: {limits.memory_mb} MB (RLIMIT_DATA); files "
             f"{limits.file_mb} MB; CPU {limits.cpu_s} s; /tmp {limits.tmp_mb} MB per world"]
    lines.append(f"timeouts   a part past its clock hung where its ranks had the CPU, and runs again where they "
                 f"were kept from it (their run and wait times, {starved.SOURCE})" if starved.READABLE else
                 f"timeouts   this kernel keeps no thread's run and wait times ({starved.SOURCE}): a part past "
                 f"its clock always runs again, on the rubric's clock")
    refused = environment.huge_pages_refused()
    lines.append(f"forks      {refused}: each fork of a world copies the helper's page tables entry by entry (about "
                 f"10 ms more a world on 2 cores)" if refused else
                 "forks      the helper keeps its memory in 2 MB pages: a world's forks copy 512 times fewer "
                 "page-table entries")
    if job_mb:
        lines.append(f"slurm job  {os.environ.get('SLURM_JOB_ID')}: its cgroup holds {job_mb} MB for the whole batch")
    if world_cgroup is not None:
        lines.append(f"cgroup     cgroup v{world_cgroup.version}: " + ", ".join(
            f"{name or 'memory and pids'} {folder}" for name, folder in world_cgroup.folders.items()))
    elif cgroup.WorldCgroup.why:
        lines.append(f"cgroup     none of the world's own ({cgroup.WorldCgroup.why}): the watchdog alone holds a world, "
                     f"and may let it pass its memory by what it allocates between two polls")
    return lines


def _world(executor, rubric) -> tuple:
    """Run the reference at the rubric's largest check; (the check, part -> PartRun, Peak, seconds)."""
    from grader.rerun.check import prepare_code, run_check
    check = max(rubric.checks, key=lambda c: (c.world_size, c.kind != BACKWARD))
    scratch = Path(scratch_dir("a4-doctor-"))
    started = time.monotonic()
    try:
        with Peak() as peak:
            runs = run_check(executor, prepare_code(kit.REFERENCE), dataclasses.replace(check, hidden=False),
                             rubric, scratch, rubric.parts_at(check))   # the course's parts, as grade runs them
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return check, runs, peak, time.monotonic() - started


def doctor_command(args) -> int:
    try:
        rubric = load_rubric(getattr(args, "rubric", None))
    except RubricError as e:
        print(f"grader: {e}", file=sys.stderr)
        return 2
    binary = bwrap.find_bwrap()
    print(f"user:       {getpass.getuser()} (uid {os.getuid()})"
          + (": each world's ranks run under a user id of their own" if os.geteuid() == 0 else ""))
    print(f"python:     {sys.executable} (prefix {sys.prefix})")
    print(f"torch:      {machine.torch_build()}")
    print(f"bubblewrap: {bwrap.version(binary) + ' at ' + binary + (' (setuid)' if bwrap.setuid(binary) else '') if binary else 'not found'}")
    executor = WarmExecutor(args.sandbox, rubric.limits)
    try:
        isolation = executor.start()
        print()
        for layer in LAYERS:
            print(f"{layer + ':':<11} {isolation.get(layer, '')}")
        for problem in isolation.get("problems", []):
            print(f"problem:    {problem}")
        print("\nmeasured against:")
        for line in _limits_text(rubric.limits, isolation, executor._cgroup):
            print(f"  {line}")
        check, runs, peak, seconds = _world(executor, rubric)
        said = _verdict(check, runs, peak, seconds, rubric.limits, isolation, lowered(rubric))
        if said == 0 or lowered(rubric):   # a world that failed under lowered limits: theirs, or the machine's?
            said = _answers(executor, rubric, args.sandbox)
    except CannotGrade as e:
        print(f"\ngrade would refuse to run hand-ins here:\n  {e}")
        return 1
    except (OSError, RuntimeError) as e:
        print(f"\nthe re-run helper did not start: {e}")
        return 1
    finally:
        executor.close()
    return said


def _verdict(check, runs: dict, peak: Peak, seconds: float, limits, isolation: dict, low: dict = None) -> int:
    """`low`: the limits and timeouts the rubric lowers (grader.pipeline.canary.lowered): where a
    world failed under them, the canary, run next, tells them from the machine."""
    failed = {p: r for p, r in runs.items() if r.status != Status.PASSED}
    where = f"a world of the reference at check '{check.name}' ({check.world_size} ranks)"
    if failed and low:
        part, run = next(iter(failed.items()))
        print(f"\n{where}: {part} {run.status.value}: {run.detail[:400]}\nthe rubric lowers {', '.join(low)} below "
              f"the default: the reference's run at every check, next, tells whether that is the cause")
        return 1
    if failed:
        part, run = next(iter(failed.items()))
        why = machine.explain(run.status.value, run.detail or next(
            (r.exception for r in run.ranks.values() if r.exception), ""), limits)
        print(f"\n{where}: {part} {run.status.value}: {run.detail[:400]}\n"
              f"no world can run here: {why.cause}" + (f"\nfix: {why.fix}" if why.fix else ""))
        return 1
    measured = (f"; at most {peak.memory_mb} MB of its {limits.memory_mb} and {peak.tasks} of its "
                f"{limits.processes} tasks" if peak.tasks else "")
    print(f"\n{where}: every part ran, in {seconds:.1f} s{measured}")
    sandboxed = isolation.get("sandbox", "none") != "none"
    print("every layer holds: hand-in code is isolated" if sandboxed and not isolation.get("problems") else
          "worlds run, but not every layer holds (see above)")
    return 0


def _answers(executor, rubric, sandbox: str) -> int:
    """Whether the reference's answers are right at every check, as a batch's canary judges them:
    0, or 1 with the cause (its code, or the rubric's limits too small for it) and the fix."""
    scratch = Path(scratch_dir("a4-doctor-"))
    try:
        said = canary(executor, rubric, scratch, lambda limits: make_executor("warm", sandbox, limits))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if said.status == Status.PASSED:
        print(f"the reference's answers: right at every check ({len(rubric.checks)}), as grade's canary judges them")
    elif said.status == Status.NOT_RUN:
        print(f"the reference's answers: not checked: {said.cause}")
    else:
        print(f"the reference's answers: {said.kind}: {said.cause}\nfix: {said.fix}")
        return 1
    return 0
