"""Reliability: a grader killed mid-batch loses nothing; where the sandbox cannot start, grade refuses
(and --sandbox off grades, saying so everywhere); a failure that passes when run again is flagged
flaky; rubric files layer."""

import csv
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from grader import kit
from grader.rerun.executor import WarmExecutor
from grader.intake.handin import Handin
from grader.pipeline.grade import grade_handin, judge_check
from grader.rerun.check import prepare_code
from grader.results import Status
from grader.rubric import load_rubric
from tests.corpus import FULL, FULL_CSV, REFERENCE, ROOT, Files, mutate, refingerprint, skeleton, write_zip
from tests.test_sandbox import leftover_processes

RESULT_FILES = ("grading.json", "results.json", "feedback.md", "feedback.html")   # grader.pipeline.record

pytestmark = pytest.mark.scale   # make test-scale runs these; make test leaves them out

FAST = {"checks": [{"name": "default"},
                   {"name": "two-ranks", "hidden": True, "world_size": 2, "seed": 1234,
                    "global_batch_size": 52, "input_dim": 13, "output_dim": 12, "accumulation_steps": 2}],
        "timeouts": {"part": 5, "process_group": 3, "world_start": 30}}


def grade_cmd(inbox, out, rubric, *extra):
    return [sys.executable, "-m", "grader", "grade", str(inbox), "--out", str(out), "--rubric", str(rubric),
            "--quiet", *extra]


@pytest.fixture(scope="module")
def inbox(reference_run, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reliability")
    box = tmp / "inbox"
    box.mkdir()
    log, err = reference_run
    codes = {"reference": REFERENCE.read_text(), "skeleton": skeleton(),
             **{name: mutate(name) for name in ("dp_summed", "acc_unscaled", "baseline_wrong_sign",
                                                "tp_own_shard_only", "baseline_no_step", "dp_no_allreduce")}}
    for name, code in codes.items():
        write_zip(box / f"{name}.zip", Files(code=code, log=refingerprint(log, code), err=err))
    rubric = tmp / "rubric.yaml"
    rubric.write_text(yaml.safe_dump(FAST))
    return box, rubric, tmp


def without_times(path: Path) -> dict:
    """grading.json less what differs between two gradings of the same bytes: the times, and the
    numbers of the data each world draws afresh (the verdicts are the same)."""
    data = json.loads(path.read_text())
    data.pop("graded_at"), data.pop("seconds")
    for part in data.get("parts", {}).values():
        for o in part.get("checks", []):
            o.pop("max_abs_diff", None), o.pop("weight_digest", None)
    return data


@pytest.mark.timeout(600)
def test_a_grader_killed_mid_batch_loses_nothing_and_grades_nothing_twice(inbox):
    box, rubric, tmp = inbox
    whole, cut = tmp / "whole", tmp / "cut"
    done = subprocess.run(grade_cmd(box, whole, rubric), cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr
    proc = subprocess.Popen(grade_cmd(box, cut, rubric), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 300
    while len(list((cut / "students").glob("*/grading.json"))) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = len(list((cut / "students").glob("*/grading.json")))
    assert 2 <= first < 8, "the batch was not cut in the middle"
    deadline = time.monotonic() + 10   # the zygotes see their pipe close and end their worlds
    while leftover_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftover_processes() == []
    # No half-written file where a reader looks: what the kill interrupted is a temporary file of
    # the atomic writer's, in a folder that has no grading.json yet (written last), beside the data key.
    unfinished = [p for p in cut.rglob(".*") if p.name != ".data-key"]
    assert all(kit.UNFINISHED.match(p.name) and not (p.parent / "grading.json").exists() for p in unfinished), unfinished
    for folder in (p.parent for p in (cut / "students").glob("*/grading.json")):   # a reused result is whole
        assert all((folder / f).exists() for f in RESULT_FILES), sorted(folder.iterdir())
    resumed = subprocess.run(grade_cmd(box, cut, rubric), cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stderr
    assert f"graded {8 - first} hand-in(s) and reused {first} earlier result(s)" in resumed.stdout
    assert [p.name for p in cut.rglob(".*")] == [".data-key"]   # the resumed run removed what the kill left
    assert (whole / "grades.csv").read_text() == (cut / "grades.csv").read_text()
    for path in (whole / "students").glob("*/grading.json"):
        assert without_times(path) == without_times(cut / "students" / path.parent.name / "grading.json"), path.parent.name
    rows = {row["student"]: row for row in csv.DictReader((cut / "grades.csv").open())}
    assert rows["reference"]["score"] == FULL_CSV and rows["skeleton"]["score"] == "0"


def failing_bwrap(folder: Path) -> Path:
    """A bwrap that fails as it does where user namespaces are refused (Docker's default profile)."""
    fake = folder / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    return fake


@pytest.mark.timeout(300)
def test_where_the_sandbox_cannot_start_grade_refuses_and_says_the_two_ways_out(inbox, tmp_path):
    box, rubric, _ = inbox
    env = dict(os.environ, A4_BWRAP=str(failing_bwrap(tmp_path)))
    proc = subprocess.run(grade_cmd(box / "reference.zip", tmp_path / "out", rubric), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=200)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Operation not permitted" in proc.stderr and "--sandbox off" in proc.stderr
    assert "python -m grader doctor" in proc.stderr and "Traceback" not in proc.stderr
    assert not list((tmp_path / "out" / "students").glob("*/grading.json"))   # nothing ran, nothing was written
    doctor = subprocess.run([sys.executable, "-m", "grader", "doctor"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=200)
    assert doctor.returncode == 1 and "Operation not permitted" in doctor.stdout


class FailsFirstWorld(WarmExecutor):
    """A real executor whose first world runs broken code: a failure the grading machine caused."""

    def __init__(self, broken_code: dict):
        super().__init__()
        self.broken_code = broken_code
        self.calls = 0

    def run_world(self, job):
        self.calls += 1
        if self.calls == 1:
            job = dataclasses.replace(job, code=self.broken_code)
        return super().run_world(job)


@pytest.mark.timeout(600)
def test_a_folder_a_killed_run_left_half_written_is_graded_again_and_swept(inbox, tmp_path):
    """What a SIGKILL between two of a result's files leaves (some files, the writer's temporary one,
    no grading.json): the next run grades that hand-in again and removes the temporary file; a
    whole result is reused."""
    box, rubric, _ = inbox
    out = tmp_path / "out"
    one = tmp_path / "one"
    one.mkdir()
    for name in ("reference.zip", "skeleton.zip"):
        (one / name).write_bytes((box / name).read_bytes())
    assert subprocess.run(grade_cmd(one, out, rubric), cwd=ROOT, capture_output=True, text=True, timeout=400).returncode == 0
    cut = next(p.parent for p in (out / "students").glob("*/grading.json") if "reference" in p.parent.name)
    (cut / "grading.json").unlink()
    (cut / ".feedback.html.k3x9_a0q").write_text("<html>half")
    again = subprocess.run(grade_cmd(one, out, rubric), cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert again.returncode == 0, again.stderr
    assert "graded 1 hand-in(s) and reused 1 earlier result(s)" in again.stdout, again.stdout
    assert sorted(p.name for p in cut.iterdir() if p.name.startswith(".")) == [] and (cut / "grading.json").exists()


@pytest.mark.timeout(300)
def test_a_failure_that_passes_when_run_again_is_flagged_flaky():
    rubric = load_rubric()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        broken = scratch / "broken.py"
        broken.write_text(mutate("dp_summed"))
        executor = FailsFirstWorld(prepare_code(broken))
        try:
            judged = judge_check(executor, prepare_code(REFERENCE), rubric.checks[0], rubric, scratch)
        finally:
            executor.close()
    assert judged["data_parallel"].status == Status.FAILED and judged["data_parallel"].flaky
    assert executor.calls == executor.worlds == 2
    assert all(judged[p].status == Status.PASSED and not judged[p].flaky
               for p in ("baseline", "grad_accumulation", "tensor_parallel"))


class Recorded(WarmExecutor):
    """A real executor that records the parts of each world it runs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked = []

    def run_world(self, job):
        self.asked.append(list(job.parts))
        return super().run_world(job)


@pytest.mark.timeout(300)
def test_a_part_that_hung_is_not_run_at_later_checks(tmp_path):
    """A hang in Part 4 at three checks (its ranks asleep): its first timeout is not run again (its
    ranks had the CPU and did not use it); at the later checks the part is not run at all (each
    would cost its clock), and its outcome says where it hung; the other parts run and pass at every check."""
    rubric_path = tmp_path / "rubric.yaml"
    rubric_path.write_text(yaml.safe_dump({"checks": [{"name": "default", "world_size": 2},
                                                      {"name": "again", "world_size": 2, "seed": 7},
                                                      {"name": "more", "world_size": 2, "seed": 8}],
                                           "public_world_sizes": [2],
                                           "timeouts": {"part": 1, "process_group": 1, "world_start": 30}}))
    rubric = load_rubric(rubric_path)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "assignment4.py").write_text(mutate("hang"))
    handin = Handin(name="hang", student="hang", sha256="", folder=tmp_path / "files")
    executor = Recorded("auto", rubric.limits)
    try:
        result = grade_handin(handin, rubric, executor, tmp_path)
    finally:
        executor.close()
    everything = list(rubric.part_ids)
    others = [p for p in everything if p != "tensor_parallel"]
    # ...and, once, Part 3 again in the world that scales what its collectives return (it passed)
    assert executor.asked == [everything, ["data_parallel"], others, others]
    checks = result.parts["tensor_parallel"].checks
    assert [(c.check, c.status, c.flaky) for c in checks] == [(name, Status.TIMEOUT, False)
                                                              for name in ("default", "again", "more")]
    assert "did not finish" in checks[0].message and "for a CPU" in checks[0].message, checks[0].message
    assert all(c.message.startswith("not run: this part hung at check 'default' (it ran past its clock there)")
               for c in checks[1:])
    assert all(o.status == Status.PASSED for p in ("baseline", "grad_accumulation", "data_parallel")
               for o in result.parts[p].checks)


def test_a_rubric_file_states_only_what_it_changes(tmp_path):
    path = tmp_path / "changes.yaml"
    path.write_text("timeouts: {part: 30}\nparts: {baseline: {log: 0}}\n")
    rubric, default = load_rubric(path), load_rubric()
    assert rubric.timeouts.part == 30 and rubric.timeouts.process_group == default.timeouts.process_group
    assert rubric.parts["baseline"].log == 0 and rubric.parts["baseline"].rerun == default.parts["baseline"].rerun
    assert [c.name for c in rubric.checks] == [c.name for c in default.checks]
    assert rubric.max_score == default.max_score - default.parts["baseline"].log


@pytest.mark.timeout(300)
def test_with_the_sandbox_off_grading_works_and_every_result_and_the_summary_say_so(inbox, tmp_path):
    """--sandbox off, the TA's choice where no sandbox can start: graded with the limits only; as
    root the ranks still run under a user id of their own."""
    box, rubric, _ = inbox
    env = dict(os.environ, A4_BWRAP=str(failing_bwrap(tmp_path)))
    proc = subprocess.run(grade_cmd(box / "reference.zip", tmp_path / "out", rubric, "--sandbox", "off"), cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads((tmp_path / "out" / "students" / "reference" / "grading.json").read_text())
    assert r["score"] == FULL, r["message"]
    assert r["isolation"]["mode"] == "off" and r["isolation"]["sandbox"] == "none"
    assert r["isolation"]["files"].startswith("NOT isolated") and r["isolation"]["network"] == "NOT isolated"
    if os.geteuid() == 0:
        assert r["isolation"]["user"] == "an unprivileged user id of its own per world"
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "sandbox" in summary.split("\n## ")[0].lower(), summary[:600]


POISON = (
    "import torch as _torch, utils as _utils\n"
    "_ = setattr(_torch.optim.SGD, 'step', lambda self, closure=None: None)\n"
    "_ = setattr(_utils, 'expected_weight', None)\n"
)


@pytest.mark.timeout(300)
def test_nothing_one_handin_does_reaches_the_next(reference_run, tmp_path):
    """The warm executor forks every world afresh: a hand-in that poisons torch (no optimizer step
    takes effect) and the trusted utils at import ruins only its own parts; the reference graded
    after it by the same executor is untouched."""
    log, err = reference_run
    box = tmp_path / "inbox"
    box.mkdir()
    poisoned = REFERENCE.read_text().replace("\nimport torch\n", "\nimport torch\n" + POISON, 1)
    write_zip(box / "a_poisoner.zip", Files(code=poisoned, log=refingerprint(log, poisoned), err=err))
    write_zip(box / "b_reference.zip", Files(code=REFERENCE.read_text(), log=log, err=err))
    rubric = tmp_path / "rubric.yaml"
    rubric.write_text(yaml.safe_dump({"checks": [{"name": "default"}], "timeouts": FAST["timeouts"]}))
    from grader.batch.run import grade_batch
    summary = grade_batch([box], tmp_path / "out", jobs=1, rubric_path=rubric, progress=False)
    assert summary.graded == 2 and summary.worlds >= 2 + 1   # canary, poisoner, reference: one executor
    poisoner = json.loads((tmp_path / "out" / "students" / "a_poisoner" / "grading.json").read_text())
    reference = json.loads((tmp_path / "out" / "students" / "b_reference" / "grading.json").read_text())
    assert {p["status"] for p in poisoner["parts"].values()} == {"failed"}
    assert all("the weight did not change" in p["message"] for p in poisoner["parts"].values())
    assert reference["score"] == FULL and reference["flags"] == []


class _Task:
    """A finished array task as submitit hands it back: its id, state and returned {student: status}."""

    def __init__(self, job_id, state, returned=None, error=None):
        self.job_id, self.state, self.returned, self.error = job_id, state, returned, error

    def result(self):
        if self.error:
            raise RuntimeError(self.error)
        return self.returned


def test_the_array_collection_reads_what_the_pipeline_wrote_and_records_what_no_task_did(tmp_path):
    """The Slurm collection trusts a task's returned {student: status}, or a grading.json of the
    hand-in's bytes whose identity changed while the task ran (a task that died after grading part of
    its chunk); every other hand-in gets an infra_error, written by the pipeline; grades.csv's view is
    read back from disk alone."""
    from grader.batch.array import _collect, _mark
    from grader.batch.outputs import load_views
    from grader.pipeline.record import write_handin
    from grader.results import mark_not_run, new_result

    rubric, out = load_rubric(None), tmp_path / "out"
    hands = {s: Handin(name=f"{s}.zip", student=s, sha256=s * 64) for s in ("vouched", "died_after", "none", "other")}

    def graded(h, sha256=None):
        r = new_result(h.student, h.name, sha256 or h.sha256, rubric)
        mark_not_run(r, rubric, "not run here")
        r.status, r.score = Status.GRADED, 0.0
        return write_handin(r, out, rubric)

    graded(hands["vouched"])
    graded(hands["other"], sha256="f" * 64)   # an earlier hand-in's result: not this one's bytes
    marks = {s: _mark(out, h) for s, h in hands.items()}
    graded(hands["died_after"])               # written by the task before it died
    tasks = [_Task("7_0", "COMPLETED", {"vouched": "graded"}), _Task("7_1", "FAILED", error="boom\nmore")]
    chunks = [[hands["vouched"]], [hands["died_after"], hands["none"], hands["other"]]]
    statuses = _collect(tasks, chunks, out, rubric, marks)
    assert statuses == {"vouched": "graded", "died_after": "graded", "none": "infra_error", "other": "infra_error"}
    views = {v["student"]: v for v in load_views(out)}
    assert {s: v["status"] for s, v in views.items()} == statuses
    assert views["none"]["message"] == "not graded: array task 7_1 ended failed: boom; grade it again"
    assert views["other"]["sha256"] == hands["other"].sha256
