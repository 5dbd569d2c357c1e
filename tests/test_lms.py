"""Every LMS's way back: each import file against its LMS's column rules, the grade a student reads
in the feedback against the grade the import gives (late, overridden, extended), the refusal of a
batch the machine could not grade, no import file overwritten silently, and the submission times
from Canvas (a page saved from the browser, and its API through canvasapi against a loopback server
that answers as Canvas does). Every LMS is one record (grader.lmss): each record is held to what
every room asks of it, and a made-up one, registered here, goes from its download to its import.

The first tests write results as grading would (tests.test_gradebook's helpers) and need no re-run;
the last ones grade each LMS's download, zipped and not, for real."""

import csv
import io
import json
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from grader.cli import main
from grader.grades.commands import make_gradebook
from grader.grades.lms.sheet import LmsError
from tests.corpus import ROOT
from tests.test_gradebook import downloaded, out_with, policy_file, result

pytestmark = pytest.mark.lms   # make test-lms runs these; make test leaves them out

LATE = "2026-04-16T10:00:00+02:00"      # 2 started days after the tests' deadline: 20 % off
CANVAS = ('\ufeffStudent,ID,SIS User ID,SIS Login ID,Section,Assignment 4 (123456),Current Score\n'
          '    Points Possible,,,,,25.00,(read only)\n'
          '"Late, Ann",50001,s1,alate,A,,\n'
          '"Over, Otto",50002,s2,oover,A,,\n'
          '"Ext, Eve",50003,s3,eext,B,,\n'
          '"Student, Test",50009,,,A,,\n')
BLACKBOARD = ['Last Name', 'First Name', 'Username', 'Student ID', 'Last Access', 'Availability',
              'Total [Total Pts: up to 120 Score] |9001', 'Assignment 4 [Total Pts: 20 Score] |123456']
MOODLE = ('Identifier,"Full name","Email address",Status,Grade,"Maximum Grade","Grade can be changed",'
          '"Last modified (submission)","Last modified (grade)","Feedback comments"\n'
          '"Participant 1001","Ann Late",a@uni.example,"Submitted for grading",,50.00,Yes,-,-,\n'
          '"Participant 1002","Otto Over",o@uni.example,"Submitted for grading",,50.00,Yes,-,-,\n'
          '"Participant 1003","Eve Ext",e@uni.example,"Submitted for grading",,50.00,Yes,-,-,\n')
GRADESCOPE = ('First Name,Last Name,SID,Email,Sections,Total Score,Max Points,Status,Submission ID,Submission Time,'
              'Lateness (H:M:S),View Count,Submission Count,1: Part 1 (10.0 pts)\n'
              'Ann,Late,s1,a@uni.example,,,10.0,Graded,11,2026-04-16 10:00:00 +0200,34:01:00,1,1,\n'
              'Otto,Over,s2,o@uni.example,,,10.0,Graded,12,2026-04-14 20:00:00 +0200,00:00:00,1,1,\n'
              'Eve,Ext,,e@uni.example,,,10.0,Graded,13,2026-04-16 10:00:00 +0200,34:01:00,1,1,\n')


def bb_export(rows: list, tab: bool = False) -> bytes:
    """A Grade Center download: comma CSV in UTF-8 with its mark, or tab-delimited .xls in UTF-16."""
    buffer = io.StringIO()
    csv.writer(buffer, delimiter="\t" if tab else ",", quoting=csv.QUOTE_ALL, lineterminator="\r\n").writerows(
        [BLACKBOARD] + rows)
    return buffer.getvalue().encode("utf-16" if tab else "utf-8-sig")


def three(tmp_path: Path, ids: tuple, lms: str, **policy) -> tuple:
    """OUT with three students of `lms` (ids: late, overridden, extended) and the policy that makes them so."""
    late, over, ext = ids
    graded = [result(late), result(over, lost={"data_parallel": 15}), result(ext)]
    out = out_with(tmp_path, *graded)
    for key in ids:
        downloaded(out, key, lms=lms, upload=f"upload_{key}")
    override = {"student": over, "part": "data_parallel", "points": 35, "reason": "regrade: accepted",
                "sha256": graded[1].sha256}
    times = [(late, LATE, ""), (over, "2026-04-14T20:00:00+02:00", ""), (ext, LATE, "")]
    path = policy_file(tmp_path, times, overrides=[override], extensions={ext: "2026-04-18T23:59:00+02:00"}, **policy)
    return out, path


def feedback_of(out: Path, lms: str) -> dict:
    with zipfile.ZipFile(out / "feedback-upload" / f"{lms}-feedback.zip") as z:
        return {name: z.read(name).decode() for name in z.namelist()}


def headline(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("## Grade"))


# --- each LMS's import, and the grade its feedback says ----------------------------------------------

def test_canvas_import_keeps_its_columns_and_the_feedback_says_the_imported_grade(tmp_path, capsys):
    out, policy = three(tmp_path, ("50001", "50002", "50003"), "canvas")
    (tmp_path / "export.csv").write_text(CANVAS, encoding="utf-8")
    assert main(["gradebook", str(out), "--policy", str(policy), "--lms", f"canvas:{tmp_path / 'export.csv'}",
                 "--feedback", "-o", str(tmp_path / "final.csv")]) == 0
    raw = (tmp_path / "final-canvas-import.csv").read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf")                                   # the export's byte-order mark, kept
    rows = list(csv.reader(io.StringIO(raw.decode("utf-8-sig"))))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Assignment 4 (123456)"]
    assert rows[1][0].strip() == "Points Possible" and rows[1][-1] == "25.00"
    cells = {r[1]: r[-1] for r in rows[2:]}
    assert cells == {"50001": "20.00", "50002": "25.00", "50003": "25.00"}    # test student left out
    sent = feedback_of(out, "canvas")
    late = sent["upload_50001_assignment4-feedback.md"]
    assert headline(late) == "## Grade: 20.00 / 25 (as Canvas shows it; 80 / 100 on the autograder's scale)"
    assert "2 started day(s) after the deadline 2026-04-14 23:59 +0200: 10 % of the earned score for each of 2 " \
           "day(s) | -20 |" in late and "**Autograde: 100 / 100**" in late and "**Score:" not in late
    over = sent["upload_50002_assignment4-feedback.md"]
    assert headline(over).startswith("## Grade: 25.00 / 25") and "| autograde (the re-run" in over
    assert "Part 3: data parallel: 35 points instead of 20 (regrade: accepted) | +15 |" in over
    ext = sent["upload_50003_assignment4-feedback.md"]
    assert headline(ext).startswith("## Grade: 25.00 / 25") and "-20" not in ext.split("---")[0]


def test_a_canvas_export_without_sis_columns_still_gives_the_five_canvas_imports_need(tmp_path):
    out = out_with(tmp_path, result("50001"))
    (tmp_path / "export.csv").write_text("Student,ID,Section,Assignment 4 (7)\n    Points Possible,,,10\n"
                                         "\"Late, Ann\",50001,A,\n")
    book, final, filled, _ = make_gradebook(out, policy_file(tmp_path), lms=[f"canvas:{tmp_path / 'export.csv'}"],
                                            allow_no_time=True)
    rows = list(csv.reader(io.StringIO(Path(filled[0].written).read_text(encoding="utf-8"))))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Assignment 4 (7)"]
    assert rows[2] == ["Late, Ann", "50001", "", "", "A", "10.00"]


def test_moodle_worksheet_keeps_every_column_and_its_comment_says_the_grade(tmp_path):
    out, policy = three(tmp_path, ("1001", "1002", "1003"), "moodle")
    (tmp_path / "worksheet.csv").write_text(MOODLE)
    _, _, filled, _ = make_gradebook(out, policy, lms=[f"moodle:{tmp_path / 'worksheet.csv'}"], feedback=True,
                                     allow_no_time=True)
    rows = list(csv.DictReader(io.StringIO(Path(filled[0].written).read_text())))
    assert list(rows[0]) == next(csv.reader(io.StringIO(MOODLE)))
    assert [(r["Identifier"], r["Grade"]) for r in rows] == [("Participant 1001", "40.00"),
                                                             ("Participant 1002", "50.00"),
                                                             ("Participant 1003", "50.00")]
    assert rows[0]["Feedback comments"].startswith("Grade: 40.00 / 50 (as Moodle shows it; 80 / 100 on the "
                                                   "autograder's scale). Autograde 100; handed in 2026-04-16 10:00")
    sent = feedback_of(out, "moodle")["upload_1001/assignment4-feedback.md"]
    assert headline(sent).startswith("## Grade: 40.00 / 50 (as Moodle shows it")


@pytest.mark.parametrize("tab", [False, True], ids=["csv", "xls-utf16"])
def test_blackboard_upload_is_keyed_by_username_with_the_columns_id_and_feedback_in_html(tmp_path, tab):
    out, policy = three(tmp_path, ("alate", "oover", "eext"), "blackboard")
    suffix = ".xls" if tab else ".csv"
    people = [["Late", "Ann", "alate", "0042", "2026-04-20 10:00:00", "Yes", "", ""],
              ["Over", "Otto", "oover", "0043", "", "Yes", "", ""],
              ["Ext <b>", "Eve", "eext", "0044", "", "Yes", "", ""],
              ["Gone", "Guy", "gguy", "0045", "", "No", "", ""]]
    (tmp_path / f"gc{suffix}").write_bytes(bb_export(people, tab))
    _, _, filled, _ = make_gradebook(out, policy, lms=[f"blackboard:{tmp_path / f'gc{suffix}'}"], feedback=True, allow_no_time=True,
                                     output=tmp_path / "final.csv")
    written = Path(filled[0].written)
    assert written.name == f"final-blackboard-import{suffix}"
    raw = written.read_bytes()
    text = raw.decode("utf-16") if tab else raw.decode("utf-8-sig")
    assert raw.startswith(b"\xff\xfe" if tab else b"\xef\xbb\xbf")
    rows = list(csv.reader(io.StringIO(text), delimiter="\t" if tab else ","))
    quoted = io.StringIO()   # every value quoted, as Blackboard asks of a comma file; CRLF lines
    csv.writer(quoted, delimiter="\t" if tab else ",", quoting=csv.QUOTE_ALL, lineterminator="\r\n").writerows(rows)
    assert text.lstrip("\ufeff") == quoted.getvalue()
    assert rows[0] == ["Last Name", "First Name", "Username", "Student ID",
                       "Assignment 4 [Total Pts: 20 Score] |123456",
                       "Grading Notes", "Notes Format", "Feedback to Learner", "Feedback Format"]
    by = {r[2]: r for r in rows[1:] if r}
    assert (by["alate"][3], by["alate"][4], by["oover"][4], by["eext"][4]) == ("0042", "16.00", "20.00", "20.00")
    assert by["gguy"][4] == "" and filled[0].not_in_export == []
    assert by["alate"][8] == "HTML" and by["alate"][7].startswith(
        "<p><strong>Grade: 16.00 / 20 (as Blackboard shows it; 80 / 100 on the autograder&#x27;s scale)</strong></p>")
    assert "Part 1: single-device baseline: 10 / 10, passed" in by["alate"][7]
    assert "regrade: accepted" in by["oover"][7] and by["eext"][0] == "Ext <b>"   # the LMS's own names, as they were
    assert "Part 3: data parallel: 35 points instead of 20 (regrade: accepted): +15" in by["oover"][7]


def test_blackboard_fills_no_calculated_column_nor_a_text_one(tmp_path):
    out = out_with(tmp_path, result("alate"))
    gc = tmp_path / "gc.csv"
    gc.write_text('"Username","Total [Total Pts: up to 100 Score] |1","Weighted Total [Total Pts: 100 Percentage] |3"\n'
                  '"alate","",""\n')
    with pytest.raises(LmsError, match="no grade columns in it; name the one to fill with --assignment"):
        make_gradebook(out, policy_file(tmp_path), lms=[f"blackboard:{gc}"], allow_no_time=True)
    gc.write_text('"Username","Notes [Total Pts: 0 Text] |2"\n"alate",""\n')
    with pytest.raises(LmsError, match="shows Text; a grade upload needs a Score or Percentage column"):
        make_gradebook(out, policy_file(tmp_path), lms=[f"blackboard:{gc}"], allow_no_time=True)
    assert not list(tmp_path.glob("*-import*"))


def test_each_lms_gets_one_sentence_of_what_to_do_with_each_file_as_the_tas_guide_says(tmp_path, capsys):
    """What gradebook prints beside each file it wrote is the guide's table (docs/tas.md), one
    sentence per LMS and file: Gradescope's grade file and feedback zip are never said to be imported
    or bulk-uploaded, and a student with no hand-in is said to be one."""
    from grader.lmss import LMSS
    table = {row.split("|")[1].strip().lower(): row for row in
             (ROOT / "docs" / "tas.md").read_text().splitlines() if row.startswith("| ") and "FINAL-" in row}
    for lms in LMSS.values():
        where = lms.grades_go.split(": ", 1)[1].split(" (")[0]
        assert where in table[lms.name] or lms.name == "gradescope" and "Gradescope imports no grade file" \
            in table[lms.name], lms.name
        assert not lms.feedback_goes or lms.name == "gradescope" or \
            lms.feedback_goes.split(": ", 1)[1].split(" (")[0].split(":")[0] in table[lms.name], lms.name
    out = out_with(tmp_path, result("s1"), result("s2"), result("e@uni.example"))
    (tmp_path / "grades.csv").write_text(GRADESCOPE)
    assert main(["gradebook", str(out), "--policy", str(policy_file(tmp_path)), "--allow-no-time", "--feedback",
                 "--lms", f"gradescope:{tmp_path / 'grades.csv'}"]) == 0
    printed = capsys.readouterr().out
    assert "Gradescope imports no grade file" in printed and "import it into the LMS" not in printed
    assert "bulk upload" not in printed and printed.count("Gradescope takes no feedback upload") <= 1


def test_gradescope_grade_export_is_filled_in_place_and_gives_the_times(tmp_path):
    out = out_with(tmp_path, result("s1"), result("s2"), result("e@uni.example"))
    (tmp_path / "grades.csv").write_text(GRADESCOPE)
    _, _, filled, _ = make_gradebook(out, policy_file(tmp_path), lms=[f"gradescope:{tmp_path / 'grades.csv'}"],
                                     allow_no_time=True)
    rows = list(csv.DictReader(io.StringIO(Path(filled[0].written).read_text())))
    assert list(rows[0]) == next(csv.reader(io.StringIO(GRADESCOPE)))
    # Ann 2 days late (the export's Submission Time); Eve matched by email.
    assert [(r["SID"], r["Email"], r["Total Score"]) for r in rows] == [
        ("s1", "a@uni.example", "8.00"), ("s2", "o@uni.example", "10.00"), ("", "e@uni.example", "8.00")]


def test_feedback_html_and_markdown_are_inert_whatever_a_message_holds(tmp_path):
    from grader.grades.book import Row
    from grader.grades.statement import as_html, markdown, statement
    row = Row(student="s1", autograde=90.0, final=90.0, changes=[["<script>alert(1)</script> | x", 0.0]])
    said = statement(row, 100.0, "blackboard", 20.0)
    page = as_html(said, ["Part 1: failed: ValueError <img src=x onerror=alert(1)>"])
    assert "<script>" not in page and "<img" not in page and "&lt;img src=x" in page
    assert "<script>" not in markdown(said) and r"\| x" in markdown(said)


# --- an LMS is one record: every room takes it from there, and a new one needs nothing else -----------

def test_every_registered_lms_is_accepted_read_stated_filled_and_in_the_guide():
    """Each record of grader.lmss.LMSS: the command line takes its name (`grade --lms`, `gradebook
    --lms NAME:FILE`), intake can read its download (a reader, and names or a marker to know it by),
    gradebook can fill its grade file and say its grade, its feedback has a way back, and docs/tas.md
    has its rows."""
    from grader import cli
    from grader.grades.book import Row
    from grader.grades.lms import imports
    from grader.grades.statement import statement
    from grader.lmss import LMSS, load
    guide = (ROOT / "docs" / "tas.md").read_text()
    rows = [row.split("|")[1].strip() for row in guide.splitlines() if row.startswith("| ")]
    assert f"`--lms {'|'.join(LMSS)}`" in guide
    for lms in LMSS.values():
        assert cli.build_parser().parse_args(["grade", "x", "--out", "o", "--lms", lms.name]).lms == lms.name
        assert imports.parse([f"{lms.name}:grades.csv"]) == [(lms.name, Path("grades.csv"))]
        assert callable(load(lms.reader)) and (lms.names or lms.marker), lms.name
        assert callable(load(lms.filler)) and (not lms.times or callable(load(lms.times))), lms.name
        said = statement(Row(student="s1", autograde=90.0, final=90.0), 100.0, lms.name, 20.0).headline()
        assert said == f"Grade: 18.00 / 20 ({lms.shown_as}; 90 / 100 on the autograder's scale)"
        assert bool(lms.feedback_goes) != bool(lms.feedback_column), lms.name   # files, or the import's column
        assert rows.count(lms.title) == 2, f"{lms.title}: a row in each of docs/tas.md's two tables"


def fill_quill(path: Path, book, feedback: dict = None, **_) -> tuple:
    """Quill's grade sheet, `Login,Points`: Points gets the final grade out of 10."""
    from grader.grades.lms.sheet import Filled, match_row, read_sheet
    from grader.grades.statement import cell
    sheet = read_sheet(path, "grade sheet")
    login, points = sheet.index("Login"), sheet.index("Points")
    filled, grades, seen, out = Filled("quill", "", "Points"), {r.student: r for r in book.rows}, set(), [sheet.rows[0]]
    for row in sheet.body():
        match = match_row(filled, [row[login].strip()], grades, seen, row[login])
        if match is not None:
            row[points], filled.points[match.student] = cell(match.final, book.max_score, 10.0), 10.0
            filled.filled += 1
        out.append(row)
    filled.not_in_export = [r.student for r in book.rows if r.student not in seen]
    return sheet.render(out), filled


def test_a_new_lms_is_one_record_from_its_download_to_its_import(tmp_path, monkeypatch, capsys):
    """docs/engine.md's recipe, as written: a record (here registered by the test) whose download is
    a file per uploaded file named `quill-LOGIN-NAME`, read by the generic reader, and a filler of its
    grade sheet. Intake recognises it, gradebook fills its sheet, the feedback upload says the grade
    the import gives, and the command line names it: nothing else was told of it."""
    from grader.intake.find import find_handins
    from grader.lmss import LMSS, Lms
    from grader.names import student_dir
    monkeypatch.setitem(LMSS, "quill", Lms(
        "quill", "Quill", "grader.intake.download:read_named", f"{__name__}:fill_quill", "MARKS.csv",
        "upload it in Quill: Marks > Upload", names=r"^quill-(?P<id>[a-z]+)-", rest=r"(?P<orig>.+)$",
        feedback_goes="upload it in Quill: Marks > Feedback"))
    download = tmp_path / "quill-download"
    download.mkdir()
    for name, text in {"quill-ann-assignment4.py": "# ann", "quill-ann-utils.py": "# utils", "quill-bob-assignment4.py":
                       "# bob", "index.html": "<html>"}.items():
        (download / name).write_text(text)
    from tests.test_cli import subcommands
    assert subcommands()[0]["grade"].parse_args([str(download), "--out", "o", "--lms", "quill"]).lms == "quill"
    found = find_handins([download])
    assert [h.intake() for h in find_handins([download], lms="quill").handins] == [h.intake() for h in found.handins]
    assert found.shapes == [f"{download}: a Quill download of 2 hand-in(s), 1 file(s) that fit no student"]
    assert [(h.student, h.lms, h.upload, sorted(h.files)) for h in found.handins] == [
        ("ann", "quill", "quill-ann-", ["assignment4.py", "utils.py"]), ("bob", "quill", "quill-bob-", ["assignment4.py"])]
    out = out_with(tmp_path, *(result(h.student, h.name, lost={"data_parallel": 15} if h.student == "bob" else None,
                                      digest=h.sha256) for h in found.handins))
    for h in found.handins:   # what grading writes beside each result (grader.batch.run)
        (student_dir(out, h.student) / "download.json").write_text(json.dumps(h.intake()))
    (tmp_path / "marks.csv").write_text("Login,Points\nann,\nbob,\ncid,\n")
    assert main(["gradebook", str(out), "--policy", str(policy_file(tmp_path)), "--allow-no-time", "--feedback",
                 "--lms", f"quill:{tmp_path / 'marks.csv'}", "-o", str(tmp_path / "final.csv")]) == 0
    written = (tmp_path / "final-quill-import.csv").read_bytes().decode()
    assert written == "Login,Points\r\nann,10.00\r\nbob,8.50\r\ncid,\r\n"
    printed = capsys.readouterr().out
    assert "upload it in Quill: Marks > Upload" in printed and "upload it in Quill: Marks > Feedback" in printed
    sent = feedback_of(out, "quill")
    assert headline(sent["quill-bob-/assignment4-feedback.md"]) == \
        "## Grade: 8.50 / 10 (as Quill shows it; 85 / 100 on the autograder's scale)"
    assert "quill:MARKS.csv" in " ".join(subcommands()[0]["gradebook"].format_help().split())


# --- a batch the machine could not grade, and earlier import files --------------------------------

def test_an_infra_error_batch_writes_no_lms_file_unless_told_and_says_why_in_one_line(tmp_path, capsys):
    broken = result("50002", status="infra_error")
    broken.message = ("not graded: the reference solution fails baseline at check 'default': the world could "
                      "not be started (" + "gloo said so at length; " * 12 + "); the grading machine cannot grade: "
                      "a world of the reference could not run; grade it again")
    out = out_with(tmp_path, result("50001"), broken)
    (tmp_path / "export.csv").write_text(CANVAS)
    command = ["gradebook", str(out), "--policy", str(policy_file(tmp_path)),
               "--lms", f"canvas:{tmp_path / 'export.csv'}", "--feedback", "--allow-no-time"]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no LMS file written: 1 of 2 hand-in(s) were not graded, through no fault of the " \
                                   "students: the reference solution fails baseline" in err
    assert "the grading machine cannot grade: a world of the reference could not run." in err   # whole, not cut
    assert "--allow-infra-error" in err
    assert not (out / "final.csv").exists() and not (out / "final-canvas-import.csv").exists()
    assert not (out / "feedback-upload").exists()
    assert main(command[:4]) == 1                       # the final gradebook alone: written, and said
    assert (out / "final.csv").exists() and "through no fault of the students" in capsys.readouterr().err
    assert main(command + ["--allow-infra-error"]) == 1
    cells = {r[1]: r[-1] for r in csv.reader(io.StringIO((out / "final-canvas-import.csv").read_text("utf-8-sig")))}
    assert (cells["50001"], cells["50002"]) == ("25.00", "")      # its cell left as it was
    assert "left as it was: Over, Otto (50002): no final grade yet (infra_error" in capsys.readouterr().out


def test_an_earlier_import_file_is_never_overwritten_silently(tmp_path, capsys):
    out = out_with(tmp_path, result("50001"))
    (tmp_path / "export.csv").write_text(CANVAS)
    command = ["gradebook", str(out), "--lms", f"canvas:{tmp_path / 'export.csv'}", "-o", str(tmp_path / "final.csv"),
               "--allow-no-time"]
    assert main(command + ["--policy", str(policy_file(tmp_path))]) == 0
    first = (tmp_path / "final-canvas-import.csv").read_bytes()
    assert main(command + ["--policy", str(policy_file(tmp_path))]) == 0          # the same grades: the same file
    assert sorted(p.name for p in tmp_path.glob("final-canvas-import*")) == ["final-canvas-import.csv"]
    capsys.readouterr()
    assert main(command + ["--policy", str(policy_file(tmp_path, [("50001", LATE, "")]))]) == 0
    kept = [p for p in tmp_path.glob("final-canvas-import.*.csv")]
    assert len(kept) == 1 and kept[0].read_bytes() == first
    assert f"kept the earlier file of that name as {kept[0]}" in capsys.readouterr().out
    assert b"20.00" in (tmp_path / "final-canvas-import.csv").read_bytes()
    assert main(command + ["-o", str(tmp_path / "again.csv"), "--policy", str(policy_file(tmp_path))]) == 0
    assert (tmp_path / "again-canvas-import.csv").read_bytes() == first       # named by -o


# --- Canvas's submission times ---------------------------------------------------------------------

SUBMISSIONS = [{"id": 1, "user_id": 50001, "submitted_at": "2026-04-16T08:00:00Z", "late": True, "attempt": 2,
                "workflow_state": "submitted"},
               {"id": 2, "user_id": 50002, "submitted_at": "2026-04-14T18:00:00Z", "late": False, "attempt": 1,
                "workflow_state": "graded"},
               {"id": 3, "user_id": 50003, "submitted_at": None, "workflow_state": "unsubmitted"}]


class FakeCanvas(BaseHTTPRequestHandler):
    """Canvas's REST API as far as the times need it: the course, the assignment, and its submissions
    one per page, each page linking the next with a Link header; a bearer token or 401."""
    token = "t0ken"
    seen = []

    def do_GET(self):
        url = urlparse(self.path)
        FakeCanvas.seen.append(self.path)
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            return self._send(401, {"errors": [{"message": "Invalid access token."}]},
                              {"WWW-Authenticate": 'Bearer realm="canvas-lms"'})
        if url.path == "/api/v1/courses/7":
            return self._send(200, {"id": 7, "name": "Parallel computing"})
        if url.path == "/api/v1/courses/7/assignments/42":
            return self._send(200, {"id": 42, "course_id": 7, "name": "Assignment 4"})
        if url.path != "/api/v1/courses/7/assignments/42/submissions":
            return self._send(404, {"errors": [{"message": "The specified resource does not exist."}]})
        page = int(parse_qs(url.query).get("page", ["1"])[0])
        base = f"http://{self.headers['Host']}{url.path}"
        links = [f'<{base}?page=1&per_page=1>; rel="first"', f'<{base}?page={len(SUBMISSIONS)}&per_page=1>; rel="last"']
        if page < len(SUBMISSIONS):
            links.insert(0, f'<{base}?page={page + 1}&per_page=1>; rel="next"')
        return self._send(200, SUBMISSIONS[page - 1:page], {"Link": ", ".join(links)})

    def _send(self, status: int, body, headers=None):
        data = json.dumps(body).encode()
        self.send_response(status)
        for k, v in {"Content-Type": "application/json; charset=utf-8", **(headers or {})}.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def canvas_api():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeCanvas)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeCanvas.seen = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.filterwarnings("ignore:Canvas may respond unexpectedly:UserWarning")   # http on the loopback
def test_canvas_times_come_from_its_api_page_by_page_with_the_token(tmp_path, canvas_api, capsys, monkeypatch):
    out = out_with(tmp_path, result("50001"), result("50002"), result("50003"))
    (tmp_path / "export.csv").write_text(CANVAS)
    monkeypatch.setenv("CANVAS_API_TOKEN", FakeCanvas.token)
    url = f"{canvas_api}/courses/7/assignments/42"
    assert main(["gradebook", str(out), "--policy", str(policy_file(tmp_path)), "--canvas", url, "--allow-no-time",
                 "--lms", f"canvas:{tmp_path / 'export.csv'}"]) == 0
    rows = {r["student"]: r for r in csv.DictReader((out / "final.csv").open())}
    assert (rows["50001"]["late_days"], rows["50001"]["final"]) == ("2", "80")     # 10:00 +02:00 on the 16th
    assert (rows["50002"]["late_days"], rows["50002"]["final"]) == ("0", "100")
    assert rows["50003"]["flags"] == "no_time"                                     # unsubmitted: no time
    assert sum("/submissions" in p for p in FakeCanvas.seen) == 3                   # every page, by its Link
    monkeypatch.setenv("CANVAS_API_TOKEN", "wrong")
    capsys.readouterr()
    assert main(["gradebook", str(out), "--policy", str(policy_file(tmp_path)), "--canvas", url]) == 2
    assert "Canvas's API answered InvalidAccessToken" in capsys.readouterr().err
    monkeypatch.delenv("CANVAS_API_TOKEN")
    assert main(["gradebook", str(out), "--policy", str(policy_file(tmp_path)), "--canvas", url]) == 2
    assert "no API token; set CANVAS_API_TOKEN" in capsys.readouterr().err
    assert main(["gradebook", str(out), "--policy", str(policy_file(tmp_path)), "--canvas", canvas_api,
                 "--canvas-token", "x"]) == 2
    assert "expected the assignment page's address" in capsys.readouterr().err


def test_canvas_times_from_its_submissions_page_saved_in_the_browser(tmp_path):
    out = out_with(tmp_path, result("50001"), result("50002"))
    (tmp_path / "page1.json").write_text("while(1);" + json.dumps(SUBMISSIONS))
    row = {r.student: r for r in make_gradebook(out, policy_file(tmp_path, "page1.json"))[0].rows}
    assert (row["50001"].late_days, row["50001"].final, row["50002"].late_days) == (2, 80.0, 0)


# --- each LMS's download, graded for real, and its way back ----------------------------------------

def lms_downloads(tmp: Path) -> list:
    """Each LMS's download, zipped and unzipped: (path, lms). Reference hand-ins score, skeletons do
    not; a late one per LMS, Blackboard's with an earlier attempt."""
    from tests.corpus import REFERENCE, UTILS, Files, skeleton, zip_bytes
    right, wrong = zip_bytes(Files(code=REFERENCE.read_text())), skeleton()
    meta = ("submission_{n}:\n  :submitters:\n  - :name: Student {n}\n    :sid: 's{n}'\n    :email: s{n}@uni.edu\n"
            "  :created_at: {when}\n")
    shapes = {
        "canvas": ({"lateann_LATE_50001_99901_handin.zip": right, "skelbob_50002_99902_assignment4.py": wrong,
                    "skelbob_50002_99902_utils.py": UTILS.read_text()},
                   {"onceeve_50003_99903_handin.zip": right}),
        "moodle": ({"Ann Late_1001_assignsubmission_file_/handin.zip": right,
                    "Bob Skel_1002_assignsubmission_file_/assignment4.py": wrong,
                    "Bob Skel_1002_assignsubmission_file_/utils.py": UTILS.read_text()},
                   {"Eve Once_1003_assignsubmission_file_/handin.zip": right}),
        "blackboard": ({"Assignment 4_alate_attempt_2026-04-14-20-00-00_assignment4.py": wrong,
                        "Assignment 4_alate_attempt_2026-04-14-20-00-00.txt": "Name: Ann Late (alate)\n",
                        "Assignment 4_alate_attempt_2026-04-16-10-00-00_handin.zip": right,
                        "Assignment 4_alate_attempt_2026-04-16-10-00-00.txt": "Name: Ann Late (alate)\n"},
                       {"Assignment 4_eonce_attempt_2026-04-14-21-00-00_handin.zip": right,
                        "Assignment 4_eonce_attempt_2026-04-14-21-00-00.txt": "Name: Eve Once (eonce)\n"}),
        "gradescope": ({"assignment_1_export/submission_metadata.yml":
                        meta.format(n=1, when="2026-04-16 10:00:00.000000000 +02:00")
                        + meta.format(n=2, when="2026-04-14 20:00:00.000000000 +02:00"),
                        "assignment_1_export/submission_1/handin.zip": right,
                        "assignment_1_export/submission_2/assignment4.py": wrong},
                       {"assignment_1_export/submission_metadata.yml":
                        meta.format(n=3, when="2026-04-14 21:00:00.000000000 +02:00"),
                        "assignment_1_export/submission_3/handin.zip": right}),
    }
    paths = []
    for lms, (zipped, unzipped) in shapes.items():
        with zipfile.ZipFile(tmp / f"{lms}.zip", "w") as z:
            for name, data in zipped.items():
                z.writestr(name, data)
        for name, data in unzipped.items():
            (tmp / lms / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / lms / name).write_bytes(data if isinstance(data, bytes) else data.encode())
        paths += [(tmp / f"{lms}.zip", lms), (tmp / lms, lms)]
    return paths


@pytest.fixture(scope="module")
def every_lms(tmp_path_factory):
    """Each LMS's download, zipped and not, graded in one batch with one check."""
    from grader.batch.run import grade_batch
    from tests.corpus import fast_rubric
    tmp = tmp_path_factory.mktemp("lms")
    paths = lms_downloads(tmp)
    rubric = fast_rubric(tmp, checks=[{"name": "default"}], public_world_sizes=[])
    summary = grade_batch([p for p, _ in paths], tmp / "out", rubric_path=rubric, progress=False)
    return tmp, summary


def _gradebook_of_every_lms(tmp: Path, out: Path) -> None:
    """`gradebook` over the batch of every LMS, each LMS's export beside it, under a policy with
    submission times from Canvas's API page, an extension and an override: refused while three
    students have no time, written with --allow-no-time."""
    skel = json.loads((out / "students" / "1002" / "grading.json").read_text())
    late = json.dumps([{"user_id": 50001, "submitted_at": "2026-04-16T08:00:00Z"},
                       {"user_id": 50003, "submitted_at": "2026-04-14T19:00:00Z"}])
    (tmp / "canvas-page.json").write_text("while(1);" + late)
    policy = policy_file(tmp, "canvas-page.json", extensions={"alate": "2026-04-18T23:59:00+02:00"},
                         overrides=[{"student": "1002", "part": "baseline", "reason": "regrade: accepted",
                                     "points": skel["parts"]["baseline"]["max_score"], "sha256": skel["sha256"]}])
    # One course per LMS in life; here four share a batch, so Canvas's SIS ids must not be the others' ids.
    (tmp / "canvas.csv").write_text(CANVAS.replace(",s1,alate,", ",c1,cl1,").replace(",s2,oover,", ",c2,cl2,")
                                    .replace(",s3,eext,", ",c3,cl3,"))
    (tmp / "moodle.csv").write_text(MOODLE.replace("Ann Late\",a@uni.example,\"Submitted for grading\",,50.00,Yes,-",
                                                   "Ann Late\",a@uni.example,\"Submitted for grading\",,50.00,Yes,"
                                                   "\"Thursday, 16 April 2026, 10:00 AM\""))
    people = [["Late", "Ann", "alate", "1", "", "Yes", "", ""], ["Once", "Eve", "eonce", "3", "", "Yes", "", ""]]
    (tmp / "gc.csv").write_bytes(bb_export(people))
    (tmp / "gs.csv").write_text(GRADESCOPE.replace("Eve,Ext,,e@uni.example", "Eve,Ext,s3,s3@uni.edu"))
    files = (("canvas", "canvas.csv"), ("moodle", "moodle.csv"), ("blackboard", "gc.csv"), ("gradescope", "gs.csv"))
    asked = ["gradebook", str(out), "--policy", str(policy), "--feedback", "-o", str(tmp / "final.csv"),
             *[f"--lms={lms}:{tmp / name}" for lms, name in files]]
    # Canvas's download and this Moodle sheet leave three students without a submission time: no
    # LMS file goes out with their grades unpenalised until the TA says so.
    assert main(asked) == 2
    assert not any(tmp.glob("*import*")), sorted(p.name for p in tmp.iterdir())
    assert main([*asked, "--allow-no-time"]) == 0


@pytest.mark.torch
@pytest.mark.timeout(900)
def test_every_lms_download_graded_and_its_imports_say_what_its_feedback_says(every_lms, capsys):
    tmp, summary = every_lms
    out = tmp / "out"
    grades = list(csv.DictReader((out / "grades.csv").open()))
    assert sorted({r["student"] for r in grades}) == ["1001", "1002", "1003", "50001", "50002", "50003", "alate",
                                                      "eonce", "s1", "s2", "s3"]
    sources = {r["source"] for r in grades}
    assert "canvas.zip › lateann_LATE_50001_99901_handin.zip" in sources
    assert "gradescope.zip › assignment_1_export/submission_1/handin.zip" in sources
    assert "canvas/onceeve_50003_99903_handin.zip" in sources           # unzipped: by the folder's name
    attempts = [r for r in grades if r["student"] == "alate"]     # Blackboard's two attempts: no duplicate
    assert len(attempts) == 2 and not any("duplicate" in r["flags"] for r in attempts)
    assert sorted("earlier_attempt" in r["flags"] for r in attempts) == [False, True]
    assert summary.duplicates == 0
    _gradebook_of_every_lms(tmp, out)
    final = {r["student"]: r for r in csv.DictReader((tmp / "final.csv").open())}
    assert final["50001"]["late_days"] == "2" and final["1001"]["late_days"] == "2" and final["s1"]["late_days"] == "2"
    assert "extension" in final["alate"]["flags"] and final["alate"]["penalty"] == "0"
    assert final["1002"]["overrides"].startswith("baseline=")

    def sent(lms: str) -> dict:   # student -> the feedback headline's grade "X / Y"
        files = feedback_of(out, lms)
        return {name: headline(text).split("Grade: ")[1].split(" (")[0] for name, text in files.items()}

    canvas = {r[1]: r[-1] for r in csv.reader(io.StringIO((tmp / "final-canvas-import.csv").read_text("utf-8-sig")))}
    said = sent("canvas")
    for key, upload in (("50001", "lateann_LATE_50001_99901"), ("50002", "skelbob_50002_99902"),
                        ("50003", "onceeve_50003_99903")):
        assert said[f"{upload}_assignment4-feedback.md"] == f"{canvas[key]} / 25", key
    assert float(canvas["50001"]) == pytest.approx(float(final["50001"]["final"]) * 25 / 100, abs=0.005)
    moodle = {r["Identifier"]: r for r in csv.DictReader(io.StringIO((tmp / "final-moodle-import.csv").read_text()))}
    said = sent("moodle")
    for number, folder in (("1001", "Ann Late"), ("1002", "Bob Skel"), ("1003", "Eve Once")):
        grade = moodle[f"Participant {number}"]["Grade"]
        assert said[f"{folder}_{number}_assignsubmission_file_/assignment4-feedback.md"] == f"{grade} / 50"
        assert moodle[f"Participant {number}"]["Feedback comments"].startswith(f"Grade: {grade} / 50")
    assert "regrade: accepted" in moodle["Participant 1002"]["Feedback comments"]
    board = list(csv.reader(io.StringIO((tmp / "final-blackboard-import.csv").read_text("utf-8-sig"))))
    for row in board[1:]:
        assert row[7].startswith(f"<p><strong>Grade: {row[4]} / 20 (as Blackboard shows it")
    scope = {r["SID"]: r["Total Score"]
             for r in csv.DictReader(io.StringIO((tmp / "final-gradescope-import.csv").read_text()))}
    said = sent("gradescope")
    assert said["submission_1/assignment4-feedback.md"] == f"{scope['s1']} / 10"
    printed = capsys.readouterr().out
    assert "Blackboard takes no feedback files: 2 student(s)' feedback goes in the Feedback to Learner" in printed
    assert "no feedback file for the LMS" not in printed and "not in the" not in printed   # each file: its own


@pytest.mark.torch
@pytest.mark.timeout(600)
def test_a_batch_where_no_world_could_start_gets_no_lms_file(tmp_path, monkeypatch, capsys):
    """gloo cannot start anywhere (no such network interface): the canary fails, every hand-in is
    infra_error, and gradebook refuses the LMS files, saying why."""
    from grader.batch.run import grade_batch
    from grader.results import read_canary
    from tests.corpus import REFERENCE, Files, fast_rubric, write_zip
    download = tmp_path / "submissions"
    download.mkdir()
    write_zip(download / "lateann_50001_99901_handin.zip", Files(code=REFERENCE.read_text()))
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "no-such-interface0")
    rubric = fast_rubric(tmp_path, checks=[{"name": "default"}], public_world_sizes=[])
    summary = grade_batch([download], tmp_path / "out", rubric_path=rubric, progress=False)
    assert summary.statuses == {"infra_error": 1}
    (tmp_path / "export.csv").write_text(CANVAS)
    capsys.readouterr()
    assert main(["gradebook", str(tmp_path / "out"), "--policy", str(policy_file(tmp_path)),
                 "--lms", f"canvas:{tmp_path / 'export.csv'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gradebook: no LMS file written: 1 of 1 hand-in(s) were not graded, through no fault of "
                          "the students: the reference solution fails") and err.count("\n") == 1
    canary = read_canary(tmp_path / "out")
    assert canary.kind == "machine" and canary.cause.removesuffix("; grade it again") in err   # whole, not cut
    assert not list((tmp_path / "out").glob("*-import.csv"))
