"""Grading through a job array (--executor slurm), here through submitit's local executor: the same
results as grading on this machine; a task that dies leaves infra_error, and the next run grades
exactly what it left."""

import json
import os
import signal
import threading
import time

import pytest

from grader.batch.run import grade_batch
from tests.corpus import FULL, REFERENCE, Files, fast_rubric, mutate, refingerprint, skeleton, write_zip

pytestmark = pytest.mark.scale   # make test-scale runs these; make test leaves them out


@pytest.fixture(scope="module")
def inbox(reference_run, tmp_path_factory):
    box = tmp_path_factory.mktemp("array") / "inbox"
    box.mkdir()
    log, err = reference_run
    for name, code in {"reference": REFERENCE.read_text(), "skeleton": skeleton(), "dp_summed": mutate("dp_summed"),
                       "acc_unscaled": mutate("acc_unscaled")}.items():
        write_zip(box / f"{name}.zip", Files(code=code, log=refingerprint(log, code), err=err))
    return box


def results(out):
    return {p.parent.name: json.loads(p.read_text()) for p in (out / "students").glob("*/grading.json")}


def same(a, b):
    return {s: (r["status"], r["score"], r["flags"]) for s, r in a.items()} == \
           {s: (r["status"], r["score"], r["flags"]) for s, r in b.items()}


@pytest.mark.timeout(600)
def test_a_job_array_grades_like_this_machine(inbox, tmp_path):
    rubric = fast_rubric(tmp_path)
    here = grade_batch([inbox], tmp_path / "here", jobs=2, rubric_path=rubric, progress=False)
    array = grade_batch([inbox], tmp_path / "array", rubric_path=rubric, progress=False, executor="slurm",
                        slurm={"cluster": "local", "chunk": 2})
    assert here.graded == array.graded == 4
    assert same(results(tmp_path / "here"), results(tmp_path / "array"))
    assert (tmp_path / "here" / "grades.csv").read_text() == (tmp_path / "array" / "grades.csv").read_text()
    assert len(list((tmp_path / "array" / ".slurm").glob("*/*_result.pkl"))) == 2


def submitit_tasks() -> list:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"submitit" in open(f"/proc/{pid}/cmdline", "rb").read():
                pids.append(int(pid))
        except OSError:
            pass
    return pids


@pytest.mark.timeout(600)
def test_a_task_that_dies_leaves_infra_error_and_the_next_run_grades_only_that(reference_run, tmp_path):
    log, err = reference_run
    box = tmp_path / "inbox"
    box.mkdir()
    write_zip(box / "reference.zip", Files(code=REFERENCE.read_text(), log=log, err=err))
    hang = mutate("hang")
    write_zip(box / "hang.zip", Files(code=hang, log=refingerprint(log, hang), err=err))
    # One world per hand-in (the default check at 4 ranks only): the hang waits out its part's
    # clock and the retry's once, not once per public world size; two clocks (each at least
    # grader.limits.PART_FLOOR_SECONDS, at most 12 s) keep its task grading after the reference's
    # task is done, when the test kills it.
    rubric = fast_rubric(tmp_path, checks=[{"name": "default"}], public_world_sizes=[4],
                         timeouts={"part": 12, "process_group": 2, "world_start": 30})
    out = tmp_path / "out"
    summary = {}

    def run():
        summary["first"] = grade_batch([box], out, rubric_path=rubric, progress=False, executor="slurm",
                                       slurm={"cluster": "local", "chunk": 1})

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 300
    while not (out / "students" / "reference" / "grading.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    # Every task still running "fails" with its node: the hanging hand-in's for sure, and the
    # reference's too if it has not exited yet, whose result, written before, still stands.
    for pid in submitit_tasks():
        os.kill(pid, signal.SIGKILL)
    thread.join(timeout=300)
    first = results(out)
    assert first["reference"]["score"] == FULL
    assert first["hang"]["status"] == "infra_error" and first["hang"]["score"] is None
    assert "array task" in first["hang"]["message"]
    second = grade_batch([box], out, rubric_path=rubric, progress=False, executor="slurm",
                         slurm={"cluster": "local", "chunk": 1})
    assert (second.graded, second.cached) == (1, 1)
    hang_result = results(out)["hang"]
    assert hang_result["status"] == "graded" and hang_result["parts"]["tensor_parallel"]["status"] == "timeout"
