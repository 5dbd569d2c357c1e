"""Grading on a Slurm cluster: chunks of hand-ins as the tasks of one submitit job array.

    python -m grader grade PATH... --out DIR --executor slurm [--partition P] [--array-parallelism K]
                                   [--chunk N] [--slurm-time MIN] [--slurm-cluster local]

Each array task grades its chunk on its node exactly as a TA's machine would (the warm executor,
the sandbox, the canary first; the pipeline writes each hand-in's files into DIR as soon as it is
graded, grader.pipeline.record), so DIR must be on a file system the nodes share. The submitting process waits, showing progress,
then records `infra_error` for every hand-in of a task that failed, was cancelled or ran out of
time before grading it; the next run grades exactly those again. `--slurm-cluster local` runs the
same array through submitit's local executor, on this machine.
"""

import json
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

from grader import kit
from grader.batch.local import grade_handins
from grader.limits import slurm_task
from grader.names import student_dir
from grader.pipeline.record import infra_into
from grader.rubric import load_rubric


class ScaleError(RuntimeError):
    """The job array could not be submitted; the message says what Slurm answered."""


def grade_chunk(chunk: list, out: str, rubric_path, sandbox: str, jobs: int) -> dict:
    """One array task: grade `chunk` into `out` (the pipeline writes each hand-in's files); return
    {student: status}."""
    rubric = load_rubric(rubric_path)
    statuses, _, _ = grade_handins(chunk, Path(out), rubric, jobs=jobs, sandbox=sandbox, progress=False)
    return statuses


def _mark(out: Path, h):
    """What stands in OUT for `h` before the array runs: its grading.json's identity (inode, size,
    modification time), or None. A task writes each result atomically (a new file renamed into
    place), so a result a task wrote has another identity, whatever either machine's clock says."""
    try:
        st = (student_dir(out, h.student) / "grading.json").stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _status(out: Path, h, before, vouched: bool):
    """The status in the result of `h` a task wrote, or None: a result of `h`'s bytes that the task
    said it graded (`vouched`: its return value names `h`), or one written since `before` (a task
    that died after grading part of its chunk returns nothing, and what it wrote still stands). No
    clock is read: a node's clock may be minutes off the submitting machine's."""
    try:
        data = json.loads((student_dir(out, h.student) / "grading.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("sha256") != h.sha256:
        return None
    return data.get("status") if vouched or _mark(out, h) != before else None


def _parameters(rubric, jobs: int, chunk: int, partition, array_parallelism: int, time_min, mem_gb) -> dict:
    """The array's submitit parameters: what a task needs at most, from the rubric's timeouts and
    limits (grader.limits.slurm_task). The tasks import the grader from this checkout: their
    PYTHONPATH names it in the task's own setup, never in this process's environment."""
    task = slurm_task(chunk, jobs, rubric.timeouts.handin, rubric.limits.memory_mb)
    setup = [f"export PYTHONPATH={kit.ROOT}${{PYTHONPATH:+:$PYTHONPATH}}"]
    params = {"name": "a4-grade", "timeout_min": time_min or task.minutes, "cpus_per_task": task.cpus,
              "mem_gb": mem_gb or task.mem_gb, "tasks_per_node": 1, "nodes": 1,
              "slurm_array_parallelism": array_parallelism, "slurm_setup": setup, "local_setup": setup}
    if partition:
        params["slurm_partition"] = partition
    return params


def _submit(chunks: list, out: Path, rubric_path, sandbox: str, jobs: int, params: dict, cluster) -> tuple:
    """Submit one array task per chunk; return (the jobs, the cluster's name). ScaleError says what
    Slurm answered."""
    import submitit
    folder = out / ".slurm" / datetime.now().strftime("%Y%m%d-%H%M%S")
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    executor.update_parameters(**params)
    n = len(chunks)
    try:
        array = executor.map_array(grade_chunk, chunks, [str(out)] * n, [rubric_path] * n, [sandbox] * n, [jobs] * n)
    except (submitit.core.utils.FailedJobError, OSError) as e:
        answer = " ".join(str(e).split())[:500]
        asked = f"{params['timeout_min']} min, {params['cpus_per_task']} CPUs, {params['mem_gb']} GB a task"
        raise ScaleError(f"the job array could not be submitted ({executor.cluster}): {answer}; it asked for {asked} "
                         f"(grader.limits.slurm_task: the rubric's timeouts.handin and limits.memory_mb, and --jobs; "
                         f"--slurm-time, --slurm-mem-gb or --jobs ask for less, where the cluster's nodes have "
                         f"less)") from e
    return array, executor.cluster


def _wait(array: list, out: Path, todo: list, marks: dict, progress: bool) -> None:
    """Wait for every task, showing how many hand-ins have a new result and the tasks' states."""
    while not all(job.done() for job in array):
        if progress:
            graded = sum(_mark(out, h) != marks[h.student] for h in todo)
            states = Counter(job.state for job in array)
            sys.stderr.write(f"\r\033[K{graded}/{len(todo)} graded; tasks: "
                             + ", ".join(f"{n} {s.lower()}" for s, n in sorted(states.items())))
            sys.stderr.flush()
        time.sleep(2)
    if progress:
        sys.stderr.write("\n")


def _collect(array: list, chunks: list, out: Path, rubric, marks: dict) -> dict:
    """{student: status} for every hand-in of every task: what the task graded, else an infra_error
    saying how its task ended (written into OUT by the pipeline, so the next run grades it again)."""
    statuses = {}
    for job, hands in zip(array, chunks):
        failure, vouched = "", {}
        try:
            vouched = job.result() or {}
        except Exception as e:  # noqa: BLE001 - submitit raises its own errors for failed tasks
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            failure = f"array task {job.job_id} ended {job.state.lower()}: {first[:300]}"
        for h in hands:
            status = _status(out, h, marks[h.student], h.student in vouched)
            if status is None:
                status = infra_into(h, rubric, out, failure or f"array task {job.job_id} left no result for it").status
            statuses[h.student] = status
    return statuses


def grade_on_slurm(todo: list, out: Path, rubric_path, rubric, sandbox: str = "auto", jobs: int = kit.TASK_JOBS,
                   progress: bool = True, partition: str = None, array_parallelism: int = kit.ARRAY_PARALLELISM,
                   chunk: int = kit.ARRAY_CHUNK, time_min: int = None, mem_gb: int = None, cluster: str = None) -> dict:
    """Grade `todo` through a job array (submit, wait, collect); return {student: status} for every
    hand-in in it (its result is in `out`)."""
    if not todo:
        return {}
    out = Path(out).resolve()
    chunks = [todo[i:i + chunk] for i in range(0, len(todo), chunk)]
    params = _parameters(rubric, jobs, chunk, partition, array_parallelism, time_min, mem_gb)
    marks = {h.student: _mark(out, h) for h in todo}
    array, where = _submit(chunks, out, rubric_path, sandbox, jobs, params, cluster)
    if progress:
        sys.stderr.write(f"submitted {len(todo)} hand-ins as {len(array)} array task(s) "
                         f"{array[0].job_id.split('_')[0]} ({where})\n")
    _wait(array, out, todo, marks, progress)
    return _collect(array, chunks, out, rubric, marks)
