"""A download's names can never make a file another student's: Blackboard's attempt names read
from the first `_attempt_<date>` Blackboard wrote, under the download's one assignment name;
Gradescope's metadata only at the export's top; two ids of one download never one student.
Intake only (find, ids): nothing here re-runs code."""

import pytest

from grader.intake.find import find_handins
from tests.test_download import HANDIN, as_folder, both, make_zip, rows

pytestmark = pytest.mark.lms

A = "Assignment 4"


def attempts(found) -> list:
    return sorted((h.student, h.submitted_at, tuple(sorted(h.files or ())) or h.name.rsplit("_", 1)[-1])
                  for h in found.handins)


def test_a_file_named_like_another_students_attempt_stays_its_uploaders(tmp_path):
    members = {f"{A}_vic_attempt_2026-04-14-20-00-00_handin.zip": HANDIN,
               f"{A}_vic_attempt_2026-04-14-20-00-00.txt": "Name: Victor Im (vic)\n",
               f"{A}_mal_attempt_2026-04-14-21-00-00_handin.zip": HANDIN,
               f"{A}_mal_attempt_2026-04-14-21-00-00_x_vic_attempt_2026-04-14-23-58-00_handin.zip": HANDIN,
               f"{A}_mal_attempt_2026-04-14-21-00-00.txt": "Name: Mal Lory (mal)\n"}
    for path in both(tmp_path, "gradecenter", members):
        found = find_handins([path])
        said = sorted((h.student, h.submitted_at) for h in found.handins)
        assert said == [("mal", "2026-04-14T21:00:00"), ("vic", "2026-04-14T20:00:00")]
        mal = rows(found)["mal"]
        assert sorted(mal.files) == ["handin.zip", "x_vic_attempt_2026-04-14-23-58-00_handin.zip"]
        assert mal.upload == f"{A}_mal_attempt_2026-04-14-21-00-00" and not found.strays


def test_a_username_with_an_underscore_is_the_whole_username(tmp_path):
    members = {f"{A}_doe_attempt_2026-04-14-20-00-00_handin.zip": HANDIN,
               f"{A}_doe_attempt_2026-04-14-20-00-00.txt": "Name: Dan Doe (doe)\n",
               f"{A}_jo_doe_attempt_2026-04-14-22-00-00_handin.zip": HANDIN,
               f"{A}_jo_doe_attempt_2026-04-14-22-00-00.txt": "Name: Jo Doe (jo_doe)\n"}
    for path in both(tmp_path, "gradecenter", members):
        found = find_handins([path])
        assert sorted((h.student, h.submitted_at) for h in found.handins) == [
            ("doe", "2026-04-14T20:00:00"), ("jo_doe", "2026-04-14T22:00:00")]


def test_an_assignment_name_with_underscores_is_read_from_the_receipts(tmp_path):
    members = {"HW_4_jo_doe_attempt_2026-04-14-20-00-00_assignment4.py": "jo\n",
               "HW_4_jo_doe_attempt_2026-04-14-20-00-00.txt": "Name: Jo Doe (jo_doe)\nAssignment: HW_4\n",
               "HW_4_jo_smith_attempt_2026-04-14-21-00-00_assignment4.py": "smith\n",
               "HW_4_jo_smith_attempt_2026-04-14-21-00-00.txt": "Name: Jo Smith (jo_smith)\n"}
    found = find_handins([both(tmp_path, "gc", members)[0]])
    assert sorted(rows(found)) == ["jo_doe", "jo_smith"] and not found.strays


def test_without_receipts_an_ambiguous_assignment_name_is_refused_never_guessed(tmp_path):
    members = {"HW_4_jo_doe_attempt_2026-04-14-20-00-00_assignment4.py": "jo\n",
               "HW_4_jo_smith_attempt_2026-04-14-21-00-00_assignment4.py": "smith\n"}
    found = find_handins([both(tmp_path, "gc", members)[0]])
    assert not found.handins and len(found.strays) == 2
    assert all("assignment" in s.message and "not graded" in s.message for s in found.strays)
    plain = {f"{A}_jdoe_attempt_2026-04-14-20-00-00_assignment4.py": "jo\n",   # one way to read it: read
             f"{A}_amy_attempt_2026-04-14-20-00-00_assignment4.py": "amy\n"}
    assert sorted(rows(find_handins([both(tmp_path, "plain", plain)[0]]))) == ["amy", "jdoe"]


def test_a_file_of_another_assignment_or_a_receipt_of_another_user_is_no_students(tmp_path):
    members = {f"{A}_amy_attempt_2026-04-14-20-00-00_handin.zip": HANDIN,
               f"{A}_amy_attempt_2026-04-14-20-00-00.txt": "Name: Amy Ng (amy)\n",
               f"{A}_bob_attempt_2026-04-14-20-00-00_handin.zip": HANDIN,
               f"{A}_bob_attempt_2026-04-14-20-00-00.txt": "Name: Bob Roe (bob)\n",
               f"{A}_cy_attempt_2026-04-14-20-00-00_handin.zip": HANDIN,
               f"{A}_cy_attempt_2026-04-14-20-00-00.txt": "Name: Cy Po (amy)\n",       # the name says cy
               "Quiz 2_dee_attempt_2026-04-14-20-00-00_handin.zip": HANDIN}
    found = find_handins([both(tmp_path, "gc", members)[0]])
    assert sorted(rows(found)) == ["amy", "bob"]
    stray = " ".join(s.message for s in found.strays)
    assert "cy_attempt" in stray and "Quiz 2_dee" in stray


EXPORT = ("submission_111:\n  :submitters:\n  - :name: Vic Tim\n    :sid: 's1'\n  :created_at: 2026-04-14 "
          "21:10:00.000000000 +02:00\nsubmission_555:\n  :submitters:\n  - :name: Mal Lory\n    :sid: 's2'\n"
          "  :created_at: 2026-04-14 22:00:00.000000000 +02:00\n")
PLANTED = ("submission_1:\n  :submitters:\n  - :sid: 's1'\n  :created_at: 2026-04-14 21:00:00 +02:00\n"
           "submission_2:\n  :submitters:\n  - :sid: 's2'\n  :created_at: 2026-04-14 21:00:00 +02:00\n")


@pytest.mark.parametrize("wrapped", [True, False])
def test_a_metadata_file_in_a_students_submission_is_that_students_file(tmp_path, wrapped):
    top = "assignment_4242_export/" if wrapped else ""
    members = {f"{top}submission_metadata.yml": EXPORT, f"{top}submission_111/handin.zip": HANDIN,
               f"{top}submission_555/submission_metadata.yml": PLANTED,
               f"{top}submission_555/submission_1/handin.zip": HANDIN,
               f"{top}submission_555/submission_2/handin.zip": HANDIN}
    for path in both(tmp_path, "export", members):
        found = find_handins([path])
        by = rows(found)
        assert sorted(by) == ["s1", "s2"] and not found.strays
        assert by["s1"].upload == "submission_111" and by["s1"].name.endswith("submission_111/handin.zip")
        assert "submission_metadata.yml" in by["s2"].files and by["s2"].upload == "submission_555"


def test_a_metadata_file_in_a_moodle_students_folder_leaves_it_a_moodle_download(tmp_path):
    f = "_assignsubmission_file_"
    members = {f"Ann Lee_1001{f}/handin.zip": HANDIN, f"Bob Roe_1002{f}/handin.zip": HANDIN,
               f"Mal Lory_1003{f}/handin.zip": HANDIN,
               f"Mal Lory_1003{f}/submission_metadata.yml": "submission_1:\n  :submitters:\n  - :sid: '1001'\n",
               f"Mal Lory_1003{f}/submission_1/a.zip": HANDIN}
    for path in both(tmp_path, "moodle", members):
        found = find_handins([path])
        assert sorted(rows(found)) == ["1001", "1002", "1003"] and {h.lms for h in found.handins} == {"moodle"}
        assert rows(found)["1001"].upload == f"Ann Lee_1001{f}"
    alone = {k: v for k, v in members.items() if k.startswith("Mal")}   # one student's folder alone
    for path in both(tmp_path, "alone", alone):
        found = find_handins([path])
        assert list(rows(found)) == ["1003"] and found.handins[0].lms == "moodle"


@pytest.mark.parametrize("wrapped", [True, False])
def test_one_students_zip_with_an_export_inside_stays_that_students_hand_in(tmp_path, wrapped):
    """A hand-in (its code at its top, or in its one folder) given to `grade` beside others, holding
    a Gradescope metadata file and submission folders that name classmates: one hand-in, its own."""
    top = "mal/" if wrapped else ""
    planted = {f"{top}assignment4.py": "x = 1\n", f"{top}utils.py": "u = 1\n",
               f"{top}submission_metadata.yml": PLANTED, f"{top}submission_1/handin.zip": HANDIN,
               f"{top}submission_2/handin.zip": HANDIN}
    (tmp_path / "mal.zip").write_bytes(make_zip(planted))
    (tmp_path / "s1.zip").write_bytes(HANDIN)
    found = find_handins([tmp_path / "mal.zip", tmp_path / "s1.zip"])
    assert sorted(rows(found)) == ["mal", "s1"] and {h.lms for h in found.handins} == {""}
    assert rows(found)["mal"].name == "mal.zip" and not found.strays


def test_two_ids_that_one_safe_name_would_merge_stay_two_students(tmp_path):
    meta = "".join(f"submission_{n}:\n  :submitters:\n  - :sid: '{sid}'\n  :created_at: 2026-04-14 1{n // 111}:"
                   f"00:00 +02:00\n" for n, sid in ((111, "2400001"), (222, "2400001."), (333, "a b"),
                                                    (444, "a/b")))
    members = {"export/submission_metadata.yml": meta} | {f"export/submission_{n}/handin.zip": HANDIN
                                                         for n in (111, 222, 333, 444)}
    for path in both(tmp_path, "gs", members):
        found = find_handins([path])
        by = {h.upload: h.student for h in found.handins}
        assert len(set(by.values())) == 4, by
        assert by["submission_111"] == "2400001"              # an id already safe keeps its name
        assert by["submission_222"] != "2400001" and by["submission_222"].startswith("2400001")
        assert all(s.replace("-", "").replace("_", "").replace(".", "").isalnum() for s in by.values())
    again = find_handins([both(tmp_path, "late", {k: v for k, v in members.items() if "111" not in k})[0]])
    assert {h.upload: h.student for h in again.handins}["submission_222"] == by["submission_222"]   # every run


def test_canvas_and_moodle_ids_are_unchanged(tmp_path):
    download = tmp_path / "d"
    as_folder(download, {"ann_11111_22222_handin.zip": HANDIN, "bob_33333_44444_handin.zip": HANDIN})
    assert sorted(rows(find_handins([download]))) == ["11111", "33333"]
    zipped = tmp_path / "m.zip"
    zipped.write_bytes(make_zip({"Ann_1001_assignsubmission_file_/h.zip": HANDIN}))
    assert list(rows(find_handins([zipped]))) == ["1001"]
