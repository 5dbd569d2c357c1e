"""Grading on a Slurm cluster: chunks of hand-ins as the tasks of one submitit job array.

    python -m grader grade PATH... --out DIR --executor slurm [--partition P] [--array-parallelism K]
                                   [--chunk N] [--slurm-time MIN] [--slurm-cluster local]

Each array task grades its chunk on its node exactly as a TA's machine would (the warm executor,
the sandbox, the canary first) and writes each hand-in's files into DIR as soon as it is graded,
so DIR must be on a file system the nodes share. The submitting process waits, showing progress,
then records `infra_error` for every hand-in of a task that failed, was cancelled or ran out of
time before grading it; the next run grades exactly those again. `--slurm-cluster local` runs the
same array through submitit's local executor, on this machine.
"""

import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from grader import kit
from grader.batch.local import grade_handins, infra_result
from grader.limits import slurm_task
from grader.names import student_dir
from grader.pipeline import report
from grader.rubric import load_rubric


class ScaleError(RuntimeError):
    """The job array could not be submitted; the message says what Slurm answered."""


def grade_chunk(chunk: list, out: str, rubric_path, sandbox: str, jobs: int) -> dict:
    """One array task: grade `chunk` into `out`; return {student: status}."""
    rubric = load_rubric(rubric_path)
    results, _, _ = grade_handins(chunk, Path(out), rubric, jobs=jobs, sandbox=sandbox, progress=False)
    return {student: r["status"] for student, r in results.items()}


def _fresh(out: Path, h, since: str):
    """The result a task wrote for `h` after `since`, or None."""
    try:
        data = json.loads((student_dir(out, h.student) / "grading.json").read_text())
    except (OSError, ValueError):
        return None
    return data if data.get("sha256") == h.sha256 and data.get("graded_at", "") >= since else None


def grade_on_slurm(todo: list, out: Path, rubric_path, rubric, sandbox: str = "auto", jobs: int = kit.TASK_JOBS,
                   progress: bool = True, partition: str = None, array_parallelism: int = kit.ARRAY_PARALLELISM,
                   chunk: int = kit.ARRAY_CHUNK, time_min: int = None, mem_gb: int = None, cluster: str = None) -> dict:
    """Grade `todo` through a job array; return {student: result dict} for every hand-in in it."""
    import submitit
    if not todo:
        return {}
    out = Path(out).resolve()
    chunks = [todo[i:i + chunk] for i in range(0, len(todo), chunk)]
    folder = out / ".slurm" / datetime.now().strftime("%Y%m%d-%H%M%S")
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    # What a task needs at most, from the rubric's timeouts and limits (grader.limits.slurm_task).
    task = slurm_task(chunk, jobs, rubric.timeouts.handin, rubric.limits.memory_mb)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(kit.ROOT), os.environ.get("PYTHONPATH")]))
    params = {"name": "a4-grade", "timeout_min": time_min or task.minutes, "cpus_per_task": task.cpus,
              "mem_gb": mem_gb or task.mem_gb,
              "tasks_per_node": 1, "nodes": 1, "slurm_array_parallelism": array_parallelism,
              "slurm_setup": [f"export PYTHONPATH={kit.ROOT}:${{PYTHONPATH:-}}"]}
    if partition:
        params["slurm_partition"] = partition
    executor.update_parameters(**params)
    since = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        array = executor.map_array(grade_chunk, chunks, [str(out)] * len(chunks), [rubric_path] * len(chunks),
                                   [sandbox] * len(chunks), [jobs] * len(chunks))
    except (submitit.core.utils.FailedJobError, OSError) as e:
        answer = " ".join(str(e).split())[:500]
        asked = f"{params['timeout_min']} min, {params['cpus_per_task']} CPUs, {params['mem_gb']} GB a task"
        raise ScaleError(f"the job array could not be submitted ({executor.cluster}): {answer}; it asked for {asked} "
                         f"(grader.limits.slurm_task: the rubric's timeouts.handin and limits.memory_mb, and --jobs; "
                         f"--slurm-time, --slurm-mem-gb or --jobs ask for less, where the cluster's nodes have "
                         f"less)") from e
    if progress:
        sys.stderr.write(f"submitted {len(todo)} hand-ins as {len(array)} array task(s) "
                         f"{array[0].job_id.split('_')[0]} ({executor.cluster})\n")
    while not all(job.done() for job in array):
        if progress:
            graded = sum(_fresh(out, h, since) is not None for h in todo)
            states = {}
            for job in array:
                states[job.state] = states.get(job.state, 0) + 1
            sys.stderr.write(f"\r\033[K{graded}/{len(todo)} graded; tasks: "
                             + ", ".join(f"{n} {s.lower()}" for s, n in sorted(states.items())))
            sys.stderr.flush()
        time.sleep(2)
    if progress:
        sys.stderr.write("\n")
    results = {}
    for job, hands in zip(array, chunks):
        failure = ""
        try:
            job.result()
        except Exception as e:  # noqa: BLE001 - submitit raises its own errors for failed tasks
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            failure = f"array task {job.job_id} ended {job.state.lower()}: {first[:300]}"
        for h in hands:
            fresh = _fresh(out, h, since)
            if fresh is None:
                result = infra_result(h, rubric, failure or f"array task {job.job_id} left no result for it")
                report.write_handin(result, out)
                fresh = result.to_dict()
            results[h.student] = report.gradebook_view(fresh)
    return results
