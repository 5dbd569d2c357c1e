"""Unpacking hand-ins: junk dropped, folders stripped, nested zips opened, dangerous zips refused."""

import io
import stat
import zipfile
from pathlib import Path

import pytest

from grader.intake.find import discover
from grader.intake.handin import Handin, HandinError, student_id, unpack
from grader.intake.listing import zip_entries
from grader.rubric import Files
from tests.corpus import Files as HandinFiles, write_zip, zip_bytes

CODE = "print('code')\n"
LOGS = Path(__file__).parent / "data" / "logs"
RUN = (LOGS / "a4_reference.log").read_text()   # a run's stdout: found by what it holds


def make_zip(members: dict) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in members.items():
            if isinstance(data, zipfile.ZipInfo):
                z.writestr(data, b"target")
            else:
                z.writestr(name, data)
    return buffer.getvalue()


def unpack_bytes(data: bytes, tmp_path, limits=None):
    return unpack(Handin(name="h.zip", student="h", sha256="x", zip_bytes=data), tmp_path / "out", limits or Files())


def test_the_four_files_are_found_by_name_after_junk_and_a_leading_folder_are_dropped(tmp_path):
    data = make_zip({"hw4/assignment4.py": CODE, "hw4/utils.py": "u", "hw4/assignment4-77.log": RUN,
                     "hw4/assignment4-77.err": "e", "__MACOSX/hw4/._assignment4.py": "junk",
                     "hw4/.DS_Store": "junk", "hw4/__pycache__/utils.cpython-311.pyc": "junk"})
    unpacked = unpack_bytes(data, tmp_path)
    assert {r: p.name for r, p in unpacked.files.items()} == {
        "assignment": "assignment4.py", "utils": "utils.py", "log": "assignment4-77.log", "err": "assignment4-77.err"}
    assert unpacked.files["assignment"].parent == unpacked.root
    assert any("left out 3 file(s)" in n for n in unpacked.notes)
    assert any("inside a folder 'hw4/'" in n for n in unpacked.notes)


def test_a_zip_inside_the_zip_is_opened_once(tmp_path):
    inner = make_zip({"a4/assignment4.py": CODE, "a4/utils.py": "u"})
    unpacked = unpack_bytes(make_zip({"handin.zip": inner, "__MACOSX/._handin.zip": "junk"}), tmp_path)
    assert unpacked.files["assignment"].read_text() == CODE
    assert any("inside another zip, handin.zip" in n for n in unpacked.notes)


def test_of_several_runs_the_latest_log_and_its_err_are_used(tmp_path):
    data = make_zip({"assignment4.py": CODE, "assignment4-100.log": RUN, "assignment4-100.err": "",
                     "assignment4-205.log": RUN, "assignment4-205.err": "", "notes.txt": "it was hard\n"})
    unpacked = unpack_bytes(data, tmp_path)
    assert unpacked.files["log"].name == "assignment4-205.log"
    assert unpacked.files["err"].name == "assignment4-205.err"
    assert unpacked.notes == ["the run's log: of 2 runs, used assignment4-205.log (a run of other code than this "
                              "assignment4.py, finished on 4 ranks); left aside: assignment4-100.log (older)"]


@pytest.mark.parametrize("members,log,err", [
    ({"slurm-4242.out": RUN}, "slurm-4242.out", "slurm-4242.out"),           # Slurm's default: both streams
    ({"job.stdout": RUN, "job.stderr": "W torch\n"}, "job.stdout", "job.stderr"),
    ({"output_1_77.txt": RUN, "error_1_77.err": ""}, "output_1_77.txt", "error_1_77.err"),
    ({"run": RUN}, "run", "run"),                                             # no extension
    ({"assignment4-9.log": RUN}, "assignment4-9.log", None),                  # the handout's name, .err missing
])
def test_a_runs_files_are_found_by_what_they_hold_whatever_their_names(tmp_path, members, log, err):
    unpacked = unpack_bytes(make_zip({"assignment4.py": CODE, **members}), tmp_path)
    assert unpacked.files["log"].name == log
    assert (unpacked.files["err"].name if "err" in unpacked.files else None) == err


@pytest.mark.parametrize("name,message", [
    ("../evil.py", "points outside the hand-in"),
    ("a/../../evil.py", "points outside the hand-in"),
    ("/etc/evil.py", "absolute path"),
    ("C:/evil.py", "absolute path"),
])
def test_members_that_would_escape_are_refused(tmp_path, name, message):
    with pytest.raises(HandinError, match=message):
        unpack_bytes(make_zip({"assignment4.py": CODE, name: "x"}), tmp_path)
    assert not (tmp_path / "evil.py").exists() and not (tmp_path.parent / "evil.py").exists()


def test_symbolic_links_are_refused(tmp_path):
    link = zipfile.ZipInfo("utils.py")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    with pytest.raises(HandinError, match="is a symbolic link"):
        unpack_bytes(make_zip({"assignment4.py": CODE, "utils.py": link}), tmp_path)


def test_a_zip_bomb_is_refused_while_extracting(tmp_path):
    data = make_zip({"assignment4.py": CODE, "big.log": b"\0" * (3 << 20)})
    with pytest.raises(HandinError, match="over the 1 MB limit|more than the limits allow"):
        unpack_bytes(data, tmp_path, Files(max_member_mb=1, max_total_mb=2))


def test_lying_sizes_do_not_get_past_the_limit(tmp_path):
    data = bytearray(make_zip({"assignment4.py": CODE, "big.log": b"\0" * (3 << 20)}))
    # Declare big.log as 10 bytes in the central directory; the real size is found while extracting.
    entry = data.rfind(b"PK\x01\x02")
    data[entry + 24:entry + 28] = (10).to_bytes(4, "little")
    with pytest.raises(HandinError):
        unpack_bytes(bytes(data), tmp_path, Files(max_member_mb=1, max_total_mb=2))


def test_too_many_members_are_refused(tmp_path):
    data = make_zip({"assignment4.py": CODE, **{f"f{i}.txt": "" for i in range(30)}})
    with pytest.raises(HandinError, match="31 members, more than the 20 allowed"):
        unpack_bytes(data, tmp_path, Files(max_members=20))


def test_a_directory_of_too_many_entries_is_refused_from_its_end_record_before_it_is_parsed(tmp_path):
    """70,000 entries: past 65,535 the count is in the zip64 end record. The count the zip says is
    refused before the directory is parsed (millions of entries cost the grader gigabytes there)."""
    data = make_zip({"assignment4.py": CODE, **{f"f{i}": "" for i in range(69_999)}})
    assert zip_entries(data) == 70_000 and zip_entries(make_zip({"a": "", "b": ""})) == 2
    assert zip_entries(b"not a zip") == -1
    with pytest.raises(HandinError, match="70000 members, more than the 500 allowed"):
        unpack_bytes(data, tmp_path)


def test_folders_deeper_than_a_hand_in_has_are_refused(tmp_path):
    """A member 1100 folders deep would make a folder whose walks (rglob, rmtree) overflow the
    grader's stack; refused by the depth of its name, before anything is written."""
    for depth in (15, 1100):
        data = make_zip({"assignment4.py": CODE, "d/" * depth + "x.txt": ""})
        if depth == 15:
            assert unpack_bytes(data, tmp_path / "ok").files["assignment"].name == "assignment4.py"
            continue
        with pytest.raises(HandinError, match="a member is 1100 folders deep, more than the 15"):
            unpack_bytes(data, tmp_path / "deep")
        assert not (tmp_path / "deep" / "out" / "d").exists()


def test_member_names_that_are_not_utf8_are_refused(tmp_path):
    data = bytearray(make_zip({"assignment4.py": CODE, "xx.txt": ""}))
    data = bytes(data).replace(b"xx.txt", b"\xff\xfe.txt")
    with pytest.raises(HandinError, match="not valid UTF-8"):
        unpack_bytes(data, tmp_path)


def test_no_assignment_file_says_what_to_hand_in(tmp_path):
    with pytest.raises(HandinError, match=r"no assignment4.py in the hand-in \(found: utils.py\)"):
        unpack_bytes(make_zip({"utils.py": "u"}), tmp_path)


def test_a_corrupt_zip_is_refused_with_its_name(tmp_path):
    with pytest.raises(HandinError, match="h.zip: not a readable zip file"):
        unpack_bytes(b"PK\x03\x04 this is not a zip", tmp_path)


def test_discover_finds_zips_folders_and_bulk_downloads(tmp_path):
    one = zip_bytes(HandinFiles(code=CODE))
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "alice.zip").write_bytes(one)
    (tmp_path / "bulk.zip").write_bytes(make_zip({"Bob Smith_1001_assignsubmission_file/hw4.zip": one,
                                                  "Eve Ray_1002_assignsubmission_file/hw4.zip": one}))
    folder = inbox / "carol"
    folder.mkdir()
    (folder / "assignment4.py").write_text(CODE)
    (inbox / "notes.txt").write_text("not a hand-in")
    (inbox / "broken.zip").write_bytes(b"not a zip")
    found, problems = discover([inbox, tmp_path / "bulk.zip"], r"_(?P<id>\d+)_")
    assert problems == [("broken.zip", "broken.zip: not a readable zip file; ask for the hand-in again")]
    assert sorted(h.student for h in found) == ["1001", "1002", "alice", "carol"]
    assert sorted(h.name for h in found if h.folder is None)[0] == "alice.zip"


def test_a_download_inside_a_folder_of_hand_ins_is_a_hand_in_never_expanded(tmp_path):
    one = zip_bytes(HandinFiles(code=CODE))
    (tmp_path / "alice.zip").write_bytes(one)
    (tmp_path / "bulk.zip").write_bytes(make_zip({"Bob Smith_1001_assignsubmission_file_/hw4.zip": one,
                                                  "Eve Ray_1002_assignsubmission_file_/hw4.zip": one}))
    found, problems = discover([tmp_path])
    assert sorted(h.student for h in found) == ["alice", "bulk"] and not problems


def test_student_ids_come_from_the_pattern_or_the_name():
    assert student_id("alice.zip", r"(?P<id>.+)") == "alice"
    assert student_id("Jane Doe_12345_assignsubmission_file_hw4.zip", r"^[^_]+_(?P<id>\d+)_") == "12345"
    assert student_id("no digits here.zip", r"_(?P<id>\d+)_") == "no_digits_here"
    assert student_id("../../etc/passwd.zip", r"(?P<id>.+)") == "etc_passwd"


def test_a_batch_holds_where_each_hand_in_is_not_its_bytes(tmp_path):
    """Finding 30 hand-ins of 2 MB each (a big NCCL log apiece) costs about one hand-in's bytes at a
    time, and keeps none of them: each is read again when it is graded."""
    import os
    import tracemalloc
    for i in range(30):
        log = os.urandom(1 << 20).hex()   # 2 MB that do not compress
        write_zip(tmp_path / f"student{i}.zip", HandinFiles(code=CODE, log=log))
    tracemalloc.start()
    found, problems = discover([tmp_path])
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert problems == [] and len(found) == 30
    assert held < 1 << 20 and peak < 8 << 20, (held, peak)
    unpacked = unpack(found[7], tmp_path / "out", Files())
    assert unpacked.files["assignment"].read_text() == CODE
