"""From autograde to final grades: the batch's gradebook over every result in OUT, the course
policy (deadline, late days, extensions, overrides, roster, submission times), `diff` after a
regrade, the LMS files, and what Gradescope shows before the due date.

The final-gradebook tests write results as grading would (grader.pipeline.record.write_handin)
and need no re-run; the batch tests grade a few tiny hand-ins for real with a fast rubric."""

import csv
import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grader import kit
from grader.cli import main
from grader.grades.commands import make_gradebook
from grader.grades.policy import PolicyError
from grader.grades.sources import lms_marks
from grader.intake.handin import student_id
from grader.pipeline.record import write_handin
from grader.pipeline.report import gradescope_results, limited_results
from grader.results import CheckOutcome, PartResult, Status, new_result
from grader.rubric import load_rubric, rubric_from_dict
from tests.corpus import REFERENCE, Files, fast_rubric, skeleton, write_zip

pytestmark = pytest.mark.lms   # make test-lms runs these; make test leaves them out

# The results below are written as grading would write them under this rubric of the tests' own,
# so that their arithmetic (10 % of 100 off, an override of 35) holds whatever grader/rubric.yaml says.
RUBRIC = rubric_from_dict({
    "parts": {"baseline": {"log": 2, "rerun": 8}, "grad_accumulation": {"log": 4, "rerun": 16},
              "data_parallel": {"log": 7, "rerun": 28}, "tensor_parallel": {"log": 7, "rerun": 28}},
    "checks": [{"name": "default"},
               {"name": "other-sizes", "hidden": True, "world_size": 2, "seed": 5, "global_batch_size": 24,
                "input_dim": 9, "output_dim": 14, "accumulation_steps": 3}]}, "the tests' rubric")
DEADLINE = "2026-04-14T23:59:00+02:00"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def result(key: str, source: str = None, lost: dict = None, status: str = "graded", digest: str = None):
    """A graded result as grading writes it: full marks but the points `lost` per part."""
    r = new_result(key, source or f"{key}.zip", digest or sha(key), RUBRIC)
    for part in RUBRIC.part_ids:
        points = RUBRIC.parts[part]
        full = points.log + points.rerun
        score = full - (lost or {}).get(part, 0)
        ok = score == full
        checks = [CheckOutcome(check=c.name, hidden=c.hidden, world_size=c.world_size,
                               status=Status.PASSED if ok else Status.FAILED,
                               message="matches the reference" if ok else "the update is 2x the reference's")
                  for c in RUBRIC.checks if part in RUBRIC.parts_at(c)]
        r.parts[part] = PartResult(part=part, status=Status.PASSED if ok else Status.FAILED, score=float(score),
                                   max_score=full, rerun_points=float(max(0, score - points.log)),
                                   log_points=float(min(points.log, score)), message="passed all checks" if ok
                                   else f"hidden check '{RUBRIC.checks[1].name}': the update is 2x the reference's",
                                   rerun_max=points.rerun, log_max=points.log, checks=checks)
    r.status = Status(status)
    r.score = sum(p.score for p in r.parts.values()) if status == "graded" else None
    r.message = "graded" if status == "graded" else "no assignment4.py in the hand-in"
    return r


def out_with(tmp_path: Path, *results) -> Path:
    out = tmp_path / "out"
    for r in results:
        write_handin(r, out)
    return out


def policy_file(tmp_path: Path, submissions: list = None, roster: list = None, **keys) -> Path:
    data = {"deadline": DEADLINE, "late_penalty_per_day": 10, "max_late_days": 5} | keys
    if isinstance(submissions, str):
        data["submissions"] = submissions
    elif submissions is not None:
        (tmp_path / "submissions.csv").write_text("student,submitted_at,source\n" +
                                                  "".join(",".join(row) + "\n" for row in submissions))
        data["submissions"] = "submissions.csv"
    if roster is not None:
        (tmp_path / "roster.csv").write_text("student,name,section\n" + "".join(f"{s},Name {s},A\n" for s in roster))
        data["roster"] = "roster.csv"
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def rows_of(path: Path) -> dict:
    return {row["student"]: row for row in csv.DictReader(path.open())}


# --- the final gradebook ---------------------------------------------------------------------

def test_on_time_late_by_a_started_day_past_the_maximum_and_an_extension(tmp_path):
    out = out_with(tmp_path, *(result(s) for s in ("ontime", "minute", "day", "five", "six", "ext")))
    times = [("ontime", "2026-04-14T23:00:00+02:00"), ("minute", "2026-04-15T00:00:00+02:00"),
             ("day", "2026-04-15T22:00:01Z"), ("five", "2026-04-19T23:59:00+02:00"),
             ("six", "2026-04-20T23:59:00+02:00"),
             ("ext", "2026-04-17T12:00:00+02:00")]
    policy = policy_file(tmp_path, [(s, t, "") for s, t in times], extensions={"ext": "2026-04-18T23:59:00+02:00"})
    book, written, _, _ = make_gradebook(out, policy)
    rows = rows_of(written)
    assert list(rows["ontime"])[:8] == ["student", "autograde", "overrides", "submitted_at", "late_days", "penalty",
                                       "final", "flags"]
    assert [rows["ontime"][k] for k in ("late_days", "penalty", "final", "flags")] == ["0", "0", "100", ""]
    # One minute late is a started day; 22:00:01Z is 24 h 1 min 1 s after the deadline: two days.
    assert [rows["minute"][k] for k in ("late_days", "penalty", "final", "flags")] == ["1", "10", "90", "late"]
    assert [rows["day"][k] for k in ("late_days", "final")] == ["2", "80"]
    assert [rows["five"][k] for k in ("late_days", "penalty", "final")] == ["5", "50", "50"]
    assert [rows["six"][k] for k in ("late_days", "final")] == ["6", "0"] and "too_late" in rows["six"]["flags"]
    assert [rows["ext"][k] for k in ("late_days", "final", "flags")] == ["0", "100", "extension"]


def test_an_override_is_applied_before_the_late_penalty(tmp_path):
    r = result("s1", lost={"data_parallel": 15})
    out = out_with(tmp_path, r)
    override = {"student": "s1", "part": "data_parallel", "points": 35, "reason": "regrade: accepted",
                "sha256": r.sha256}
    policy = policy_file(tmp_path, [("s1", "2026-04-15T10:00:00+02:00", "")], overrides=[override])
    row = rows_of(make_gradebook(out, policy)[1])["s1"]
    assert (row["autograde"], row["overrides"], row["penalty"], row["final"]) == \
        ("85", "data_parallel=35 (+15)", "10", "90")   # 10 % of 100, not of 85


def test_a_stale_override_is_flagged_and_applied_only_when_asked(tmp_path):
    out = out_with(tmp_path, result("s1", lost={"data_parallel": 15}))
    override = {"student": "s1", "part": "data_parallel", "points": 35, "reason": "regrade", "sha256": sha("old bytes")}
    policy = policy_file(tmp_path, [("s1", "2026-04-14T10:00:00+02:00", "")], overrides=[override])
    row = rows_of(make_gradebook(out, policy)[1])["s1"]
    assert (row["final"], row["overrides"], row["flags"]) == ("85", "", "override_stale")
    row = rows_of(make_gradebook(out, policy, keep_stale=True)[1])["s1"]
    assert (row["final"], row["overrides"], row["flags"]) == ("100", "data_parallel=35 (+15)", "override_stale")


def test_a_missing_student_an_unknown_handin_and_a_handin_with_no_time(tmp_path):
    out = out_with(tmp_path, result("s1"), result("s3"), result("s4", status="invalid"))
    policy = policy_file(tmp_path, [("s3", "2026-04-16T10:00:00+02:00", "")], roster=["s1", "s2", "s4"])
    book, written, _, _ = make_gradebook(out, policy)
    rows = rows_of(written)
    assert list(rows) == ["s1", "s2", "s4", "s3"]     # the roster's order, then hand-ins not on it
    assert list(rows["s1"])[8:] == ["name", "section"] and rows["s2"]["name"] == "Name s2"
    assert (rows["s1"]["final"], rows["s1"]["late_days"], rows["s1"]["flags"]) == ("100", "", "no_time")
    assert (rows["s2"]["autograde"], rows["s2"]["final"], rows["s2"]["flags"]) == ("", "0", "missing")
    assert (rows["s3"]["final"], rows["s3"]["flags"]) == ("80", "late;not_on_roster")
    assert (rows["s4"]["autograde"], rows["s4"]["final"], rows["s4"]["flags"]) == ("", "", "invalid;no_time")


def test_the_final_grade_is_computed_again_on_every_call_and_stored_nowhere(tmp_path):
    out = out_with(tmp_path, result("s1"))
    stored = (out / "students" / "s1" / "grading.json").read_bytes()
    policy = policy_file(tmp_path, [("s1", "2026-04-16T10:00:00+02:00", "")])
    assert rows_of(make_gradebook(out, policy)[1])["s1"]["final"] == "80"
    policy_file(tmp_path, [("s1", "2026-04-16T10:00:00+02:00", "")], deadline="2026-04-16T23:59:00+02:00")
    row = rows_of(make_gradebook(out, policy)[1])["s1"]
    assert (row["final"], row["late_days"], row["penalty"]) == ("100", "0", "0")   # the moved deadline: no penalty left
    assert (out / "students" / "s1" / "grading.json").read_bytes() == stored


def test_of_several_handins_the_latest_by_time_counts_else_a_person_decides(tmp_path):
    out = out_with(tmp_path, result("s1", "a.zip", lost={"baseline": 10}), result("s1~0badcafe", "b.zip"))
    times = [("s1", "2026-04-14T20:00:00+02:00", "a.zip"), ("s1", "2026-04-14T21:00:00+02:00", "b.zip")]
    row = rows_of(make_gradebook(out, policy_file(tmp_path, times))[1])["s1"]
    assert (row["autograde"], row["final"], row["flags"]) == ("100", "100", "latest_of_2")
    row = rows_of(make_gradebook(out, policy_file(tmp_path, [("s1", "2026-04-14T21:00:00+02:00", "")]))[1])["s1"]
    assert (row["final"], row["flags"]) == ("", "duplicate")
    chosen = policy_file(tmp_path, [("s1", "2026-04-14T21:00:00+02:00", "")], handins={"s1": "a.zip"})
    assert rows_of(make_gradebook(out, chosen)[1])["s1"]["final"] == "90"


def test_a_group_handin_from_gradescope_metadata_counts_for_every_member(tmp_path):
    out = out_with(tmp_path, result("s1"))
    meta = {"id": 7, "created_at": "2026-04-15T01:00:00.123456+02:00",
            "users": [{"name": "A", "sid": "s1", "email": "a@x"}, {"name": "B", "sid": "s2", "email": "b@x"}]}
    (tmp_path / "submission_metadata.json").write_text(json.dumps(meta))
    policy = policy_file(tmp_path, roster=["s1", "s2"], submissions="submission_metadata.json")
    rows = rows_of(make_gradebook(out, policy)[1])
    assert (rows["s1"]["final"], rows["s1"]["late_days"]) == ("90", "1")
    assert (rows["s2"]["final"], rows["s2"]["flags"]) == ("90", "group;late")


def test_an_lms_late_marker_without_a_time_is_flagged_not_penalised(tmp_path):
    out = out_with(tmp_path, result("12345", "doejane_LATE_12345_67890_hw4.zip"))
    row = rows_of(make_gradebook(out, policy_file(tmp_path))[1])["12345"]
    assert (row["final"], row["flags"]) == ("100", "no_time;lms_late")


@pytest.mark.parametrize("change, message", [
    ({"late_penalty": 10}, "unknown key 'late_penalty'; valid keys: deadline, late_penalty_per_day"),
    ({"deadline": "2026-04-14T23:59:00"}, "has no time zone"),
    ({"deadline": "2026-04-14"}, "is a day, not a time"),
    ({"extensions": {12345: "2026-04-18T23:59:00+02:00"}}, "must be quoted ('12345')"),
    ({"overrides": [{"student": "s1", "part": "dp", "points": 1, "reason": "r", "sha256": "0" * 64}]},
     "unknown part 'dp'; valid parts: baseline, grad_accumulation, data_parallel, tensor_parallel"),
    ({"overrides": [{"student": "s1", "part": "baseline", "points": 1, "reason": "r"}]}, "'sha256' is missing"),
    ({"extensions": {"s9": "2026-04-18T23:59:00+02:00"}}, "s9 is not on the roster and has no graded hand-in"),
    ({"overrides": [{"student": "s1", "part": "baseline", "points": 11, "reason": "r", "sha256": sha("s1")}]},
     "gives 11 points; the part's most is 10"),
])
def test_a_bad_policy_is_refused_naming_the_key(tmp_path, change, message):
    out = out_with(tmp_path, result("s1"))
    with pytest.raises(PolicyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_gradebook(out, policy_file(tmp_path, **change))


def test_the_gradebook_command_writes_the_file_and_exits_2_on_a_bad_policy(tmp_path, capsys):
    out = out_with(tmp_path, result("s1"))
    assert main(["gradebook", str(out), "--policy", str(policy_file(tmp_path, roster=["s1", "s2"]))]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out / 'final.csv'}: 2 students, 2 with a final grade" in printed and "s2: missing" in printed
    assert main(["gradebook", str(out), "--policy", str(policy_file(tmp_path, deadlin=DEADLINE))]) == 2
    assert "unknown key 'deadlin'" in capsys.readouterr().err


def test_the_gradebook_and_diff_commands_load_no_torch(tmp_path):
    out = out_with(tmp_path, result("s1"))
    code = ("import sys\nfrom grader import cli\n"
            f"assert cli.main(['gradebook', {str(out)!r}, '--policy', {str(policy_file(tmp_path))!r}]) == 0\n"
            f"assert cli.main(['diff', {str(out)!r}, {str(out)!r}]) == 0\n"
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=kit.ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"


# --- diff ------------------------------------------------------------------------------------

def test_diff_lists_what_moved_with_both_reasons_and_fails_when_a_score_went_down(tmp_path, capsys):
    old = out_with(tmp_path / "old", result("s1"), result("s2", lost={"baseline": 10}), result("s3"))
    new = out_with(tmp_path / "new", result("s1"), result("s2"), result("s3", lost={"tensor_parallel": 35}))
    assert main(["diff", str(old), str(new)]) == 1
    printed = capsys.readouterr()
    assert "s2 (s2.zip): 90 (graded) -> 100 (graded)\n  baseline: failed 0 -> passed 10" in printed.out
    assert "s3 (s3.zip): 100 (graded) -> 65 (graded)  LOWERED" in printed.out
    assert "    old: passed all checks\n    new: hidden check" in printed.out
    assert "s1" not in printed.out and "1 score(s) went down: s3" in printed.err
    assert main(["diff", str(old), str(old)]) == 0


# --- LMS files --------------------------------------------------------------------------------

CANVAS = ('Student,ID,SIS User ID,SIS Login ID,Section,Assignment 4 (123456),Quiz 1 (123400),Current Score\n'
          '    Points Possible,,,,,50.00,10.00,(read only)\n'
          '"Doe, Jane",4711,s1,jdoe,Section A,,8.00,80.00\n'
          '"Roe, Rick",4712,,rroe,Section A,3.00,9.00,90.00\n'
          '"Poe, Ed",4713,s9,epoe,Section B,,7.00,70.00\n'
          '"Student, Test",4714,,,Section A,,,\n')
MOODLE = ('Identifier,"Full name","Email address",Status,Grade,"Maximum Grade","Grade can be changed",'
          '"Last modified (submission)","Last modified (grade)","Feedback comments"\n'
          '"Participant 1001","Jane Doe",jane@uni.example,"Submitted for grading",,100.00,Yes,'
          '"Tuesday, 14 April 2026, 11:50 PM",-,\n'
          '"Participant 1002","Rick Roe",rick@uni.example,"Submitted for grading",,100.00,No,'
          '"Tuesday, 14 April 2026, 10:00 PM",-,\n'
          '"Participant 1003","Ed Poe",ed@uni.example,"No submission",,100.00,Yes,-,-,\n')


def test_a_canvas_export_is_filled_by_sis_or_login_id_and_scaled_to_its_points(tmp_path, capsys):
    out = out_with(tmp_path, result("s1", lost={"baseline": 10}), result("rroe"))
    (tmp_path / "canvas.csv").write_text(CANVAS)
    policy = policy_file(tmp_path, roster=["s1", "rroe", "s9"])
    command = ["gradebook", str(out), "--policy", str(policy), "--lms", f"canvas:{tmp_path / 'canvas.csv'}",
               "--allow-no-time"]   # times are not what this test is about
    assert main(command) == 2
    assert "2 assignment columns in it; name the one to fill with --assignment" in capsys.readouterr().err
    assert main(command + ["--assignment", "assignment 4"]) == 0
    written = out / "final-canvas-import.csv"          # named by the final gradebook (OUT/final.csv)
    rows = list(csv.reader(io.StringIO(written.read_text())))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Assignment 4 (123456)"]
    assert rows[1][0].strip() == "Points Possible" and rows[1][-1] == "50.00"
    assert rows[2] == ["Doe, Jane", "4711", "s1", "jdoe", "Section A", "45.00"]      # 90 of 100 -> 45 of 50
    assert rows[3][-1] == "50.00"                                                    # matched by login id
    assert rows[4][-1] == "0.00" and len(rows) == 5                                  # s9: missing, 0; no test student
    assert f"wrote {written}: 3 grade(s) in 'Assignment 4 (123456)' (canvas)" in capsys.readouterr().out


def test_canvas_times_read_in_the_deadlines_zone_and_without_them_no_lms_file_is_written(tmp_path, capsys):
    """Canvas gives times in UTC, the deadline is +02:00: every time is shown in the deadline's zone
    (23:31 UTC on the 14th is 01:31 on the 15th, one started day late), in final.csv and in what the
    student reads. Where a graded student has no time, the deadline could not be held against them:
    no LMS file, and the refusal says how to get the times, until --allow-no-time says so."""
    out = out_with(tmp_path, result("s1"), result("rroe"))
    (tmp_path / "canvas.csv").write_text(CANVAS)
    command = ["gradebook", str(out), "--lms", f"canvas:{tmp_path / 'canvas.csv'}", "--assignment", "assignment 4"]
    policy = policy_file(tmp_path, [("s1", "2026-04-14T23:31:00Z", "")])   # Canvas's UTC
    assert main(command + ["--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert "no LMS file written: 1 student(s) with a grade have no submission time" in err and "(rroe)" in err
    assert "--canvas ASSIGNMENT_URL" in err and "--allow-no-time" in err
    assert not (out / "final-canvas-import.csv").exists() and not (out / "final.csv").exists()
    assert main(command + ["--policy", str(policy), "--allow-no-time"]) == 0
    capsys.readouterr()
    rows = rows_of(out / "final.csv")
    assert (rows["s1"]["submitted_at"], rows["s1"]["late_days"], rows["s1"]["final"]) == (
        "2026-04-15T01:31:00+02:00", "1", "90")
    book = make_gradebook(out, policy, allow_no_time=True)[0]
    said = next(r for r in book.rows if r.student == "s1").changes[0][0]
    assert said.startswith("handed in 2026-04-15 01:31 +0200, 1 started day(s) after the deadline 2026-04-14 23:59 "
                           "+0200"), said
    both = policy_file(tmp_path, [("s1", "2026-04-14T23:31:00Z", ""), ("rroe", "2026-04-14T20:00:00Z", "")])
    assert main(command + ["--policy", str(both)]) == 0 and (out / "final-canvas-import.csv").exists()


def test_a_moodle_worksheet_is_filled_by_participant_number_and_locked_grades_are_kept(tmp_path, capsys):
    out = out_with(tmp_path, result("1001", "Jane Doe_1001_assignsubmission_file_hw4.zip", lost={"baseline": 10}),
                   result("1002", "Rick Roe_1002_assignsubmission_file_hw4.zip"))
    (tmp_path / "worksheet.csv").write_text(MOODLE)
    assert main(["gradebook", str(out), "--policy", str(policy_file(tmp_path, roster=["1001", "1002", "1003"])),
                 "--lms", f"moodle:{tmp_path / 'worksheet.csv'}", "-o", str(tmp_path / "final.csv"),
                 "--allow-no-time"]) == 0
    rows = list(csv.reader(io.StringIO((tmp_path / "final-moodle-import.csv").read_text())))
    assert rows[0] == next(csv.reader(io.StringIO(MOODLE)))
    assert [(r[0], r[4]) for r in rows[1:]] == [("Participant 1001", "90.00"), ("Participant 1002", ""),
                                                ("Participant 1003", "0.00")]
    assert rows[1][7] == "Tuesday, 14 April 2026, 11:50 PM"
    assert "Participant 1002 (1002): Moodle says the grade cannot be changed" in capsys.readouterr().out


def test_lms_bulk_download_names_give_the_id_and_the_late_marker():
    assert student_id("Jane Doe_12345_assignsubmission_file_hw4.zip", "moodle") == "12345"
    assert student_id("bulk.zip › Jane Doe_12345_assignsubmission_file/hw4.zip", "moodle") == "12345"
    assert student_id("doejane_12345_67890_hw4.zip", "canvas") == "12345"
    assert student_id("doejane_LATE_12345_67890_hw4-1.zip", "canvas") == "12345"
    assert lms_marks("doejane_LATE_12345_67890_hw4.zip") == {"lms": "canvas", "id": "12345", "late": True}
    assert lms_marks("doejane_12345_67890_hw4.zip")["late"] is False
    assert lms_marks("Jane Doe_12345_assignsubmission_file_hw4.zip") == {"lms": "moodle", "id": "12345", "late": False}
    assert lms_marks("alice.zip") == {}


# --- Gradescope --------------------------------------------------------------------------------

def test_gradescope_shows_hidden_checks_after_the_due_date_under_neutral_names():
    doc = gradescope_results(result("s1", lost={"data_parallel": 7}).to_dict())
    hidden_names = [c.name for c in RUBRIC.checks if c.hidden]
    tests = {t["name"]: t for t in doc["tests"]}
    dp = tests["data_parallel: Part 3: data parallel, hidden checks"]
    assert dp["visibility"] == "after_due_date" and dp["status"] == "failed"
    assert "- hidden check 1: **failed**" in dp["output"]
    public = tests["data_parallel: Part 3: data parallel, re-run (public checks)"]
    runs = [c for c in RUBRIC.checks if "data_parallel" in c.parts()]
    share = round(28 * sum(not c.hidden for c in runs) / len(runs), 4)   # the public checks' (equal weights here)
    assert (public["visibility"], public["status"], public["score"], public["max_score"]) == ("visible", "failed", 0, share)
    assert sum(t["score"] for t in doc["tests"] if t["name"].startswith("baseline") and "log" not in t["name"]) == 8
    seen = json.dumps([t for t in doc["tests"] if t["visibility"] == "visible"]) + doc["output"]
    assert not any(name in seen for name in hidden_names), "a hidden check's name is visible before the due date"
    assert "hidden check 1" not in doc["output"] and "results are shown after the due date" in doc["output"]


def test_an_invalid_submission_scores_0_on_gradescope_with_its_reason():
    doc = gradescope_results(result("s1", status="invalid").to_dict())
    assert doc["score"] == 0 and "no assignment4.py" in doc["output"]


def test_the_gradescope_limit_counts_graded_submissions_by_created_at_never_the_clock(tmp_path):
    def meta(created, previous):
        path = tmp_path / "submission_metadata.json"
        path.write_text(json.dumps({"created_at": created, "previous_submissions": [
            {"submission_time": t, "score": s, "results": {"score": s, "output": f"run {s}",
                                                          "extra_data": {"rate_limited": limited}}}
            for t, s, limited in previous]}))
        return path
    earlier = [("2026-04-10T10:00:00+02:00", 50.0, False), ("2026-04-10T12:00:00+02:00", 70.0, False),
               ("2026-04-10T13:00:00+02:00", 70.0, True)]
    assert limited_results(meta("2026-04-10T14:00:00+02:00", earlier[:1]), 2) is None
    doc = limited_results(meta("2026-04-10T14:00:00+02:00", earlier), 2)
    assert doc["score"] == 70.0 and doc["extra_data"]["rate_limited"] is True
    assert doc["output"].startswith("**Not graded:** you have had 2 graded submissions") and "run 70" in doc["output"]
    # Within a 24-hour window: counted back from created_at, so a re-run in a month decides the same.
    assert limited_results(meta("2026-04-11T11:00:00+02:00", earlier), 2, window_hours=24) is None
    assert limited_results(meta("2026-04-11T09:00:00+02:00", earlier), 2, window_hours=24) is not None
    assert limited_results(meta("2026-04-11T09:00:00+02:00", earlier), 0) is None


# --- files and the batch -------------------------------------------------------------------------

@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_files_are_written_with_the_users_umask(tmp_path, umask, mode):
    code = (f"import os\nos.umask({umask})\nfrom grader import kit\n"
            f"kit.atomic_write(kit.Path({str(tmp_path / 'f.txt')!r}), 'x')\n"
            f"print(oct(os.stat({str(tmp_path / 'f.txt')!r}).st_mode & 0o777))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=kit.ROOT)
    assert proc.stdout.strip() == oct(mode), proc.stderr


@pytest.mark.torch
def test_a_typo_in_only_a_missing_path_and_an_empty_folder_grade_nothing(tmp_path, capsys):
    from grader.batch.run import InputError, grade_batch
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    write_zip(inbox / "bob.zip", Files(code="x = 1\n"))
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"--only bobb: no hand-in of that id among the 1 found \(did you mean bob"):
        grade_batch([inbox], out, only=["bobb"], progress=False)
    assert main(["grade", str(tmp_path / "nope"), str(tmp_path / "empty"), str(inbox), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nope'}: no such file or folder" in err and "nothing was graded" in err
    assert f"{tmp_path / 'empty'}: no hand-in in it" in err
    assert not out.exists()


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """alice (the reference), bob (the skeleton), a broken zip: graded once, with one check."""
    from grader.batch.run import grade_batch
    tmp = tmp_path_factory.mktemp("batch")
    inbox = tmp / "inbox"
    inbox.mkdir()
    write_zip(inbox / "alice.zip", Files(code=REFERENCE.read_text()))
    write_zip(inbox / "bob.zip", Files(code=skeleton()))
    (inbox / "broken.zip").write_bytes(b"PK\x03\x04 not a zip")
    rubric = fast_rubric(tmp, checks=[{"name": "default"}])
    out = tmp / "out"
    grade_batch([inbox], out, rubric_path=rubric, progress=False)
    return inbox, out, rubric


def without_log(rubric_path) -> str:
    """The score grades.csv gives a correct hand-in that has no .log, under the rubric at `rubric_path`."""
    rubric = load_rubric(rubric_path)
    return f"{rubric.max_score - sum(p.log for p in rubric.parts.values()):g}"


def copy_out(batch, tmp_path) -> Path:
    import shutil
    out = tmp_path / "out"
    shutil.copytree(batch[1], out)
    return out


@pytest.mark.timeout(300)
@pytest.mark.torch
@pytest.mark.stock_rubric   # its columns and scores are the stock course's (Part 5 off)
def test_the_gradebook_covers_every_result_after_only_and_after_a_late_folder(batch, tmp_path):
    from grader.batch.run import grade_batch
    inbox, _, rubric = batch
    out = copy_out(batch, tmp_path)
    summary = grade_batch([inbox], out, rubric_path=rubric, force=True, only=["bob"], progress=False)
    assert summary.graded == 1 and summary.statuses == {"graded": 2, "invalid": 1}
    rows = rows_of(out / "grades.csv")
    assert sorted(rows) == ["alice", "bob", "broken"] and rows["alice"]["score"] == without_log(rubric)
    late = tmp_path / "late"
    late.mkdir()
    write_zip(late / "carol.zip", Files(code=REFERENCE.read_text()))
    write_zip(late / "bob.zip", Files(code=REFERENCE.read_text()))   # bob's newer hand-in, same name
    summary = grade_batch([late], out, rubric_path=rubric, progress=False)
    rows = rows_of(out / "grades.csv")
    assert sorted(rows) == ["alice", "bob", "broken", "carol"] and rows["bob"]["score"] == without_log(rubric)
    assert summary.replaced and (out / "students" / ".replaced").is_dir()
    assert "Results replaced by a newer hand-in of the same name" in (out / "summary.md").read_text()


@pytest.mark.timeout(300)
@pytest.mark.torch
@pytest.mark.stock_rubric   # its columns and scores are the stock course's (Part 5 off)
def test_an_unreadable_zip_has_no_score_and_zeros_are_for_a_person(batch):
    _, out, _ = batch
    rows = rows_of(out / "grades.csv")
    assert list(rows["alice"]) == ["student", "score", "max_score", "status", *RUBRIC.part_ids, "flags", "source"]
    broken = rows["broken"]
    assert (broken["score"], broken["status"], broken["source"]) == ("", "invalid", "broken.zip")
    look = (out / "summary.md").read_text().split("## For a person to look at")[1]
    assert "- bob (bob.zip): scored 0" in look and "- broken (broken.zip): invalid, no score" in look
    assert "- alice (alice.zip): flags missing_log" in look


@pytest.mark.timeout(300)
@pytest.mark.torch
@pytest.mark.stock_rubric   # its columns and scores are the stock course's (Part 5 off)
def test_two_handins_of_one_student_are_told_apart_by_source_and_ids_off_the_pattern_listed(batch, tmp_path):
    from grader.batch.run import grade_batch
    _, _, rubric = batch
    data = yaml.safe_load(rubric.read_text())
    data["files"] = {"student_id_pattern": r"^(?P<id>s\d+)-"}
    moodle = tmp_path / "moodle.yaml"
    moodle.write_text(yaml.safe_dump(data))
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    write_zip(inbox / "s1001-a.zip", Files(code=REFERENCE.read_text()))
    write_zip(inbox / "s1001-b.zip", Files(code=skeleton()))
    write_zip(inbox / "stray.zip", Files(code=REFERENCE.read_text()))
    out = tmp_path / "out"
    summary = grade_batch([inbox], out, rubric_path=moodle, progress=False)
    assert summary.duplicates == 1
    rows = list(csv.DictReader((out / "grades.csv").open()))
    full = without_log(moodle)
    assert [(r["student"], r["source"], r["score"]) for r in rows] == [
        ("s1001", "s1001-a.zip", full), ("s1001", "s1001-b.zip", "0"), ("stray", "stray.zip", full)]
    assert all("duplicate" in r["flags"] for r in rows[:2])
    folders = sorted(p.parent.name for p in (out / "students").glob("*/grading.json"))
    assert folders[0] == "s1001" and folders[1].startswith("s1001~") and folders[2] == "stray"
    text = (out / "summary.md").read_text()
    assert f"- s1001: 2 hand-ins, s1001-a.zip ({full})" in text
    assert "## Names the student id pattern does not match" in text and "- stray.zip" in text
    again = grade_batch([inbox], out, rubric_path=moodle, progress=False)
    assert (again.graded, again.cached) == (0, 3)    # the same folders, found again
    # The final gradebook: no time for each hand-in, so a person decides; then the latest counts.
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"deadline: {DEADLINE}\n")
    assert rows_of(make_gradebook(out, policy)[1])["s1001"]["flags"] == "duplicate"
    (tmp_path / "times.csv").write_text("student,submitted_at,source\n"
                                        "s1001,2026-04-14T20:00:00+02:00,s1001-a.zip\n"
                                        "s1001,2026-04-14T21:00:00+02:00,s1001-b.zip\n")
    policy.write_text(f"deadline: {DEADLINE}\nsubmissions: times.csv\n")
    assert rows_of(make_gradebook(out, policy)[1])["s1001"]["autograde"] == "0"
    assert os.path.exists(out / "final.csv")


def test_summary_keeps_other_commands_sections_and_warns_when_graded_without_the_sandbox(tmp_path):
    from grader.batch.outputs import load_views, write_outputs
    unsandboxed = result("s2")
    unsandboxed.isolation = {"mode": "off"}
    out = out_with(tmp_path, result("s1"), unsandboxed)
    (out / "summary.md").write_text("# old\n\n<!-- integrity: begin -->\nsee integrity.md\n<!-- integrity: end -->\n")
    write_outputs(load_views(out), out, 100.0)
    text = (out / "summary.md").read_text()
    assert text.startswith("# Assignment 4: summary of 2 hand-ins\n\n> **Warning:** 1 hand-in(s) were graded with")
    assert text.endswith("\n<!-- integrity: begin -->\nsee integrity.md\n<!-- integrity: end -->\n")
    assert "# old" not in text


@pytest.mark.torch
def test_an_invalid_handin_scores_0_when_the_rubric_says_so(tmp_path):
    from grader.batch.run import grade_batch
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "broken.zip").write_bytes(b"not a zip")
    rubric = fast_rubric(tmp_path, files={"invalid_scores_zero": True})
    grade_batch([inbox], tmp_path / "out", rubric_path=rubric, progress=False)
    row = rows_of(tmp_path / "out" / "grades.csv")["broken"]
    assert (row["score"], row["status"]) == ("0", "invalid")


# --- from the download's times to the LMS's upload ---------------------------------------------

def downloaded(out: Path, key: str, **said) -> None:
    """What an LMS download said of the hand-in graded as `key` (grader.batch.run writes it)."""
    (out / "students" / key / "download.json").write_text(json.dumps({"late": False, "also": [], **said}))


def test_times_from_the_download_are_used_and_a_zone_less_time_is_the_deadlines(tmp_path):
    out = out_with(tmp_path, result("jdoe"), result("amy"), result("s1"), result("s9"))
    downloaded(out, "jdoe", lms="blackboard", submitted_at="2026-04-15T10:00:00")       # +02:00: 1 day late
    downloaded(out, "amy", lms="blackboard", submitted_at="2026-04-14T23:00:00")
    downloaded(out, "s1", lms="gradescope", submitted_at="2026-04-16 09:00:00+02:00", also=["s2"])
    downloaded(out, "s9", lms="canvas", late=True)
    rows = rows_of(make_gradebook(out, policy_file(tmp_path))[1])
    assert (rows["jdoe"]["late_days"], rows["jdoe"]["final"]) == ("1", "90")
    assert (rows["amy"]["late_days"], rows["amy"]["final"]) == ("0", "100")
    assert (rows["s1"]["late_days"], rows["s2"]["flags"]) == ("2", "group;late")
    assert rows["s9"]["flags"] == "no_time;lms_late"


def test_a_moodle_worksheet_gives_the_times_and_students_without_one_come_first(tmp_path, capsys):
    out = out_with(tmp_path, result("1001"), result("1002"), result("1003"))
    sheet = MOODLE.replace("Tuesday, 14 April 2026, 11:50 PM", "Thursday, 16 April 2026, 9:00 AM")
    (tmp_path / "worksheet.csv").write_text(sheet)
    policy = policy_file(tmp_path)
    assert main(["gradebook", str(out), "--policy", str(policy), "--lms", f"moodle:{tmp_path / 'worksheet.csv'}",
                 "--allow-no-time"]) == 0
    printed = capsys.readouterr().out
    rows = rows_of(out / "final.csv")
    assert (rows["1001"]["late_days"], rows["1001"]["final"]) == ("2", "80")
    assert rows["1002"]["late_days"] == "0" and rows["1003"]["flags"] == "no_time"
    look = printed.split("for a person to look at:\n")[1]
    assert look.startswith("  1 student(s) have no submission time, so no late penalty could be computed for "
                           "them: 1003\n    give a submission time: the policy's `submissions:`")
    assert "--lms moodle:WORKSHEET.csv" in look


def test_feedback_goes_back_as_each_lms_bulk_upload_wants_it(tmp_path, capsys):
    import zipfile
    out = out_with(tmp_path, result("1001", lost={"baseline": 10}), result("1002"), result("50001"), result("jdoe"))
    downloaded(out, "1001", lms="moodle", upload="Jane Doe_1001_assignsubmission_file_")
    downloaded(out, "1002", lms="moodle", upload="Rick Roe_1002_assignsubmission_file_")
    downloaded(out, "50001", lms="canvas", upload="martineve_LATE_50001_99901", late=True)
    downloaded(out, "jdoe", lms="blackboard", upload="Assignment 4_jdoe_attempt_2026-04-14-20-00-00",
               submitted_at="2026-04-14T20:00:00")
    (tmp_path / "worksheet.csv").write_text(MOODLE)
    assert main(["gradebook", str(out), "--policy", str(policy_file(tmp_path)), "--feedback", "--allow-no-time",
                 "--lms", f"moodle:{tmp_path / 'worksheet.csv'}", "-o", str(tmp_path / "final.csv")]) == 0
    printed = capsys.readouterr().out
    with zipfile.ZipFile(out / "feedback-upload" / "moodle-feedback.zip") as z:
        assert sorted(z.namelist()) == ["Jane Doe_1001_assignsubmission_file_/assignment4-feedback.md",
                                        "Rick Roe_1002_assignsubmission_file_/assignment4-feedback.md"]
        sent = z.read(z.namelist()[0]).decode()
    graded = (out / "students" / "1001" / "feedback.md").read_text()
    assert sent.startswith("# Assignment 4: feedback for 1001\n\n## Grade: 90.00 / 100 (as Moodle shows it)\n")
    assert sent.endswith(graded.split("\n", 2)[2].replace("**Score: ", "**Autograde: "))   # the report, under it
    assert "**Score: " not in sent and "**Autograde: 90 / 100**" in sent
    with zipfile.ZipFile(out / "feedback-upload" / "canvas-feedback.zip") as z:
        assert z.namelist() == ["martineve_LATE_50001_99901_assignment4-feedback.md"]
    assert "Blackboard takes no feedback files: 1 student(s)' feedback goes in the Feedback to Learner column" in printed
    assert "2 feedback file(s); upload it in Moodle: Grading action > Upload multiple feedback files" in printed
    sheet = list(csv.DictReader(io.StringIO((tmp_path / "final-moodle-import.csv").read_text())))
    assert sheet[0]["Feedback comments"] == "Grade: 90.00 / 100 (as Moodle shows it). Autograde 90."
    assert sheet[2]["Feedback comments"] == ""   # 1003 handed in nothing graded here


def test_a_wrong_key_in_a_policy_file_is_one_line_naming_the_file_the_key_and_the_valid_keys(tmp_path):
    from grader.grades.policy import KEYS, load_policy
    path = policy_file(tmp_path, late_penalty=10)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert str(info.value) == f"{path}: unknown key 'late_penalty'; valid keys: {', '.join(KEYS)}"
    assert "\n" not in str(info.value) and "late_penalty_per_day" in str(info.value)


def test_the_most_common_failures_keep_whole_numbers_and_group_measured_values():
    from grader.batch.outputs import _reason, unmeasured
    assert unmeasured("the shards were joined along dimension 0, not 1") == "the shards were joined along dimension 0, not 1"
    assert unmeasured("rank 2: max |difference| 3.2e-01 (tolerance 1e-05)") == "rank 2: max |difference| … (tolerance …)"
    parts = [{"message": "", "checks": [{"status": "failed", "diagnosis": f"the update is {k} times the reference's"}]}
             for k in ("0.25", "0.5", "4")]
    assert [_reason(p) for p in parts] == ["the update is … times the reference's"] * 2 + ["the update is 4 times the reference's"]
