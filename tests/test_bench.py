"""The benchmarks hold themselves to their corpus: the throughput benchmark prints no rate when a
hand-in's result is not what it must be, and the GPU check refuses cleanly where there is no GPU.
(Their figures are printed by `make bench` and `make gpu-check`, never asserted.)"""

import json
import subprocess
import sys

import pytest

from grader.rubric import load_rubric
from tests.corpus import FULL, MUTANTS, ROOT

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def bench():
    from benchmarks import grading_throughput
    return grading_throughput


def write_result(out, name, status="graded", score=None, parts=None, message=""):
    folder = out / "students" / name.removesuffix(".zip")
    folder.mkdir(parents=True)
    result = {"source": name, "status": status, "score": score, "message": message,
              "parts": {part: {"status": state} for part, state in (parts or {}).items()}}
    (folder / "grading.json").write_text(json.dumps(result))


def test_a_batch_as_the_corpus_says_has_nothing_wrong(bench, tmp_path):
    rubric = load_rubric()
    mutant = "dp_summed"
    kinds = {"a_reference.zip": "reference", "b_skeleton.zip": "skeleton", f"c_{mutant}.zip": mutant}
    write_result(tmp_path, "a_reference.zip", score=FULL, parts={p: "passed" for p in rubric.part_ids})
    write_result(tmp_path, "b_skeleton.zip", score=0, parts={p: "not_implemented" for p in rubric.part_ids})
    write_result(tmp_path, f"c_{mutant}.zip", score=65,
                 parts={p: "failed" if p == MUTANTS[mutant].part else "passed" for p in rubric.part_ids})
    assert bench.wrong_results(tmp_path, kinds, rubric) == []


@pytest.mark.parametrize("status, score, part_status, words", [
    ("infra_error", None, "not_run", "'status': 'infra_error (expected graded)'"),
    ("graded", FULL - 10, "passed", f"'score': '{FULL - 10} (expected {float(FULL)})'"),
    ("graded", FULL, "failed", "'failed (expected passed)'"),
])
def test_a_result_other_than_the_corpus_says_is_named(bench, tmp_path, status, score, part_status, words):
    rubric = load_rubric()
    write_result(tmp_path, "a_reference.zip", status=status, score=score,
                 parts={p: part_status for p in rubric.part_ids}, message="the machinery failed")
    wrong = bench.wrong_results(tmp_path, {"a_reference.zip": "reference", "b_reference.zip": "reference"}, rubric)
    assert len(wrong) == 2 and words in wrong[0] and wrong[0].endswith(": the machinery failed"), wrong
    assert wrong[1] == "b_reference.zip: no result"


def test_the_gpu_check_says_no_gpu_and_runs_nothing_without_one():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: make gpu-check runs for real here")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no GPU" in done.stderr and "nothing was run" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout.splitlines()[2].startswith("torch:") and "GPUs:     0" in done.stdout


def test_the_torchrun_baseline_always_has_a_reference(bench):
    kinds = {"s000_dp_summed.zip": "dp_summed", "s001_skeleton.zip": "skeleton", "s002_reference.zip": "reference"}
    assert bench.baseline_files(kinds, 1) == ["s002_reference.zip"]
    assert bench.baseline_files(kinds, 2) == ["s000_dp_summed.zip", "s002_reference.zip"]
    assert bench.baseline_files(kinds, 3) == sorted(kinds)
    assert bench.baseline_files(kinds, 0) == []


def test_each_configuration_gets_its_line_and_one_that_went_wrong_gets_no_figures(bench, capsys):
    measured = {"handins": 20, "rate": 30.0, "world": 0.07, "floor": 0.035, "jobs": "--jobs 1",
                "baseline": 1, "baseline_rate": 0.5}
    assert bench.print_configurations({"root, CPU build": measured,
                                       "ordinary user, CPU build": dict(measured, baseline=0, baseline_rate=None)}) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("root, CPU build") and "60.0x" in lines[1] and "2.00x" in lines[1]
    assert lines[2].startswith("ordinary user, CPU build") and "2.00x" in lines[2] and "60.0x" not in lines[2]
    assert bench.print_configurations({"root, CUDA build": {"wrong": ["a.zip: no result"]}}) == 1
    line = capsys.readouterr().out.splitlines()[1]
    assert line.startswith("root, CUDA build") and "NO FIGURES: a.zip: no result" in line
