"""What a batch writes is bounded by the grader, not by the hand-in, and a refused `grade` writes
nothing: a real batch (real zips, real worlds in the sandbox) with a hand-in made to amplify its
output and a correct one with several MB of pathological logs; then refusals against its OUT."""

import time
from pathlib import Path

import pytest
import yaml

from grader import kit
from grader.batch.run import grade_batch
from grader.names import student_dir, students_dir
from grader.pipeline import record
from grader.rerun.executor import SandboxUnavailable
from grader.rubric import RubricError
from tests.corpus import REFERENCE, UTILS, Files, fast_rubric, refingerprint, skeleton, write_zip

pytestmark = pytest.mark.hostile   # make test-hostile runs these; make test leaves them out

LOGS = Path(__file__).parent / "data" / "logs"
MB = 1 << 20


def _correct(code: str, pathological: bool) -> Files:
    log = refingerprint((LOGS / "a4_reference.log").read_text(), code)
    err = (LOGS / "a4_reference.err").read_text()
    if pathological:   # the lines that once took hours: several MB on one line each
        log += "[srun] " * (4 * MB // 7) + "\n"
        err += "srun: " * (4 * MB // 6) + "\n" + "oom_kill " * (MB // 9) + "\n"
        err += "Traceback (most recent call last):\n" * (MB // 35)
    return Files(code=code, log=log, err=err)


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bounded")
    inbox = tmp / "inbox"
    inbox.mkdir()
    code = skeleton()
    amplifier = Files(code=code, log=refingerprint((LOGS / "a4_skeleton.log").read_text(), code),
                      err=(LOGS / "a4_skeleton.err").read_text(),
                      utils="# " + "y" * (19 * MB) + "\n" + UTILS.read_text())   # the diff's first line: 19 MB
    write_zip(inbox / "amplifier.zip", amplifier)
    write_zip(inbox / "alice.zip", _correct(REFERENCE.read_text(), pathological=True))
    rubric = fast_rubric(tmp, checks=[{"name": "default"}])
    out = tmp / "out"
    started = time.monotonic()
    summary = grade_batch([inbox], out, rubric_path=rubric, jobs=2, progress=False)
    return inbox, out, rubric, summary, time.monotonic() - started


@pytest.mark.timeout(600)
def test_a_30_kb_zip_with_a_19_mb_line_writes_less_than_1_mb(batch):
    inbox, out, _, summary, _ = batch
    assert (inbox / "amplifier.zip").stat().st_size < 100_000
    assert summary.statuses.get("graded") == 2, summary.statuses
    assert _size(student_dir(out, "amplifier")) < MB, {p.name: p.stat().st_size for p in (student_dir(out, "amplifier")).iterdir()}
    assert _size(out) < 2 * MB
    for name in ("grading.json", "results.json", "feedback.md", "feedback.html"):
        assert (student_dir(out, "amplifier") / name).stat().st_size <= kit.FILE_BYTES
    assert "modified_utils" in (student_dir(out, "amplifier") / "grading.json").read_text()
    assert kit.CUT in (student_dir(out, "amplifier") / "feedback.md").read_text()   # the diff line was clipped


@pytest.mark.timeout(600)
def test_a_correct_handin_with_several_mb_of_pathological_logs_is_graded_within_a_minute(batch):
    _, out, _, _, seconds = batch
    import json
    alice = json.loads((student_dir(out, "alice") / "grading.json").read_text())
    assert alice["status"] == "graded" and all(p["status"] == "passed" for p in alice["parts"].values())
    assert all(p["log"]["points"] == p["log_max"] for p in alice["parts"].values())
    assert seconds < 120, seconds   # the whole batch, the sandbox's start and the canary included


@pytest.mark.timeout(600)
def test_a_refused_grade_leaves_out_byte_for_byte_and_a_replaced_result_moves_once_the_new_one_is_written(
        batch, tmp_path):
    inbox, out, rubric, _, _ = batch
    newer = tmp_path / "newer"
    newer.mkdir()
    write_zip(newer / "alice.zip", _correct(REFERENCE.read_text() + "\n# tidied\n", pathological=False))
    write_zip(newer / "bob.zip", Files(code=REFERENCE.read_text()))
    (newer / "broken.zip").write_bytes(b"PK\x03\x04 not a zip")   # an unreadable one is written first
    before = _snapshot(out)
    with pytest.raises(SandboxUnavailable):   # the sandbox cannot be had for this executor
        grade_batch([newer], out, rubric_path=rubric, executor="torchrun", progress=False)
    assert _snapshot(out) == before
    bad = tmp_path / "bad-rubric.yaml"
    bad.write_text(yaml.safe_dump({**yaml.safe_load(Path(rubric).read_text()), "no_such_key": 1}))
    with pytest.raises(RubricError):
        grade_batch([newer], out, rubric_path=bad, progress=False)
    assert _snapshot(out) == before
    fresh = tmp_path / "fresh-out"
    with pytest.raises(SandboxUnavailable):
        grade_batch([newer], fresh, rubric_path=rubric, executor="torchrun", progress=False)
    assert not fresh.exists()

    earlier = {k: v for k, v in before.items() if k.startswith("students/alice/")}
    summary = grade_batch([newer / "alice.zip"], out, rubric_path=rubric, progress=False)
    assert summary.replaced and summary.statuses.get("graded", 0) >= 2
    aside = next((students_dir(out) / record.REPLACED).iterdir())
    assert {f"students/alice/{k}": v for k, v in _snapshot(aside).items()} == earlier
    assert [p.name for p in (students_dir(out) / record.REPLACED).iterdir()] == [aside.name]   # nothing staged left
    assert (student_dir(out, "alice") / "grading.json").read_bytes() != earlier["students/alice/grading.json"]
