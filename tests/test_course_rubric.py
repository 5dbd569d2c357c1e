"""A course that changes the rubric keeps its safety net: an instructor's copy of the kit with other
points, a new hidden check, another default batch (in the rubric, the reference and the handout
alike) and another tolerance builds its release, and the kit's own tests pass in it, the
stock-course tests skipped and named.

The copies carry the marker `course`: `make test` leaves them out and says so, `make test-course`
runs them (the release of a copy with the optional parts off and of one with every part on, and the
suite in the second), and `.ci/run` runs both targets."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grader.instructor.config import reference_constants
from grader.parts import OPTIONAL_PART_IDS
from tests.corpus import ROOT, fitted, with_every_part

KIT = ("assignment_4", "grader", "slurm", "lab", "student", "tests", "docs", "README.md", "pyproject.toml")
# The kit's tests run in the changed copy, every optional part on: each optional part's own file
# (its mistakes graded and diagnosed at the copy's checks, the reference at every one, its refusals),
# the rubric, the release, the hand-back files and the feedback's hidden values. The corpus of
# tests/test_grader.py is left out: graded with every optional part on at every check it alone takes
# about 15 minutes on two cores (make test grades it under the stock course, and each optional
# part's file grades that part's mistakes here).
SUITE = ("tests/test_compare.py", "tests/test_megatron.py", "tests/test_vocab_parallel.py",
         "tests/test_transformer_block.py", "tests/test_sequence_parallel.py",
         "tests/test_end_to_end.py::test_importing_the_reference_has_no_side_effects",
         "tests/test_release.py::test_release_refuses_a_configuration_said_differently_and_names_file_and_value",
         "tests/test_release.py::test_the_release_ships_the_public_rubric_derived_from_the_graders",
         "tests/test_release.py::test_a_course_with_part_5_ships_it_and_check_grades_it",
         "tests/test_release.py::test_the_handout_states_the_rubrics_points_and_nothing_else_does",
         "tests/test_gradescope.py::test_a_submission_is_graded_into_results_json", "tests/test_gradebook.py",
         "tests/test_report.py::test_the_gradebook_writes_it_again_with_final_grades_and_late_days",
         # no hidden value of this course's in any file; the log check is given; a hang's words
         "tests/test_feedback.py::test_no_output_file_holds_a_hidden_value",
         "tests/test_feedback.py::test_a_hostile_print_keeps_its_words_at_public_checks_only",
         "tests/test_feedback.py::test_a_rank_that_skips_a_collective_is_named_with_the_collective_it_left_the_others_in",
         "tests/test_selfcheck.py::test_check_takes_the_log_it_is_given_whatever_its_name_and_says_so",
         "tests/test_selfcheck.py::test_an_f_left_out_fails_check_at_the_layers_backward")


def instructors_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "course"
    for name in KIT:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        else:
            shutil.copy2(source, copy / name)
    return copy


def customise(copy: Path, optional: bool = False) -> dict:
    """What a new instructor changes: Part 1 raised by 3 points, two hidden checks added (one of 3
    ranks, a world size the stock course has none of), the default batch doubled everywhere it is
    said, a looser tolerance; with `optional`, every optional part turned on as a bonus (each size
    a part splits fitted to its check's world sizes, as a refused rubric says). Returns the new default batch."""
    rubric_path = copy / "grader" / "rubric.yaml"
    rubric = yaml.safe_load(rubric_path.read_text())
    rubric["parts"]["baseline"]["rerun"] += 3
    added = f"wide-rows-{len(rubric['checks'])}"   # a name of its own, also in a course changed before
    rubric["checks"].append({"name": added, "hidden": True, "world_size": 2, "seed": 5,
                             "global_batch_size": 24, "input_dim": 9, "output_dim": 14, "accumulation_steps": 3})
    rubric["checks"].append({"name": f"three-ranks-{len(rubric['checks'])}", "hidden": True, "world_size": 3,
                             "seed": 6, "global_batch_size": 36, "input_dim": 11, "output_dim": 21,
                             "accumulation_steps": 3})   # a world size the stock course has none of
    # the sizes each optional part on splits fitted to the checks' world sizes, as a refused rubric says
    rubric = with_every_part(rubric) if optional else fitted(rubric)
    rubric["tolerance"] = {"rtol": 2e-4, "atol": 2e-5}
    reference = copy / "assignment_4" / "reference" / "assignment4.py"
    old = reference_constants(reference)["global_batch_size"]
    new = 2 * old
    for public in (c for c in rubric["checks"] if not c.get("hidden") and c.get("global_batch_size") == old):
        public["global_batch_size"] = new   # the default check, and its backward twin at the same sizes
    rubric_path.write_text(yaml.safe_dump(rubric, sort_keys=False))
    reference.write_text(reference.read_text().replace(f"global_batch_size = {old} ", f"global_batch_size = {new} ", 1))
    handout = copy / "assignment_4" / "README.md"
    text = handout.read_text()
    for said in ("[B, input_dim] = [{}, ", "never assume the numbers {}, "):
        assert said.format(old) in text, said
        text = text.replace(said.format(old), said.format(new))
    handout.write_text(text)
    return {"old": old, "new": new, "added": added}


def run(copy: Path, *args, timeout: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "A4_STOCK_RUBRIC", "PYTEST_ADDOPTS")}
    return subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)


def released(copy: Path, out: Path) -> dict:
    """The copy's skeleton made and its release built into `out`; returns the public rubric shipped."""
    made = run(copy, "-m", "grader", "skeleton", timeout=60)
    assert made.returncode == 0 and "written" in made.stdout, made.stderr
    built = run(copy, "-m", "grader", "release", "--out", str(out), timeout=120)
    assert built.returncode == 0, built.stderr
    return yaml.safe_load((out / "grader" / "rubric-public.yaml").read_text())


@pytest.mark.course
@pytest.mark.parametrize("optional", [False, True], ids=["optional-parts-off", "optional-parts-on"])
def test_a_changed_course_releases_its_points_sizes_and_the_optional_parts_it_turned_on_only(tmp_path, optional):
    copy = instructors_copy(tmp_path)
    batch = customise(copy, optional)
    public = released(copy, tmp_path / "release")
    assert public["parts"]["baseline"]["rerun"] == yaml.safe_load(
        (ROOT / "grader" / "rubric.yaml").read_text())["parts"]["baseline"]["rerun"] + 3
    assert {c["global_batch_size"] for c in public["checks"]} == {batch["new"]}
    assert batch["added"] not in (tmp_path / "release" / "grader" / "rubric-public.yaml").read_text()
    assert (set(OPTIONAL_PART_IDS) <= set(public["parts"])) == optional
    assert optional or not set(OPTIONAL_PART_IDS) & set(public["parts"]), public["parts"]
    shipped = (tmp_path / "release" / "assignment_4" / "assignment4.py").read_text()
    for made in ("class RowParallelLinear", "class VocabParallelEmbedding", "class ParallelSelfAttention"):
        assert (made in shipped) == optional, made


@pytest.mark.timeout(1800)   # the suite in the copy, every optional part graded at every check
@pytest.mark.torch
@pytest.mark.course   # the kit's suite again, in the copy: make test-course, not make test
def test_a_changed_rubric_and_configuration_keep_the_kits_tests_passing(tmp_path):
    """The suite (SUITE) in one changed copy, every optional part on: each optional part's mistakes
    graded at the changed checks, each part turned on alone from the course without the others (as
    their files do), the release and the hand-back. Two processes, as make test runs."""
    copy = instructors_copy(tmp_path)
    customise(copy, optional=True)
    released(copy, tmp_path / "release")
    suite = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", os.environ.get("TEST_PROCESSES", "2"),
                "--dist", "loadfile", "-m", "not slurm", *SUITE, timeout=1740)
    tail = suite.stdout[-6000:]
    assert suite.returncode == 0, tail + suite.stderr[-2000:]
    assert "stock-course tests (marker stock_rubric):" in tail and "skipped: grader/rubric.yaml is not the stock one" in tail
    assert " failed" not in tail and " passed" in tail


def test_a_changed_rubric_needs_the_stock_tests_changed_where_the_stock_is_required(tmp_path):
    """This repository's CI sets A4_STOCK_RUBRIC=required: a changed rubric stops the suite at once,
    saying what to update, rather than skipping the stock tests unseen."""
    copy = instructors_copy(tmp_path)
    customise(copy)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_compare.py"],
                          cwd=copy, env=dict(env, A4_STOCK_RUBRIC="required"), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "update STOCK_RUBRIC in tests/conftest.py" in done.stdout + done.stderr
