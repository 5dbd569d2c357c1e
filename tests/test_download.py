"""From an LMS download to one hand-in per student: every shape a TA meets, zipped and unzipped,
and the hand-ins that must never be taken for a download. Intake only (find, unpack, ids): nothing
here re-runs code, except the batch at the end, whose hand-ins are all unreadable (no re-run)."""

import csv
import io
import json
import zipfile
from pathlib import Path

import pytest

from grader.intake.find import find_handins
from grader.intake.handin import HandinError, unpack
from grader.names import cell, inert
from grader.rubric import Files

pytestmark = pytest.mark.lms   # make test-lms runs these; make test leaves them out

CODE = "print('code')\n"
LOG = "[Job] id=77\n"


def make_zip(members: dict) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buffer.getvalue()


HANDIN = make_zip({"assignment4.py": CODE, "utils.py": "u = 1\n"})


def as_folder(root: Path, members: dict) -> Path:
    """The download unzipped, as a TA's unzip tool leaves it."""
    root.mkdir(parents=True)
    for name, data in members.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    return root


def both(tmp_path: Path, name: str, members: dict) -> list:
    """The download as the LMS gives it (a zip) and unzipped (a folder)."""
    zipped = tmp_path / f"{name}.zip"
    zipped.write_bytes(make_zip(members))
    return [zipped, as_folder(tmp_path / name, members)]


def rows(found) -> dict:
    """student -> (files of the hand-in once unpacked, lms, late, submitted_at)."""
    return {h.student: h for h in found.handins}


def code_of(handin, tmp_path: Path) -> str:
    unpacked = unpack(handin, tmp_path / "unpacked" / handin.student, Files())
    return unpacked.files["assignment"].read_text()


# --- every shape ---------------------------------------------------------------------------------

CANVAS = {
    "martineve_50001_99901_assignment4.py": "martin's code\n",          # loose files, one student
    "martineve_50001_99901_utils.py": "u = 1\n",
    "martineve_50001_99901_assignment4-77.log": LOG,                   # a job id, not a resubmission
    "jonesbob_LATE_23456_78901_assignment4-handin.zip": HANDIN,        # a zip, late
    "smithann_777_888_assignment4.py": "first upload\n",               # uploaded again: -1, then -2
    "smithann_777_888_assignment4-1.py": "second upload\n",
    "smithann_777_888_assignment4-2.py": "third upload\n",
}


@pytest.mark.parametrize("shape", ["zipped", "unzipped"])
def test_canvas_loose_files_zips_late_markers_and_resubmissions_give_one_hand_in_per_student(tmp_path, shape):
    path = both(tmp_path, "submissions", CANVAS)[shape == "unzipped"]
    found = find_handins([path])
    by = rows(found)
    assert sorted(by) == ["23456", "50001", "777"] and not found.strays and not found.errors
    assert all(h.lms == "canvas" for h in by.values())
    assert by["23456"].late and not by["50001"].late
    assert sorted(by["50001"].files) == ["assignment4-77.log", "assignment4.py", "utils.py"]
    assert code_of(by["50001"], tmp_path) == "martin's code\n"
    assert sorted(by["777"].files) == ["assignment4.py"] and code_of(by["777"], tmp_path) == "third upload\n"
    assert code_of(by["23456"], tmp_path) == CODE
    assert by["50001"].upload == "martineve_50001_99901" and by["23456"].upload == "jonesbob_LATE_23456_78901"


MOODLE_FOLDERS = {
    "Jane Doe_12345_assignsubmission_file_/handin.zip": HANDIN,
    "Bob O'Neil-Roe_23456_assignsubmission_file_/assignment4.py": "bob's code\n",
    "Bob O'Neil-Roe_23456_assignsubmission_file_/utils.py": "u = 1\n",
    "Bob O'Neil-Roe_23456_assignsubmission_onlinetext_/onlinetext.html": "<p>see the files</p>",
    "Participant_34567_assignsubmission_file_/a4/assignment4.py": "blind code\n",
}


@pytest.mark.parametrize("shape", ["zipped", "unzipped"])
def test_moodle_folders_with_zips_loose_files_online_text_and_blind_marking(tmp_path, shape):
    path = both(tmp_path, "Assignment 4-12-download", MOODLE_FOLDERS)[shape == "unzipped"]
    found = find_handins([path])
    by = rows(found)
    assert sorted(by) == ["12345", "23456", "34567"] and not found.strays and not found.errors
    assert code_of(by["12345"], tmp_path) == CODE
    assert code_of(by["23456"], tmp_path) == "bob's code\n" and "onlinetext.html" in by["23456"].files
    assert code_of(by["34567"], tmp_path) == "blind code\n"
    assert by["23456"].upload == "Bob O'Neil-Roe_23456_assignsubmission_file_"


def test_moodle_flat_files_and_a_student_downloaded_alone(tmp_path):
    flat = {"Jane Doe_12345_assignsubmission_file_handin.zip": HANDIN,
            "Bob Roe_23456_assignsubmission_file_assignment4.py": "bob's code\n",
            "Bob Roe_23456_assignsubmission_file_utils.py": "u = 1\n"}
    for path in both(tmp_path, "flat", flat):
        by = rows(find_handins([path]))
        assert sorted(by) == ["12345", "23456"] and code_of(by["23456"], tmp_path / f"u-{path.suffix}") == "bob's code\n"
    alone = tmp_path / "one.zip"
    alone.write_bytes(make_zip({"Jane Doe_12345_assignsubmission_file_/handin.zip": HANDIN}))
    assert sorted(rows(find_handins([alone]))) == ["12345"]


GRADESCOPE = {
    "assignment_4242_export/submission_metadata.yml":
        "submission_111:\n  :submitters:\n  - :name: Ann Lee\n    :sid: 's2400001'\n    :email: ann@uni.edu\n"
        "  - :name: Ben Ko\n    :sid: 's2400002'\n    :email: ben@uni.edu\n"
        "  :created_at: 2026-04-14 21:10:00.000000000 +02:00\n  :score: 0.0\n"
        "submission_222:\n  :submitters:\n  - :name: Cat Wu\n    :email: cat@uni.edu\n"
        "  :created_at: 2026-04-15 09:00:00.000000000 +02:00\n",
    "assignment_4242_export/submission_111/assignment4.py": "ann's code\n",
    "assignment_4242_export/submission_111/utils.py": "u = 1\n",
    "assignment_4242_export/submission_222/handin.zip": HANDIN,
}


@pytest.mark.parametrize("shape", ["zipped", "unzipped"])
def test_gradescope_export_ids_groups_and_times_from_its_metadata(tmp_path, shape):
    path = both(tmp_path, "export", GRADESCOPE)[shape == "unzipped"]
    by = rows(find_handins([path]))
    assert sorted(by) == ["cat@uni.edu", "s2400001"]
    assert by["s2400001"].also == ["s2400002"] and by["s2400001"].submitted_at.startswith("2026-04-14")
    assert code_of(by["s2400001"], tmp_path) == "ann's code\n" and code_of(by["cat@uni.edu"], tmp_path) == CODE


def test_blackboard_attempts_are_hand_ins_with_their_times(tmp_path):
    members = {"Assignment 4_jdoe_attempt_2026-04-14-23-10-00_assignment4.py": "first\n",
               "Assignment 4_jdoe_attempt_2026-04-14-23-10-00.txt": "Name: Jo Doe (jdoe)\n",
               "Assignment 4_jdoe_attempt_2026-04-16-08-00-00_assignment4.py": "second\n",
               "Assignment 4_jdoe_attempt_2026-04-16-08-00-00.txt": "Name: Jo Doe (jdoe)\n",
               "Assignment 4_amy_attempt_2026-04-14-20-00-00_handin.zip": HANDIN,
               "Assignment 4_amy_attempt_2026-04-14-20-00-00.txt": "Name: Amy (amy)\n"}
    for path in both(tmp_path, "gradebook", members):
        found = find_handins([path])
        attempts = sorted((h.student, h.submitted_at) for h in found.handins)
        assert attempts == [("amy", "2026-04-14T20:00:00"), ("jdoe", "2026-04-14T23:10:00"),
                            ("jdoe", "2026-04-16T08:00:00")]


def test_a_plain_folder_of_zips_zipped_or_not_and_a_one_student_download(tmp_path):
    for path in both(tmp_path, "inbox", {"alice.zip": HANDIN, "bob.zip": HANDIN}):
        assert sorted(rows(find_handins([path]))) == ["alice", "bob"]
    late = tmp_path / "late submissions.zip"     # Canvas's late-submissions zip of one student
    late.write_bytes(make_zip({"jonesbob_LATE_23456_78901_handin.zip": HANDIN}))
    by = rows(find_handins([late]))
    assert list(by) == ["23456"] and by["23456"].late
    one = tmp_path / "ann.zip"                    # one student's files, zipped with their folder
    one.write_bytes(make_zip({"a4/assignment4.py": CODE, "a4/utils.py": "u"}))
    assert list(rows(find_handins([one]))) == ["ann"]


def test_the_lms_can_be_named_and_what_fits_no_student_is_said_never_graded(tmp_path):
    members = dict(CANVAS, **{"index.html": "<html>", "readme.txt": "notes"})
    found = find_handins([both(tmp_path, "mixed", members)[0]], lms="canvas")
    assert sorted(rows(found)) == ["23456", "50001", "777"]
    assert sorted(s.name for s in found.strays) == ["mixed.zip › index.html", "mixed.zip › readme.txt"]
    assert all("not graded" in s.message for s in found.strays)
    assert found.shapes == [f"{tmp_path / 'mixed.zip'}: a Canvas download of 3 hand-in(s), 2 file(s) that fit no student"]


# --- a student's hand-in is never a download -----------------------------------------------------

def test_a_students_zip_of_zips_in_a_download_is_that_students_alone(tmp_path):
    friends = make_zip({"friend_11111_22222_handin.zip": HANDIN, "rival_33333_44444_handin.zip": HANDIN,
                        "Jane Doe_12345_assignsubmission_file_x.zip": HANDIN})
    download = tmp_path / "submissions.zip"
    download.write_bytes(make_zip({"mallory_66666_77777_handin.zip": friends,
                                   "rival_33333_44444_assignment4.py": CODE}))
    found = find_handins([download])
    assert sorted(rows(found)) == ["33333", "66666"]
    with pytest.raises(HandinError, match=r"submissions.zip › mallory_66666_77777_handin.zip: no assignment4.py, "
                                          r"and 3 zips in it"):
        unpack(rows(found)["66666"], tmp_path / "m", Files())


def test_a_zip_nested_1100_deep_is_refused_naming_the_file_without_recursion(tmp_path):
    data = HANDIN
    for _ in range(1100):
        data = make_zip({"inner.zip": data})
    download = tmp_path / "download"
    download.mkdir()
    (download / "deep_55555_66666_handin.zip").write_bytes(data)
    (download / "fine_11111_22222_handin.zip").write_bytes(HANDIN)
    by = rows(find_handins([download]))
    assert sorted(by) == ["11111", "55555"]
    with pytest.raises(HandinError, match=r"deep_55555_66666_handin.zip: no assignment4.py in the hand-in"):
        unpack(by["55555"], tmp_path / "d", Files())


def test_a_flood_of_members_is_one_refused_hand_in(tmp_path):
    flood = make_zip({f"m{i}.zip": HANDIN for i in range(3000)})
    download = tmp_path / "download.zip"
    download.write_bytes(make_zip({"flood_55555_66666_handin.zip": flood, "fine_11111_22222_handin.zip": HANDIN}))
    by = rows(find_handins([download]))
    assert sorted(by) == ["11111", "55555"]
    with pytest.raises(HandinError, match=r"flood_55555_66666_handin.zip: 3000 members, more than the 500 allowed"):
        unpack(by["55555"], tmp_path / "f", Files())


# --- names that are not inert ---------------------------------------------------------------------

def test_inert_names_for_markdown_and_csv():
    assert inert("evil\n# heading <script>x</script>") == r"evil \# heading \<script\>x\</script\>"
    assert inert("\x1b[31mred\x1b[0m") == r" \[31mred \[0m"
    assert [cell(v) for v in ("=HYPERLINK(\"x\")", "+1", "-1", "@sum", "\tx", "plain")] == \
        ["'=HYPERLINK(\"x\")", "'+1", "'-1", "'@sum", " x", "plain"]


@pytest.mark.timeout(120)
@pytest.mark.torch
def test_ids_named_like_outputs_and_hostile_names_give_one_inert_row_each(tmp_path, capsys):
    """Unreadable hand-ins only: the batch writes their rows without re-running anything."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    names = ["grades.csv.zip", "summary.md.zip", "students.zip", "=HYPERLINK(1).zip", "evil\n# x <b>.zip",
             "\x1b[31mred.zip", "-2+3.zip"]
    for name in names:
        (inbox / name).write_bytes(b"PK\x03\x04 broken")
    out = tmp_path / "out"
    out.mkdir()
    (out / "grades.csv").write_text("stale\n")
    from grader.batch.run import grade_batch  # it needs torch: the torch-free runs leave this test out
    summary = grade_batch([inbox], out, progress=False)
    assert summary.statuses == {"invalid": len(names)}
    table = list(csv.reader((out / "grades.csv").open()))
    assert len(table) == len(names) + 1 and table[0][0] == "student"
    assert all(not c.startswith(("=", "+", "-", "@")) and "\x1b" not in c and "\n" not in c
               for row in table[1:] for c in row)
    ids = sorted(row[0] for row in table[1:])
    assert {"grades.csv", "summary.md", "students"} <= set(ids)
    assert all((out / "students" / i / "grading.json").is_file() for i in ids)
    text = (out / "summary.md").read_text()
    assert "\x1b" not in text and "\n# x" not in text and "<b>" not in text
    assert json.loads((out / "students" / "grades.csv" / "grading.json").read_text())["source"] == "grades.csv.zip"


@pytest.mark.torch
def test_the_console_and_summary_say_what_fits_no_student(tmp_path, capsys):
    from grader.cli import main
    download = tmp_path / "submissions"
    as_folder(download, {"broken_11111_22222_handin.zip": b"PK\x03\x04 broken", "\x1b[2Jnote.txt": "hi"})
    out = tmp_path / "out"
    assert main(["grade", str(download), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr()
    assert f"read {download}: a Canvas download of 1 hand-in(s), 1 file(s) that fit no student" in printed.out
    assert "not graded, fits no student" in printed.err and "\x1b" not in printed.err
    look = (out / "summary.md").read_text().split("## For a person to look at")[1]
    assert "not graded, fits no student" in look and "note.txt" in look and "\x1b" not in look
    assert [r["student"] for r in csv.DictReader((out / "grades.csv").open())] == ["11111"]
    late = as_folder(tmp_path / "late", {"broken_22222_33333_handin.zip": b"PK\x03\x04 broken"})
    assert main(["grade", str(late), "--out", str(out), "--quiet"]) == 0     # a later run into the same OUT
    look = (out / "summary.md").read_text().split("## For a person to look at")[1]
    assert "note.txt" in look and len(json.loads((out / "strays.json").read_text())) == 1


@pytest.mark.timeout(600)
@pytest.mark.torch
def test_a_canvas_download_is_graded_one_row_per_student_and_its_feedback_goes_back(tmp_path, capsys):
    """The issue's download, graded for real: a student of loose files, a late zip, a stray page."""
    from grader.cli import main
    from tests.corpus import REFERENCE, UTILS, Files as HandinFiles, fast_rubric, skeleton, zip_bytes
    download = tmp_path / "submissions"
    as_folder(download, {"martineve_50001_99901_assignment4.py": REFERENCE.read_text(),
                         "martineve_50001_99901_utils.py": UTILS.read_text(),
                         "jonesbob_LATE_23456_78901_assignment4-handin.zip": zip_bytes(HandinFiles(code=skeleton())),
                         "index.html": "<html>"})
    rubric = fast_rubric(tmp_path, checks=[{"name": "default"}])
    out = tmp_path / "out"
    assert main(["grade", str(download), "--out", str(out), "--rubric", str(rubric), "--quiet"]) == 0
    table = {r["student"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert sorted(table) == ["23456", "50001"]
    assert table["50001"]["status"] == "graded" and float(table["50001"]["score"]) > 0
    assert table["23456"]["score"] == "0"
    assert json.loads((out / "students" / "23456" / "download.json").read_text())["late"] is True
    policy = tmp_path / "policy.yaml"
    policy.write_text("deadline: 2026-04-14T23:59:00+02:00\nlate_penalty_per_day: 10\n")
    capsys.readouterr()
    assert main(["gradebook", str(out), "--policy", str(policy), "--feedback"]) == 2   # no times: no upload
    assert "--allow-no-time" in capsys.readouterr().err and not (out / "feedback-upload").exists()
    assert main(["gradebook", str(out), "--policy", str(policy), "--feedback", "--allow-no-time"]) == 0
    printed = capsys.readouterr().out
    assert "2 student(s) have no submission time" in printed and "23456: no_time;lms_late" in printed
    with zipfile.ZipFile(out / "feedback-upload" / "canvas-feedback.zip") as z:
        assert sorted(z.namelist()) == ["jonesbob_LATE_23456_78901_assignment4-feedback.md",
                                        "martineve_50001_99901_assignment4-feedback.md"]


def test_a_damaged_file_in_a_download_is_that_students_refusal_naming_it(tmp_path):
    data = bytearray(make_zip({"ann_11111_22222_assignment4.py": "x" * 100, "bob_33333_44444_handin.zip": HANDIN}))
    at = data.find(b"x" * 100)
    data[at] = ord("y")    # the CRC no longer matches: reading the member fails
    download = tmp_path / "submissions.zip"
    download.write_bytes(bytes(data))
    found = find_handins([download])
    assert [h.student for h in found.handins] == ["33333"]
    assert [(u.student, u.message.split(": ")[0]) for u in found.unreadable] == [
        ("11111", "submissions.zip › ann_11111_22222_assignment4.py")]


def test_a_zipped_folder_of_unpacked_hand_ins_is_read_as_one_hand_in_each(tmp_path):
    zipped = tmp_path / "unpacked.zip"
    zipped.write_bytes(make_zip({"alice/assignment4.py": "a\n", "bob/a4/assignment4.py": "b\n", "notes.txt": "x"}))
    found = find_handins([zipped])
    assert sorted(rows(found)) == ["alice", "bob"] and code_of(rows(found)["bob"], tmp_path) == "b\n"
    assert [s.name for s in found.strays] == ["unpacked.zip › notes.txt"]


def test_an_lms_attempts_are_ordered_by_their_times_and_anything_else_is_a_duplicate():
    from grader.intake.download import latest_attempt
    board = [{"lms": "blackboard", "submitted_at": "2026-04-14T20:00:00"},
             {"lms": "blackboard", "submitted_at": "2026-04-16T08:00:00"}]
    assert latest_attempt(board) == 1 and latest_attempt(board[::-1]) == 0
    assert latest_attempt([board[0], dict(board[0])]) is None                        # the same time: no order
    assert latest_attempt([board[0], {"lms": "", "submitted_at": ""}]) is None        # a plain zip beside it
    assert latest_attempt([board[0], {"lms": "canvas", "submitted_at": "2026-04-16T08:00:00"}]) is None
    assert latest_attempt([board[0], {"lms": "blackboard", "submitted_at": "2026-04-16T08:00:00+02:00"}]) is None
    assert latest_attempt(board[:1]) is None


def test_a_source_inside_a_zip_names_the_zips_edge_once():
    from grader.names import inside, innermost
    assert inside("export.zip", "export/submission_11001") == "export.zip › export/submission_11001"
    assert innermost(inside(inside("bulk.zip", "a/b.zip"), "x/y.py")) == "x/y.py"
    assert innermost(inside("bulk.zip", "evil › alice_1_2_h.zip")) == "evil > alice_1_2_h.zip"   # never a false edge
    assert innermost("alice.zip") == "alice.zip"


def test_a_canvas_upload_numbered_past_any_count_sorts_without_a_failure():
    """Canvas keeps an upload's own name: "assignment4-<5000 digits>.py" is no resubmission count
    Python can read (4300 digits at most); it sorts as a file of its own, never stopping intake."""
    from grader.intake.download import _resubmission
    assert _resubmission("mallory_3_9_assignment4-" + "1" * 5000 + ".py")[0] == 0
    assert _resubmission("mallory_3_9_assignment4-2.py")[0] == 2
