"""Packaging a hand-in: the four files at the top of a real zip, the newest run, and every refusal
with a message that says what to do. A kit-shaped working folder per test, holding the reference
and the session's real run of it (made by slurm/run-local.sh) where Slurm leaves runs: the top folder."""

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from grader import cli
from grader.intake.handin import Handin, unpack
from grader.rubric import Files as Limits
from grader.student.package import DEFAULT_ZIP, PackageError, collect, package, runs
from tests.corpus import DATA, REFERENCE, ROOT, UTILS, mutate, refingerprint

pytestmark = pytest.mark.student   # make test-student runs these; make test leaves them out

RUN_AGAIN = "run it again with this code (slurm/run-local.sh)"   # the session's run is run-local.sh's


@pytest.fixture
def kit(tmp_path, monkeypatch, reference_run_files):
    """The kit's top folder, as the current folder: assignment_4/ with the reference and utils.py,
    and the run's .log and .err beside it."""
    (tmp_path / "assignment_4").mkdir()
    shutil.copyfile(REFERENCE, tmp_path / "assignment_4" / "assignment4.py")
    shutil.copyfile(UTILS, tmp_path / "assignment_4" / "utils.py")
    for path in reference_run_files:
        shutil.copyfile(path, tmp_path / path.name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refused(capsys, *args) -> str:
    """Run `python -m grader package ARGS`; assert it refused, wrote no zip, and return its message."""
    assert cli.main(["package", *args]) == 2
    assert not DEFAULT_ZIP.exists()
    err = capsys.readouterr().err
    assert err.startswith("package: refused: ")
    return err


def test_the_zip_holds_exactly_the_four_files_at_its_top_level_as_the_grader_expects(kit, reference_run_files):
    log, err = reference_run_files
    done = package()
    assert done.zip == DEFAULT_ZIP and done.world_size == 4
    with zipfile.ZipFile(DEFAULT_ZIP) as z:
        assert z.namelist() == ["assignment4.py", "utils.py", log.name, err.name]
        assert z.read("assignment4.py") == REFERENCE.read_bytes()
        assert z.read(log.name) == log.read_bytes()
    unpacked = unpack(Handin(name="h.zip", student="h", sha256="", zip_bytes=DEFAULT_ZIP.read_bytes()),
                      kit / "unpacked", Limits())
    assert {role: p.name for role, p in unpacked.files.items()} == {
        "assignment": "assignment4.py", "utils": "utils.py", "log": log.name, "err": err.name}
    assert unpacked.notes == []


def test_the_newest_run_is_taken_from_the_code_folder_or_the_current_folder(kit, reference_run_files):
    log, _ = reference_run_files
    older = kit / "assignment4-100.log"
    newer = kit / "assignment_4" / "assignment4-205.log"
    for path, when in ((older, 1_000), (newer, 2_000), (kit / log.name, 500)):
        shutil.copyfile(log, path)
        path.with_suffix(".err").write_text("")
        os.utime(path, (when, when))
    (kit / "pip.log").write_text("Collecting torch\n")   # newest of all, but not a run's log
    assert runs([kit / "assignment_4", kit])[:2] == [newer, older]
    sources = collect()
    assert (sources.log.resolve(), sources.err.resolve()) == (newer, newer.with_suffix(".err"))
    assert collect(log=older).err == older.with_suffix(".err")


def test_a_log_without_its_err_is_refused(kit, capsys, reference_run_files):
    log, err = reference_run_files
    (kit / err.name).unlink()
    message = refused(capsys)
    assert f"{log.name} has no .err beside it ({err.name})" in message
    assert "--err FILE" in message and RUN_AGAIN in message


def test_a_run_that_did_not_finish_is_refused(kit, capsys, reference_run, reference_run_files):
    text, _ = reference_run
    # Killed at its time limit: rank 3 never printed "done" and the job footer was never written.
    cut = "".join(line for line in text.splitlines(keepends=True)
                  if line.strip() != "[Rank 3] done" and not line.startswith("[Job] finished"))
    (kit / "assignment4-999.log").write_text(cut)
    (kit / "assignment4-999.err").write_text("slurmstepd: error: *** JOB 999 CANCELLED DUE TO TIME LIMIT ***\n")
    os.utime(kit / "assignment4-999.log", (4e9, 4e9))
    # Beside a complete run of the same code, the newer cut one is left aside, and said so.
    assert collect().log.name == reference_run_files[0].name
    assert "left aside: assignment4-999.log (did not finish)" in collect().note
    for path in reference_run_files:
        (kit / path.name).unlink()
    message = refused(capsys)
    assert "assignment4-999.log: the run did not finish: rank 3 never printed 'done'" in message
    assert "footer is missing" in message and message.lower().count("did not finish") == 1
    assert "assignment4-999.err says: Slurm stopped the job at its time limit" in message
    assert RUN_AGAIN in message and "package with --partial" in message


def test_a_log_of_other_code_than_the_file_being_zipped_is_refused(kit, capsys, reference_run_files):
    code = kit / "assignment_4" / "assignment4.py"
    code.write_text(code.read_text() + "\n# tidied up after the run\n")
    message = refused(capsys)
    assert f"{reference_run_files[0].name} was written by other code than assignment_4/assignment4.py" in message
    assert "the file changed after that run" in message and RUN_AGAIN in message


def test_a_folder_without_assignment4_py_is_refused(kit, capsys):
    (kit / "assignment_4" / "assignment4.py").unlink()
    message = refused(capsys)
    assert "assignment_4/ has no assignment4.py in it" in message
    assert "give the folder that holds your assignment4.py" in message
    assert "no such file or folder" in refused(capsys, "hw4")


def test_no_run_at_all_and_no_utils_are_refused_with_what_to_do(kit, capsys, reference_run_files):
    for path in reference_run_files:
        (kit / path.name).unlink()
    message = refused(capsys)
    assert "no log of a run in assignment_4/ or ./" in message
    assert "run the job first (sbatch slurm/assignment4.sbatch" in message and "--log FILE" in message
    (kit / "assignment_4" / "utils.py").unlink()
    assert "no utils.py beside assignment_4/assignment4.py" in refused(capsys)


def test_only_a_zip_is_written(kit):
    with pytest.raises(PackageError, match="a hand-in is a .zip file"):
        package(out="handin.tar")


def test_a_lone_slurm_out_holding_both_streams_is_the_run(kit, capsys, reference_run_files):
    """Slurm's default: stdout and stderr in slurm-<jobid>.out, no .err; the cluster's own lines first."""
    for path in reference_run_files:
        (kit / path.name).unlink()
    out = kit / "slurm-5151.out"
    out.write_text(refingerprint((DATA / "logs" / "slurm-48213.out").read_text(), REFERENCE.read_text()))
    done = package()
    assert (done.sources.log, done.sources.err, done.world_size) == (out.relative_to(kit), out.relative_to(kit), 4)
    with zipfile.ZipFile(DEFAULT_ZIP) as z:
        assert z.namelist() == ["assignment4.py", "utils.py", "slurm-5151.out"]
    DEFAULT_ZIP.unlink()
    assert cli.main(["package", "--log", "slurm-5151.out"]) in (0, 1)
    printed = capsys.readouterr().out
    assert "run:   slurm-5151.out (stdout and stderr in one file) (job slurm-5151, world size 4" in printed
    assert "files:   assignment4.py, utils.py, slurm-5151.out (stdout and stderr)" in printed


def test_of_several_runs_the_complete_one_of_this_code_is_taken_and_said(kit, capsys, reference_run_files):
    log, err = reference_run_files
    other = kit / "assignment4-777.log"   # the newest, but a run of the file before its last change
    other.write_text(refingerprint(log.read_text(), "an older assignment4.py"))
    (kit / "assignment4-777.err").write_text("")
    os.utime(other, (4e9, 4e9))
    sources = collect()
    assert sources.log.name == log.name and sources.err.name == err.name
    assert sources.note == (f"the run's log: of 2 runs, used {log.name} (a run of this assignment4.py (its code "
                            f"sha256), finished on 4 ranks); left aside: assignment4-777.log (other code)")
    assert cli.main(["package"]) == 0
    assert sources.note in capsys.readouterr().out


def test_a_slurm_jobs_run_is_named_as_the_slurm_job(kit, capsys, reference_run_files):
    """The command to run again is the one that made the run: a Slurm job's log names sbatch."""
    log, err = reference_run_files
    for path in reference_run_files:
        (kit / path.name).unlink()
    (kit / "slurm-5151.out").write_text(refingerprint((DATA / "logs" / "slurm-48213.out").read_text(),
                                                      "not this file"))
    message = refused(capsys)
    assert "was written by other code than assignment_4/assignment4.py" in message
    assert "run it again with this code (sbatch slurm/assignment4.sbatch)" in message


@pytest.mark.timeout(600)
def test_a_run_that_crashed_in_part_3_is_refused_once_then_handed_in_as_partial_work(tmp_path, monkeypatch, capsys):
    """A mutant that crashes on rank 1 in Part 3, run as students run it (slurm/run-local.sh, 4
    ranks): package says once what did not finish and names run-local.sh; with --partial it
    zips the run, and the check of the zip counts Parts 1 and 2's log."""
    (tmp_path / "assignment_4").mkdir()
    (tmp_path / "assignment_4" / "assignment4.py").write_text(mutate("crash_on_one_rank"))
    shutil.copyfile(UTILS, tmp_path / "assignment_4" / "utils.py")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", A4_TIMEOUT_S="20")
    proc = subprocess.run([str(ROOT / "slurm" / "run-local.sh"), "--nproc", "4", "--out", str(tmp_path),
                           str(tmp_path / "assignment_4" / "assignment4.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, proc.stdout
    log = next(tmp_path.glob("assignment4-local-*.log"))
    monkeypatch.chdir(tmp_path)

    message = refused(capsys)
    assert f"{log.name}: the run did not finish: " in message and message.lower().count("did not finish") == 1
    assert "no rank printed 'done'; the job ended with status 1" in message
    assert f"{log.with_suffix('.err').name} says: Rank 1 raised RuntimeError: rank 1 lost its way" in message
    assert "run it again with this code (slurm/run-local.sh)" in message and "sbatch" not in message
    assert "package with --partial" in message

    assert cli.main(["package", "--partial"]) == 1   # written; the check shows Part 3 failing
    printed = capsys.readouterr().out
    assert "did not finish, made by slurm/run-local.sh, written by this very assignment4.py" in printed
    assert printed.count("what did not finish:") == 1 and "Rank 1 raised RuntimeError" in printed
    assert "handed in as partial work (--partial): the log shows Part 1, Part 2 matching on every rank" in printed
    with zipfile.ZipFile(DEFAULT_ZIP) as z:
        assert sorted(z.namelist()) == sorted(["assignment4.py", "utils.py", log.name, log.with_suffix(".err").name])
    for part in (1, 2):   # the parts that finished: their re-runs pass, and their log counts
        assert re.search(rf"^Part {part}: [^\n]*?  passed +passed ", printed, re.M), printed
    assert re.search(r"^Part 3: [^\n]*?  crashed +failed ", printed, re.M), printed
    assert "is written as partial work: hand it in as it is, or fix the run, run it again (slurm/run-local.sh)" \
        in printed
