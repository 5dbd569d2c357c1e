"""A hand-in's runs found by what their files hold (grader.evidence.runs), the best of several, and
the rubric's rule on where a log must come from."""

import json
import os
import re
import shutil

import pytest

from grader.batch.run import grade_batch
from grader.evidence.logfile import parse_log
from grader.evidence.runs import LogRule, choose, modified, rule_problems
from grader.rubric import load_rubric
from tests.corpus import DATA, FULL, REFERENCE, Files, fast_rubric, refingerprint, write_zip

pytestmark = pytest.mark.student   # make test-student runs these; make test leaves them out

LOGS = DATA / "logs"
SHA = "14615a42c430141688f305735e1bd68951738b89180124d86f52859d873f1d8f"   # the samples' code
HANDOUT = LogRule(min_world_size=4, min_nodes=4, slurm_job=True)


def folder(tmp_path, *names, rename=None):
    """A folder holding sample files (`rename`: sample -> the name it gets there)."""
    rename = rename or {}
    for name in names:
        shutil.copyfile(LOGS / name, tmp_path / rename.get(name, name))
    return sorted(tmp_path.iterdir())


@pytest.mark.parametrize("sample,nodes,slurm", [
    ("slurm-48213.out", 4, "the job script's own lines"),
    ("output_2_48240.out", 4, "Slurm job 48240"),
    ("handout_48311.stdout", 4, "Slurm's node ids on the init lines"),
    ("a4_cluster_4nodes.log", 4, "Slurm job 48187"),
    ("a4_reference.log", 1, ""),                       # slurm/run-local.sh: [Job] id=local-...
    ("a4_torchrun_redirected.txt", 1, ""),
    ("a4_separate_worlds.log", 4, "Slurm job 48190"),
])
def test_a_log_says_on_how_many_nodes_and_whether_in_a_slurm_job(sample, nodes, slurm):
    report = parse_log((LOGS / sample).read_bytes(), 4)
    assert (report.nodes, report.slurm) == (nodes, slurm)


def test_slurms_default_out_is_the_runs_stdout_and_its_stderr(tmp_path):
    choice = choose(folder(tmp_path, "slurm-48213.out"), SHA)
    assert choice.run.log.name == "slurm-48213.out" and choice.run.combined
    assert choice.note == ("the run's log: used slurm-48213.out as the run's log (it holds the run's lines); its "
                           "stderr is in the same file (slurm-48213.out), as Slurm writes both streams unless "
                           "--error names another file")


@pytest.mark.parametrize("names,log,err", [
    (["handout_48311.stdout", "handout_48311.stderr"], "handout_48311.stdout", "handout_48311.stderr"),
    (["output_2_48240.out", "output_2_48240.err"], "output_2_48240.out", "output_2_48240.err"),
    (["a4_torchrun_redirected.txt"], "a4_torchrun_redirected.txt", "a4_torchrun_redirected.txt"),
    (["a4_reference.log"], "a4_reference.log", None),     # a .log alone: its .err is missing
    (["a4_reference.log", "a4_reference.err"], "a4_reference.log", "a4_reference.err"),
])
def test_stdout_and_stderr_are_paired_by_name_job_id_or_content(tmp_path, names, log, err):
    run = choose(folder(tmp_path, *names), SHA).run
    assert (run.log.name, run.err.name if run.err else None) == (log, err)


def test_a_stderr_of_another_name_with_the_same_job_id_is_the_runs(tmp_path):
    files = folder(tmp_path, "output_2_48240.out", "output_2_48240.err",
                   rename={"output_2_48240.err": "errors_2_48240.err"})
    run = choose(files, SHA).run
    assert run.err.name == "errors_2_48240.err"
    assert "its stderr: errors_2_48240.err" in choose(files, SHA).note


def test_of_several_runs_the_complete_one_of_this_code_counts_then_the_newest(tmp_path):
    files = folder(tmp_path, "a4_time_limit.log", "a4_time_limit.err", "output_2_48240.out", "output_2_48240.err",
                   "a4_broken_parts.log", rename={"a4_time_limit.log": "output_3_48300.out",
                                                  "a4_time_limit.err": "output_3_48300.err",
                                                  "a4_broken_parts.log": "output_4_48400.out"})
    killed = tmp_path / "output_3_48300.out"   # this code too, killed at its time limit
    killed.write_text(re.sub(r"code sha256 \w+", f"code sha256 {SHA}", killed.read_text()))
    choice = choose(files, SHA)
    assert choice.run.log.name == "output_2_48240.out"   # complete, of this code; the later ones are not
    assert choice.note.startswith("the run's log: of 3 runs, used output_2_48240.out (a run of this "
                                  "assignment4.py (its code sha256), finished on 4 ranks); left aside: ")
    assert "output_4_48400.out (other code)" in choice.note and "output_3_48300.out (did not finish)" in choice.note
    # Two complete runs of the same code: the newer job; on disk, the later file.
    shutil.copyfile(LOGS / "output_2_48240.out", tmp_path / "output_9_48900.out")
    assert choose(sorted(tmp_path.iterdir()), SHA).run.log.name == "output_9_48900.out"
    os.utime(tmp_path / "output_9_48900.out", (1e9, 1e9))
    assert choose(sorted(tmp_path.iterdir()), SHA, newest=modified).run.log.name == "output_2_48240.out"


def test_a_run_the_rubric_asks_for_is_preferred(tmp_path):
    files = folder(tmp_path, "a4_reference.log", "a4_reference.err", "a4_cluster_4nodes.log",
                   rename={"a4_reference.log": "assignment4-99999.log", "a4_reference.err": "assignment4-99999.err"})
    assert choose(files, SHA).run.log.name == "assignment4-99999.log"           # newer, and 4 ranks is enough
    assert choose(files, SHA, HANDOUT).run.log.name == "a4_cluster_4nodes.log"  # 4 nodes in a Slurm job


def test_files_that_hold_no_run_are_not_a_run(tmp_path):
    (tmp_path / "notes.txt").write_text("My data parallel part was hard.\n")
    (tmp_path / "assignment4.py").write_text("print('[Distributed Init] Rank 0 Tensors match: True')\n")
    (tmp_path / "picture.out").write_bytes(b"\0\1[Distributed Init]\0")
    assert choose(sorted(tmp_path.iterdir()), SHA).run is None


@pytest.mark.parametrize("sample,problems", [
    ("a4_cluster_4nodes.log", []),
    ("slurm-48213.out", []),
    ("handout_48311.stdout", []),
    ("a4_reference.log", [
        ("log_nodes", "the run in the log ran on 1 node; the course asks for at least 4 nodes (sbatch "
                      "slurm/assignment4.sbatch runs on 4)"),
        ("log_not_slurm", "the run in the log is a local run (job id local-20261121-075144, slurm/run-local.sh); "
                          "the course counts only a run of the Slurm job on the cluster (sbatch "
                          "slurm/assignment4.sbatch)")]),
    ("a4_torchrun_redirected.txt", [
        ("log_nodes", "the run in the log ran on 1 node; the course asks for at least 4 nodes (sbatch "
                      "slurm/assignment4.sbatch runs on 4)"),
        ("log_not_slurm", "the run in the log is not a Slurm job (no Slurm job id and no Slurm node ids: torchrun's "
                          "output redirected by hand?); the course counts only a run of the Slurm job on the "
                          "cluster (sbatch slurm/assignment4.sbatch)")]),
    ("a4_reference_2ranks.log", [("log_world_size", "the run in the log had world size 2; the course asks for "
                                                    "at least 4 ranks")]),
])
def test_the_handouts_rule_on_where_a_log_comes_from(sample, problems):
    report = parse_log((LOGS / sample).read_bytes(), 4)
    got = rule_problems(report, HANDOUT)
    assert (got[:1] if sample == "a4_reference_2ranks.log" else got) == problems   # a local run besides
    assert rule_problems(report, LogRule()) == [p for p in problems if p[0] == "log_world_size"]


@pytest.mark.timeout(300)
def test_with_the_handouts_rule_a_local_run_earns_no_log_points_and_a_cluster_run_does(reference_run, tmp_path):
    ref = REFERENCE.read_text()
    log, err = reference_run
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    write_zip(inbox / "local.zip", Files(code=ref, log=log, err=err))
    write_zip(inbox / "cluster.zip", Files(code=ref, log=refingerprint((LOGS / "slurm-48213.out").read_text(), ref),
                                           err=None, log_name="slurm-48213.out"))
    rubric = fast_rubric(tmp_path, checks=[{"name": "default"}], log_min_nodes=4, log_slurm_job=True)
    grade_batch([inbox], tmp_path / "out", rubric_path=rubric, progress=False)
    local = json.loads((tmp_path / "out" / "students" / "local" / "grading.json").read_text())
    cluster = json.loads((tmp_path / "out" / "students" / "cluster" / "grading.json").read_text())
    assert cluster["score"] == FULL, cluster["notes"]
    logs = sum(p.log for p in load_rubric(rubric).parts.values())
    assert local["score"] == FULL - logs and {"log_nodes", "log_not_slurm"} <= set(local["flags"])
    assert any(n.startswith("the run in the log is a local run (job id local-") and
               n.endswith("no points for log evidence") for n in local["notes"]), local["notes"]
    feedback = (tmp_path / "out" / "students" / "local" / "feedback.md").read_text()
    assert f"All public re-run checks passed. **The log earned 0 of {logs:g} log points**" in feedback
