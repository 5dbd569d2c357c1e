"""Gradescope: grading a submission folder into results/results.json, and the autograder bundle,
unpacked on its own and run as Gradescope runs it."""

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from grader.gradescope.run import grade_submission
from grader import kit
from grader.gradescope.bundle import build_bundle
from grader.rubric import load_rubric
from tests.corpus import FULL, REFERENCE, UTILS, fast_rubric, refingerprint

pytestmark = pytest.mark.lms   # make test-lms runs these; make test leaves them out


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
                     fast_rubric(tmp_path, checks=[{"name": "default"}, {"name": "default-backward", "kind": "backward"}]))
    doc = json.loads(results.read_text())
    assert doc["score"] == FULL and doc["extra_data"]["student"] == "s1234"
    parts = load_rubric().part_ids   # a log test and a re-run test of each (a backward check for the
    # parts that run only there): no hidden check here
    assert doc["extra_data"]["status"] == "graded" and len(doc["tests"]) == 2 * len(parts)
    assert all(t["status"] == "passed" for t in doc["tests"])
    assert doc["extra_data"]["network"] == "closed: own network namespace, loopback only"


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
        rooms = {rel.as_posix() for rel in kit.grader_files(kit.HANDIN_ROOMS + ("gradescope",))}
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


@pytest.fixture
def autograder(submission, tmp_path):
    """Gradescope's /autograder as its container has it: a folder any user may pass through, with
    source/ (the bundle, unpacked), submission/, results/ and submission_metadata.json (here with
    the results of an earlier submission, hidden checks included, as after the due date)."""
    top = Path(tempfile.mkdtemp(prefix="a4-autograder-"))
    top.chmod(0o755)
    bundle = build_bundle(tmp_path / "autograder.zip", fast_rubric(tmp_path, checks=[{"name": "default"}]))
    with zipfile.ZipFile(bundle) as z:
        z.extractall(top / "source")
    shutil.copytree(submission, top / "submission")
    (top / "results").mkdir()
    (top / "submission_metadata.json").write_text(json.dumps(
        {"users": [{"name": "Ada", "sid": "s1234"}],
         "previous_submissions": [{"results": {"extra_data": {"hidden_checks": {"hidden check 1": "SECRET"}}}}]}))
    for path in [top, *top.rglob("*")]:    # as an unpacked zip and a copy leave them: readable to all
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield top
    shutil.rmtree(top)


def probe_snippet(paths: list, folders: list) -> str:
    """Code for the start of single_step: raise LEAK naming what of `paths` it could read or of
    `folders` it could list."""
    return ("    for path in %r:\n        try:\n            open(path).read()\n"
            "            raise RuntimeError('LEAK ' + path)\n        except OSError:\n            pass\n"
            "    for path in %r:\n        try:\n            os.listdir(path)\n"
            "            raise RuntimeError('LEAK ' + path)\n        except OSError:\n            pass\n"
            % ([str(p) for p in paths], [str(f) for f in folders]))


@pytest.mark.timeout(300)
def test_without_user_namespaces_the_rubric_metadata_and_results_stay_unreadable_to_student_code(autograder):
    """Gradescope's container: root, and bwrap fails as Docker's default profile makes it fail. The
    ranks then run under a user id of their own, and --protect leaves the grader's folder (the
    rubric, hidden checks included), the submission, submission_metadata.json and the results
    folder readable to root only; every result says what the network was."""
    source, submission, results = autograder / "source", autograder / "submission", autograder / "results"
    metadata = autograder / "submission_metadata.json"
    fake = autograder / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    secrets = [source / "grader" / "rubric.yaml", source / "grader" / "kit.py", submission / "assignment4-77.log",
               metadata]
    code = REFERENCE.read_text()
    anchor = "    device = get_device() if device is None else device\n"
    code = code.replace(anchor, anchor + "    import os\n" + probe_snippet(secrets, [results, source]), 1)
    (submission / "assignment4.py").write_text(code)
    log = submission / "assignment4-77.log"
    log.write_text(refingerprint(log.read_text(), code))   # a run of this very code
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"A4_BWRAP": str(fake)}
    proc = subprocess.run([sys.executable, "-m", "grader", "gradescope", "--submission", str(submission),
                           "--results", str(results / "results.json"), "--metadata", str(metadata), "--protect"],
                          cwd=source, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((results / "results.json").read_text())
    assert "LEAK" not in json.dumps(doc)
    assert doc["score"] == FULL, doc["output"]
    isolation = doc["extra_data"]["isolation"]
    assert isolation["sandbox"] == "none" and isolation["user"] == "an unprivileged user id of its own per world"
    assert "Operation not permitted" in " ".join(isolation["problems"])
    assert {p: stat.S_IMODE(p.stat().st_mode) for p in (source, submission, results, metadata)} == \
        {source: 0o700, submission: 0o700, results: 0o700, metadata: 0o600}
    # The network as it was: no namespace, so what this machine reaches, the ranks reached.
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
        reached = True
    except OSError:
        reached = False
    assert doc["extra_data"]["network"].startswith("OPEN: no network namespace" if reached else "closed: no network")


def test_unprotected_the_probe_reads_the_metadata_and_lists_the_results(autograder):
    """The probe above can fail: run as an unprivileged user in the same layout without --protect,
    it reads submission_metadata.json and lists the results folder."""
    code = "import os\n" + textwrap.dedent(probe_snippet([autograder / "submission_metadata.json"],
                                                         [autograder / "results"]))
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60)
    assert "LEAK " + str(autograder / "submission_metadata.json") in done.stderr


@pytest.mark.parametrize("user, expected", [
    ({"sid": "s1", "email": "a@b.c", "id": 7, "name": "A B"}, "s1"),
    ({"sid": "", "email": "a@b.c", "id": 7, "name": "A B"}, "a@b.c"),
    ({"sid": None, "email": "", "id": 7, "name": "A B"}, "7"),
])
def test_grading_and_the_gradebook_name_a_gradescope_submission_by_the_same_id(tmp_path, user, expected):
    from grader.gradescope.run import _student
    from grader.grades.sources import read_gradescope_metadata
    metadata = tmp_path / "submission_metadata.json"
    metadata.write_text(json.dumps({"created_at": "2026-04-14T23:00:00+02:00", "users": [user]}))
    assert _student(metadata) == expected
    assert read_gradescope_metadata(metadata)[0].students == (expected,)
