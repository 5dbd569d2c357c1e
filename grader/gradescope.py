"""Grading inside Gradescope's autograder container, and the zip that sets it up.

    python -m grader gradescope            # in the container: grade /autograder/submission
    python -m grader gradescope-bundle -o autograder.zip

Gradescope runs `setup.sh` once when the autograder is built and `run_autograder` for every
submission, with the student's files in /autograder/submission; the result must be written to
/autograder/results/results.json. It is written directly, always, even when grading failed.

The bundle holds the grader, the provided utils.py and the rubric, never the reference solution:
student code runs in the same container, and anything there could end up in its feedback.
"""

import json
import shutil
import traceback
import zipfile
from pathlib import Path

from grader import __version__
from grader.executor import make_executor
from grader.grade import grade_handin, mark_not_run, new_result
from grader.handin import Handin, folder_digest
from grader.report import atomic_write, gradescope_results
from grader.results import Status
from grader.rubric import load_rubric
from grader.sandbox import scratch_dir

ROOT = Path(__file__).resolve().parent.parent

SETUP_SH = """#!/usr/bin/env bash
# Runs once, when Gradescope builds the autograder image (Ubuntu).
set -euo pipefail
apt-get update -q
apt-get install -y -q --no-install-recommends python3 python3-pip python3-venv
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install -q --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
/autograder/venv/bin/pip install -q -r /autograder/source/requirements-gradescope.txt
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Runs for every submission.
cd /autograder/source
exec /autograder/venv/bin/python -m grader gradescope
"""

REQUIREMENTS = "numpy==2.4.6\nPyYAML==6.0.3\n"


def _student(metadata: Path) -> str:
    try:
        data = json.loads(metadata.read_text())
        user = (data.get("users") or [{}])[0]
        return str(user.get("sid") or user.get("email") or user.get("name") or "submission")
    except (OSError, ValueError, AttributeError, IndexError):
        return "submission"


def grade_submission(submission="/autograder/submission", results="/autograder/results/results.json",
                     metadata="/autograder/submission_metadata.json", rubric_path=None) -> dict:
    """Grade one Gradescope submission folder and write its results.json; return what was written."""
    submission, results = Path(submission), Path(results)
    rubric = load_rubric(rubric_path)
    handin = Handin(name=submission.name, student=_student(Path(metadata)), sha256="")
    result = new_result(handin, rubric)
    scratch = Path(scratch_dir("a4-gradescope-"))
    executor = None
    try:
        handin.folder = submission
        handin.sha256 = result.sha256 = folder_digest(submission)
        executor = make_executor("warm")
        result = grade_handin(handin, rubric, executor, scratch)
    except Exception as e:  # noqa: BLE001 - the result file is written whatever happens
        result.status, result.score = Status.ERROR, None
        result.message = f"grading failed: {type(e).__name__}: {e}"
        result.notes.append("grader traceback:\n```\n" + traceback.format_exc()[-3000:] + "```")
        mark_not_run(result, rubric, "not run: grading failed")
    finally:
        if executor is not None:
            executor.close()
        shutil.rmtree(scratch, ignore_errors=True)
    doc = gradescope_results(result.to_dict())
    atomic_write(results, json.dumps(doc, indent=1) + "\n")
    return doc


def build_bundle(out="autograder.zip", rubric_path=None) -> Path:
    """The autograder zip: setup.sh, run_autograder, the grader, utils.py and the rubric."""
    out = Path(out)
    rubric = Path(rubric_path) if rubric_path else ROOT / "grader" / "rubric.yaml"
    load_rubric(rubric)  # refuse to bundle a rubric that does not load
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in (("setup.sh", SETUP_SH), ("run_autograder", RUN_AUTOGRADER)):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16
            z.writestr(info, text)
        z.writestr("requirements-gradescope.txt", REQUIREMENTS)
        for path in sorted((ROOT / "grader").glob("*.py")):
            z.write(path, f"grader/{path.name}")
        z.write(rubric, "grader/rubric.yaml")
        z.write(ROOT / "assignment_4" / "utils.py", "assignment_4/utils.py")
        z.writestr("VERSION", f"a4 grader {__version__}\n")
    return out
