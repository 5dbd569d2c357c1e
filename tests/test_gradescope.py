"""Gradescope: grading a submission folder into results/results.json, and the autograder bundle,
unpacked on its own and run as Gradescope runs it."""

import json
import os
import stat
import subprocess
import sys
import zipfile

import pytest

from grader.gradescope.run import grade_submission
from grader import kit
from grader.gradescope.bundle import build_bundle
from tests.corpus import FULL, REFERENCE, UTILS, fast_rubric, refingerprint


@pytest.fixture
def submission(reference_run, tmp_path):
    folder = tmp_path / "submission"
    folder.mkdir()
    log, err = reference_run
    (folder / "assignment4.py").write_text(REFERENCE.read_text())
    (folder / "utils.py").write_text(UTILS.read_text())
    (folder / "assignment4-77.log").write_text(log)
    (folder / "assignment4-77.err").write_text(err)
    (tmp_path / "submission_metadata.json").write_text(json.dumps({"users": [{"name": "Ada", "sid": "s1234"}]}))
    return folder


@pytest.mark.timeout(300)
def test_a_submission_is_graded_into_results_json(submission, tmp_path):
    results = tmp_path / "results" / "results.json"
    grade_submission(submission, results, tmp_path / "submission_metadata.json",
                     fast_rubric(tmp_path, checks=[{"name": "default"}]))
    doc = json.loads(results.read_text())
    assert doc["score"] == FULL and doc["extra_data"]["student"] == "s1234"
    assert doc["extra_data"]["status"] == "graded" and len(doc["tests"]) == 8
    assert all(t["status"] == "passed" for t in doc["tests"])


@pytest.mark.timeout(120)
def test_an_empty_submission_still_gets_a_results_file(tmp_path):
    (tmp_path / "submission").mkdir()
    results = tmp_path / "results" / "results.json"
    grade_submission(tmp_path / "submission", results, tmp_path / "no-metadata.json")
    doc = json.loads(results.read_text())
    assert doc["extra_data"]["status"] == "invalid" and doc["score"] == 0
    assert "no assignment4.py" in doc["output"]
    assert doc["extra_data"]["student"] == "submission"


@pytest.mark.timeout(300)
def test_the_bundle_is_self_contained_and_holds_no_solution(submission, tmp_path):
    bundle = build_bundle(tmp_path / "autograder.zip")
    with zipfile.ZipFile(bundle) as z:
        names = z.namelist()
        assert {"setup.sh", "run_autograder", "grader/rubric.yaml", "assignment_4/utils.py"} <= set(names)
        assert not any("reference" in n for n in names)
        assert all("BEGIN SOLUTION" not in z.read(n).decode() for n in names if n.endswith(".py"))
        assert stat.S_IMODE(z.getinfo("run_autograder").external_attr >> 16) & 0o111
        # Folder copies of the rooms grading needs, byte for byte, and the graders' rubric.
        shipped = {n[len("grader/"):] for n in names if n.startswith("grader/")}
        rooms = {rel.as_posix() for rel in kit.grader_files(("rerun", "pipeline", "gradescope"))}
        assert shipped == rooms | {"rubric.yaml"}
        assert all(z.read(f"grader/{rel}") == (kit.GRADER / rel).read_bytes() for rel in rooms)
        assert z.read("setup.sh") == (kit.GRADER / "gradescope" / "setup.sh").read_bytes()
        assert b"torch==2.13.0" in z.read("requirements-gradescope.txt")
        source = tmp_path / "source"
        z.extractall(source)
    # As run_autograder does, from the bundle alone: nothing of this checkout importable.
    results = tmp_path / "results" / "results.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", "grader", "gradescope", "--submission", str(submission),
                           "--results", str(results), "--metadata", str(tmp_path / "submission_metadata.json")],
                          cwd=source, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(results.read_text())
    assert doc["score"] == FULL, doc["output"]


@pytest.mark.timeout(300)
def test_without_user_namespaces_the_rubric_and_grader_stay_unreadable_to_student_code(submission, tmp_path):
    """Gradescope's container: root, and bwrap fails as Docker's default profile makes it fail. The
    ranks then run under a user id of their own, and --protect leaves the grader's folder (the
    rubric, hidden checks included) and the submission readable to root only."""
    bundle = build_bundle(tmp_path / "autograder.zip", fast_rubric(tmp_path, checks=[{"name": "default"}]))
    source = tmp_path / "source"
    with zipfile.ZipFile(bundle) as z:
        z.extractall(source)
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    secrets = [source / "grader" / "rubric.yaml", source / "grader" / "kit.py", submission / "assignment4-77.log"]
    probe = ("    for path in %r:\n        try:\n            open(path).read()\n"
             "            raise RuntimeError('LEAK ' + path)\n        except OSError:\n            pass\n"
             % [str(p) for p in secrets])
    code = REFERENCE.read_text()
    anchor = "    device = get_device() if device is None else device\n"
    code = code.replace(anchor, anchor + probe, 1)
    (submission / "assignment4.py").write_text(code)
    log = submission / "assignment4-77.log"
    log.write_text(refingerprint(log.read_text(), code))   # a run of this very code
    results = tmp_path / "results" / "results.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"A4_BWRAP": str(fake)}
    proc = subprocess.run([sys.executable, "-m", "grader", "gradescope", "--submission", str(submission),
                           "--results", str(results), "--metadata", str(tmp_path / "submission_metadata.json"),
                           "--protect"], cwd=source, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(results.read_text())
    assert "LEAK" not in json.dumps(doc)
    assert doc["score"] == FULL, doc["output"]
    isolation = doc["extra_data"]["isolation"]
    assert isolation["sandbox"] == "none" and isolation["user"] == "an unprivileged user id of its own per world"
    assert "Operation not permitted" in " ".join(isolation["problems"])
    assert stat.S_IMODE(source.stat().st_mode) == 0o700
