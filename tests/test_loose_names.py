"""A hand-in of loose files (an LMS download's) whose names no file can have once written (one name
both a file and a folder, `notes` and `notes/x.txt`; a name over 255 bytes) is that student's
invalid hand-in, its message naming the file: never a grader error, and the batch goes on."""

import csv
import io
import json
import zipfile

import pytest

from grader.cli import main
from grader.intake.find import find_handins
from grader.intake.handin import HandinError, unpack
from grader.rubric import Files
from tests.corpus import REFERENCE, UTILS

pytestmark = pytest.mark.lms
F = "_assignsubmission_file_"
LONG = "L" * 300 + ".txt"


def _download(tmp_path):
    members = {}
    for who in ("Mal One_1002", "Mal Two_1003"):
        members |= {f"{who}{F}/assignment4.py": REFERENCE.read_text(), f"{who}{F}/utils.py": UTILS.read_text()}
    members |= {f"Mal One_1002{F}/notes": "a file\n", f"Mal One_1002{F}/notes/x.txt": "and a folder\n",
                f"Mal Two_1003{F}/{LONG}": "long name\n"}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    path = tmp_path / "moodle.zip"
    path.write_bytes(buffer.getvalue())
    return path


def test_a_name_no_file_can_have_is_the_hand_ins_refusal_naming_it(tmp_path):
    found = {h.student: h for h in find_handins([_download(tmp_path)]).handins}
    clash = r"› Mal One_1002_assignsubmission_file_: notes/x.txt cannot be written \(File exists; a file and a folder"
    with pytest.raises(HandinError, match=clash):
        unpack(found["1002"], tmp_path / "a", Files())
    with pytest.raises(HandinError, match=rf"{LONG} cannot be written \(File name too long"):
        unpack(found["1003"], tmp_path / "b", Files())


def test_the_batch_grades_them_invalid_not_as_a_grader_error(tmp_path):
    out = tmp_path / "out"
    assert main(["grade", str(_download(tmp_path)), "--out", str(out), "--jobs", "1", "--quiet"]) == 0
    table = {r["student"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert {s: r["status"] for s, r in table.items()} == {"1002": "invalid", "1003": "invalid"}
    said = json.loads((out / "students" / "1002" / "grading.json").read_text())
    assert "notes/x.txt cannot be written" in said["message"] and not said.get("grader_error")
