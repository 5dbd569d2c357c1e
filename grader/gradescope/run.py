"""Grading inside Gradescope's autograder container.

    python -m grader gradescope            # in the container: grade /autograder/submission

(`python -m grader gradescope-bundle`, in grader.gradescope.bundle, builds the zip that sets it up.)

Gradescope runs `setup.sh` once when the autograder is built and `run_autograder` for every
submission, with the student's files in /autograder/submission; the result must be written to
/autograder/results/results.json. The pipeline writes it (grader.pipeline.record), always, even
when grading failed.

The bundle holds the grader, the provided utils.py and the rubric, never the reference solution:
student code runs in the same container, and anything there could end up in its feedback.
"""

import json
import os
import shutil
import socket
import traceback
from pathlib import Path

from grader import kit
from grader.intake.handin import Handin
from grader.intake.listing import folder_digest
from grader.names import gradescope_user
from grader.pipeline.grade import grade_handin
from grader.pipeline.record import gradescope_into, limited_into
from grader.rerun.executors import make_executor
from grader.rerun.sandbox.namespaces import scratch_dir
from grader.results import grading_crashed, new_result
from grader.rubric import load_rubric

PROBE_HOST = "pypi.org"   # a host any container that can install packages reaches


def _student(metadata: Path) -> str:
    try:
        data = json.loads(metadata.read_text())
        user = (data.get("users") or [{}])[0]
        return gradescope_user(user) or "submission"
    except (OSError, ValueError, AttributeError, IndexError):
        return "submission"


def protect(submission: Path, metadata: Path = None, results: Path = None) -> None:
    """Make the grader, its rubric (hidden checks included), the submission's own folder,
    submission_metadata.json (after the due date it holds the student's earlier results, hidden
    checks included) and the results folder unreadable to hand-in code. Gradescope's container runs
    everything as root, usually without user namespaces, so there is no bubblewrap sandbox; but
    ranks then run under a user id of their own (grader.rerun.sandbox.namespaces), and files only root may read
    need no namespace. Their code reaches them over the zygote's pipe, so they need none of these."""
    if os.geteuid() != 0:
        return
    own_root = kit.ROOT.name not in ("site-packages", "dist-packages")   # not pip-installed among others
    for folder in ([kit.ROOT] if own_root else []) + [*kit.FOLDERS, submission, results]:
        if folder is not None and Path(folder).is_dir():
            os.chmod(folder, 0o700)
    if metadata is not None and Path(metadata).is_file():
        os.chmod(metadata, 0o600)


def network_state(isolation: dict) -> str:
    """What hand-in code could reach: its own loopback when the sandbox had a network namespace;
    else what the grader itself reaches (the ranks share its network), probed for 3 s."""
    if isolation.get("network", "").startswith("own network namespace"):
        return f"closed: {isolation['network']}"
    try:
        socket.create_connection((PROBE_HOST, 443), timeout=3).close()
    except OSError:
        return f"closed: no network namespace, but this container does not reach {PROBE_HOST}"
    return (f"OPEN: no network namespace here, and this container reaches {PROBE_HOST}: hand-in code could "
            f"reach the internet (Gradescope's container offers no isolation of the network)")


def grade_submission(submission=kit.GRADESCOPE_SUBMISSION, results=kit.GRADESCOPE_RESULTS,
                     metadata=kit.GRADESCOPE_METADATA, rubric_path=None,
                     protect_files: bool = False) -> dict:
    """Grade one Gradescope submission folder and have the pipeline write its results.json; return
    what was written."""
    submission, results = Path(submission), Path(results)
    rubric = load_rubric(rubric_path)
    limited = limited_into(results, rubric, Path(metadata))
    if limited is not None:    # over the course's limit of graded submissions: said so, nothing run
        return limited
    handin = Handin(name=submission.name, student=_student(Path(metadata)), sha256="")
    result = new_result(handin.student, handin.name, handin.sha256, rubric)
    scratch = Path(scratch_dir("a4-gradescope-"))
    executor = None
    try:
        handin.folder = submission
        handin.sha256 = result.sha256 = folder_digest(submission)
        if protect_files:
            results.parent.mkdir(parents=True, exist_ok=True)
            protect(Path(submission), Path(metadata), results.parent)
        executor = make_executor("warm", "best")
        result = grade_handin(handin, rubric, executor, scratch)
    except Exception as e:  # noqa: BLE001 - the result file is written whatever happens
        grading_crashed(result, rubric, e, traceback.format_exc())
    finally:
        if executor is not None:
            executor.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return gradescope_into(results, rubric, result, network=network_state(result.isolation or {}))


def run(args) -> int:
    doc = grade_submission(args.submission, args.results, args.metadata, args.rubric, args.protect)
    print(f"wrote {args.results}: {doc['extra_data'].get('status', 'rate limited')}, "
          f"score {doc.get('score', 'none')}")
    return 0
