"""The integrity report (python -m grader integrity) on a batch built here: hand-in zips with their
runs' logs, and the grading.json `grade` would have written for them. Each kind of evidence is
planted once and must be listed with its evidence; independent correct solutions in six styles,
two untouched skeletons and two hand-ins of the expected answers must not be."""

import csv
import re
import subprocess
import sys
from itertools import combinations

import pytest

from grader import kit
from grader.batch.outputs import load_views, write_outputs
from grader.cli import main
from grader.integrity import code as codes
from grader.integrity import similar
from grader.integrity.commands import default_common, run_integrity
from grader.integrity.evidence import find_pairs
from grader.integrity.facts import HandinFacts
from grader.integrity.report import BEGIN, integrity_note, link_summary
from tests.corpus import Files, mutate, refingerprint, skeleton, write_zip
from tests.integrity_corpus import HANDOUT, STYLES, disguise, fill, handout_fill, run_err, run_log, write_graded
from tests.integrity_planted import STUDENTS

UNNAMED = "differs from the reference by up to 3.142e-01 (mean 2.718e-02)"
WRONG_SIGN = "the step has the wrong sign: the weight moved up the gradient"
UNSCALED = "the micro-batch losses were not divided by accumulation_steps = 2: the update is 2 times too large"
SUMMED = "the gradients were summed over the 4 ranks, not averaged (the update is world_size = 4 times too large)"
# The independent hand-ins, name -> code, each with a run of its own. None of their pairs may be listed.
INDEPENDENT = {name: fill(answers) for name, answers in STYLES.items()}
INDEPENDENT |= {"expected_a": fill({}), "expected_b": "# Assignment 4, my hand-in\n" + fill({}),
                "skeleton_a": skeleton(), "skeleton_b": skeleton()}
# Two students who typed the expected answers into the skeleton, byte for byte alike: what everyone
# who types the handout's answers writes, never listed on that alone.
INDEPENDENT |= {"typed_a": fill({}), "typed_b": fill({})}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """(out, inbox): the planted batch, graded by hand, with a summary.md."""
    tmp = tmp_path_factory.mktemp("integrity")
    inbox, out = tmp / "inbox", tmp / "out"
    inbox.mkdir()
    handins = {}   # student -> (Files, wrong)
    for seed, (name, code) in enumerate(sorted(INDEPENDENT.items()), start=1):
        handins[name] = (Files(code=code, log=run_log(code, seed), err=run_err(seed)), ())
    # A copy: another style's code, renamed and reformatted (no comment left), with a run of its own.
    copy = disguise(INDEPENDENT["defensive"])
    handins["copier"] = (Files(code=copy, log=run_log(copy, 101), err=run_err(101)), ())
    # A copied run: the .log and .err of someone else's job, beside one's own (different) code.
    owner = mutate("baseline_wrong_sign")
    handins["log_owner"] = (Files(code=owner, log=run_log(owner, 102), err=run_err(102)), ())
    handins["log_borrower"] = (Files(code=mutate("acc_unscaled"), log=run_log(owner, 102), err=run_err(102)), ())
    # The same unexplained wrong weight at a hidden check, in hand-ins that share nothing else.
    for name, mutant, seed in (("wrong_a", "tp_returns_shard", 103), ("wrong_b", "baseline_no_step", 104)):
        code = mutate(mutant)
        handins[name] = (Files(code=code, log=run_log(code, seed), err=run_err(seed)),
                         [("tensor_parallel", "odd-sizes", "d1" * 32, UNNAMED)])
    # A usual mistake six hand-ins make: common (by default more than 5 share it), counted and not listed.
    for i in range(6):
        code = mutate("dp_summed") + f"\n# version {i}\n"
        handins[f"summed_{i}"] = (Files(code=code, log=run_log(code, 110 + i), err=run_err(110 + i)),
                                  [("data_parallel", "default", "5e" * 32, SUMMED)])
    # Someone else's log made to look like one's own: the code sha256 rewritten (the same job), and
    # the job header too (only the comparisons, in their printed order, are left).
    theirs = handins["functional"][0].log
    for name, mutant, header in (("relabel", "acc_zero_grad_in_loop", False), ("forger", "tp_returns_shard", True)):
        code = mutate(mutant) + f"# {name}\n"
        log = refingerprint(theirs, code)
        if header:
            log = re.sub(r"id=\d+ name=assignment4 started=\S+", "id=51234 name=assignment4 started=2026-11-30T09:00:00Z", log)
        handins[name] = (Files(code=code, log=log, err=run_err(120 + len(name))), ())
    # Usual mistakes: two hand-ins sharing them in two parts (listed, moderate), two sharing one (not
    # listed on that alone), and the copied-run pair sharing one (shown beside its other evidence).
    usual = [("grad_accumulation", "two-ranks", "ac" * 32, UNSCALED), ("data_parallel", "default", "da" * 32, SUMMED)]
    one = [("data_parallel", "default", "0d" * 32, SUMMED)]
    for name, wrong in (("unscaled_a", usual), ("unscaled_b", usual), ("one_a", one), ("one_b", one)):
        code = mutate("acc_unscaled") + f"# {name}\n"
        handins[name] = (Files(code=code, log=run_log(code, 130 + len(handins)), err=run_err(130 + len(handins))),
                         wrong)
    for name in ("log_owner", "log_borrower"):
        handins[name] = (handins[name][0], [("baseline", "default", "b5" * 32, WRONG_SIGN)])
    # A run of another student's code (a file with lines of its own): its log's code sha256 is
    # sha_owner's assignment4.py.
    shared = fill(STUDENTS["manual"])
    handins["sha_owner"] = (Files(code=shared, log=run_log(shared, 105), err=run_err(105)), ())
    handins["sha_runner"] = (Files(code=mutate("dp_no_allreduce"), log=run_log(shared, 106), err=run_err(106)), ())
    for name, (files, wrong) in handins.items():
        write_graded(out, name, write_zip(inbox / f"{name}.zip", files), files.log, wrong)
    write_outputs(load_views(out), out, 100.0)
    return out, inbox


@pytest.fixture(scope="module")
def listed(batch):
    """The command run on the batch: (exit code, {(a, b): csv row}, integrity.md)."""
    out, inbox = batch
    code = main(["integrity", str(out), str(inbox)])
    rows = list(csv.DictReader((out / "integrity.csv").open()))
    return code, {(r["student_a"], r["student_b"]): r for r in rows}, (out / "integrity.md").read_text()


def test_the_command_writes_both_files_and_says_what_they_are(listed, batch):
    code, rows, md = listed
    assert code == 0
    assert md.splitlines()[0].startswith("# Integrity report")
    assert "evidence for a person to weigh, never a verdict" in md.split("## ")[0]
    assert list(rows) and all(set(r) == {"student_a", "student_b", "strength", "evidence"} for r in rows.values())
    assert "## Taken as common" in md and "wrong weights (usual mistakes)" in md


def test_a_copied_log_pair_is_listed_as_the_same_run(listed):
    row = listed[1][("log_borrower", "log_owner")]
    assert row["strength"] == "strong"
    assert "the same run: identical .log bytes" in row["evidence"]
    assert "identical .err bytes" in row["evidence"]
    assert "job 48102 on node[1-4]" in row["evidence"]


def test_a_renamed_copy_without_comments_is_listed_with_its_lines(listed):
    row = listed[1][("copier", "defensive")]
    assert row["strength"] == "strong"
    assert "the same code beyond the skeleton" in row["evidence"]
    assert "same run" not in row["evidence"] and "sha256" not in row["evidence"]
    section = listed[2].split("copier and defensive")[1].split("###")[0]
    # the copy's lines (Python 3.10's ast.unparse, which disguised it, writes its target in parentheses) ...
    assert "xb, yb = (pair[0], pair[1])" in section or "(xb, yb) = (pair[0], pair[1])" in section
    assert "inputs, targets = data[0], data[1]" in section   # ... beside the original's


def test_the_same_unexplained_wrong_weight_is_listed(listed):
    row = listed[1][("wrong_a", "wrong_b")]
    assert row["strength"] == "strong"
    assert "the same wrong behaviour" in row["evidence"] and "hidden check 'odd-sizes'" in row["evidence"]
    assert "cannot name" in row["evidence"]


def test_a_log_relabelled_with_ones_own_code_sha256_is_the_same_job(listed):
    row = listed[1][("functional", "relabel")]
    assert row["strength"] == "strong"
    assert "the same run: the same Slurm job: job 4800" in row["evidence"] and "on node[1-4], started" in row["evidence"]
    assert "the same 16 comparisons printed in the same order" in row["evidence"]


def test_a_log_with_a_new_job_header_still_shows_its_printed_order(listed):
    row = listed[1][("forger", "functional")]
    assert row["strength"] == "moderate"
    assert row["evidence"].startswith("the same run: the same 16 comparisons printed in the same order")
    assert "Slurm job" not in row["evidence"]


def test_usual_mistakes_shared_in_two_parts_are_moderate_and_in_one_not_listed_alone(listed):
    row = listed[1][("unscaled_a", "unscaled_b")]
    assert row["strength"] == "moderate"
    assert "the same wrong weight in 2 check(s)" in row["evidence"]
    assert "usual mistakes: the gradients were summed" in row["evidence"] and "were not divided by" in row["evidence"]
    assert not [pair for pair in listed[1] if "one_a" in pair or "one_b" in pair]
    assert "pairs sharing only weak evidence, one usual mistake" in listed[2]


def test_a_usual_mistake_is_shown_beside_other_evidence(listed):
    evidence = listed[1][("log_borrower", "log_owner")]["evidence"]
    assert "the same wrong behaviour: the same wrong weight in 1 check(s): baseline" in evidence
    assert "(weak)" in listed[2].split("log_borrower and log_owner")[1].split("###")[0]


def test_a_usual_mistake_many_make_is_common_not_listed(listed):
    assert not [pair for pair in listed[1] if pair[0].startswith("summed_")]


def test_a_shared_code_sha256_is_listed(listed):
    row = listed[1][("sha_owner", "sha_runner")]
    assert row["strength"] == "strong"
    assert "the same code sha256" in row["evidence"]
    assert "is sha_owner: its assignment4.py and the code its .log ran; sha_runner: the code its .log ran" \
        in row["evidence"]
    assert "line(s) of its own beyond the skeleton and the expected answers" in row["evidence"]


def test_byte_identical_expected_answers_are_weak_and_not_listed_alone(listed):
    """Two files of the skeleton with the expected answers typed in, byte for byte alike: not listed
    (everyone who types the handout's answers writes that file), and counted as weak."""
    assert ("typed_a", "typed_b") not in listed[1]
    assert "the skeleton with the expected answers byte for byte" in listed[2]


def test_only_the_planted_pairs_are_listed(listed):
    assert set(listed[1]) == {("log_borrower", "log_owner"), ("copier", "defensive"), ("wrong_a", "wrong_b"),
                              ("sha_owner", "sha_runner"), ("functional", "relabel"), ("forger", "functional"),
                              ("forger", "relabel"), ("unscaled_a", "unscaled_b")}


def test_independent_correct_solutions_are_not_listed(listed):
    rows = listed[1]
    among = [pair for pair in combinations(sorted(INDEPENDENT), 2) if pair in rows]
    assert among == [], [rows[p]["evidence"] for p in among]


def test_the_independent_styles_do_write_code_of_their_own():
    base = codes.Base.from_files()
    sizes = {name: codes.own_code(code, base).size for name, code in INDEPENDENT.items()}
    assert sum(size >= codes.K * 4 for size in sizes.values()) >= 5, sizes   # five styles with real own code
    assert sizes["skeleton_a"] == sizes["expected_a"] == sizes["expected_b"] == 0


def test_the_skeleton_contributes_nothing_renamed_or_not():
    base = codes.Base.from_files()
    for text in (kit.SKELETON.read_text(), disguise(kit.SKELETON.read_text()), kit.REFERENCE.read_text(),
                 disguise(fill({}))):
        assert codes.own_code(text, base).size == 0


def test_in_a_class_from_the_handout_a_copy_of_handout_code_is_not_listed_and_a_real_copy_is():
    """Six hand-ins written from the course's original handout (its code, not the kit's skeleton):
    one is the handout's code with its own answers, five answer in styles of their own. The copy
    of the first, renamed and without comments, shares every fingerprint of its own code, but
    that is the class's (the handout's, which most of the class holds): not listed. The same
    disguise of a style's hand-in is."""
    base = codes.Base.from_files()
    klass = {"handout": HANDOUT.read_text()} | {name: handout_fill(STYLES[name]) for name in
                                                 ("terse", "functional", "loops", "defensive", "einsum")}
    klass |= {"handout_copy": disguise(klass["handout"]), "terse_copy": disguise(klass["terse"])}
    owns = {name: codes.own_code(text, base) for name, text in klass.items()}
    assert owns["handout"].fingerprints == owns["handout_copy"].fingerprints   # the same own code
    assert owns["handout"].size > 10 * similar.MIN_TOKENS    # the handout's code counts as its own
    # ... until what most of the class holds is taken as what it was given, as the command does.
    template = codes.class_template(list(owns.values()))
    owns = {name: codes.without(own, template, base) for name, own in owns.items()}
    assert owns["handout"].size < similar.MIN_TOKENS < owns["terse"].size
    matches, common = similar.similar_pairs(owns, default_common(len(owns)))
    assert [(m.a, m.b) for m in matches] == [("terse", "terse_copy")], [(m.a, m.b, m.tokens_a) for m in matches]
    copy = matches[0]
    assert copy.share_a == copy.share_b == 1.0 and copy.strong


def test_code_saved_with_a_bom_and_windows_line_ends_is_read_as_python_reads_it():
    """An editor's byte-order mark and CRLF line ends change nothing Python runs: the code's tree,
    its definitions' lines (a hidden check's frames) and its own code's fingerprints are the same."""
    from grader import outline
    base = codes.Base.from_files()
    text = fill(STYLES["terse"])
    saved = "\ufeff" + text.replace("\n", "\r\n")
    assert outline.tree(saved) is not None and outline.spans(saved) == outline.spans(text)
    assert codes.own_code(saved, base).fingerprints == codes.own_code(text, base).fingerprints != set()


def test_code_that_does_not_parse_is_still_read_line_by_line():
    base = codes.Base.from_files()
    own = codes.own_code(mutate("does_not_parse"), base)
    assert own.size < 10   # the broken class line, not the rest of the file


def test_summary_links_the_report_and_unlinks_it_when_nothing_is_listed(listed, batch, tmp_path):
    out, _ = batch
    summary = (out / "summary.md").read_text()
    assert BEGIN in summary and "[integrity.md](integrity.md)" in summary and "strong" in summary
    assert link_summary(out) is False   # already current
    (tmp_path / "integrity.csv").write_text("student_a,student_b,strength,evidence\n")
    (tmp_path / "summary.md").write_text(f"# summary\n\n{BEGIN}\nold\n<!-- integrity: end -->\n")
    assert integrity_note(tmp_path) == ""
    link_summary(tmp_path)
    assert (tmp_path / "summary.md").read_text() == "# summary\n"


def test_hand_ins_not_found_are_named_and_grading_json_is_still_compared(batch, tmp_path):
    out, inbox = batch
    only = tmp_path / "only"
    only.mkdir()
    for name in ("wrong_a.zip", "log_owner.zip"):
        (only / name).write_bytes((inbox / name).read_bytes())
    report = run_integrity(out, [only])
    assert report.found == 2 and len(report.not_found) == report.handins - 2
    assert "wrong_b (wrong_b.zip): not found among the PATHs given" in report.not_found
    assert ("wrong_a", "wrong_b") in {(p.student_a, p.student_b) for p in report.pairs}   # from grading.json
    assert "## Hand-ins whose files were not read" in (out / "integrity.md").read_text()
    run_integrity(out, [inbox])   # leave the batch's report as the other tests read it


def test_results_without_weight_digests_say_so(tmp_path):
    inbox, out = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    code = mutate("dp_summed")
    files = Files(code=code, log=run_log(code, 7), err=run_err(7))
    write_graded(out, "old", write_zip(inbox / "old.zip", files), files.log, [("data_parallel", "default", "", SUMMED)])
    report = run_integrity(out, [inbox])
    assert report.wrong_checks == 1 and report.weight_digests == 0
    assert "records no `weight_digest`" in (out / "integrity.md").read_text()


def test_two_hand_ins_of_one_student_id_are_not_paired():
    one = HandinFacts(student="ann", source="bulk.zip!ann.zip", sha256="1", student_id="ann", code_sha256="ab" * 32)
    two = HandinFacts(student="ann~5e1f", source="late.zip!ann.zip", sha256="2", student_id="ann", code_sha256="ab" * 32)
    other = HandinFacts(student="bo", source="bo.zip", sha256="3", student_id="bo", code_sha256="ab" * 32)
    pairs, _ = find_pairs([one, two, other], common=3)
    assert [(p.student_a, p.student_b) for p in pairs] == [("ann", "bo"), ("ann~5e1f", "bo")]


def test_the_command_loads_no_torch():
    code = ("import sys\nfrom grader.integrity import commands\nprint('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=kit.ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_base_files_must_be_python_files_that_are_there(batch, tmp_path, capsys):
    out, inbox = batch
    assert main(["integrity", str(out), str(inbox), "--base", str(tmp_path / "handout.py")]) == 2
    assert f"--base {tmp_path / 'handout.py'}: no such file" in capsys.readouterr().err
    (tmp_path / "handout.md").write_text("# the handout\n")
    assert main(["integrity", str(out), str(inbox), "--base", str(tmp_path / "handout.md")]) == 2
    assert "not a .py file" in capsys.readouterr().err
    report = run_integrity(out, [inbox], base_files=[HANDOUT])
    assert str(HANDOUT) in report.base and f"`{HANDOUT}`" in (out / "integrity.md").read_text()
    run_integrity(out, [inbox])   # leave the batch's report as the other tests read it


def test_a_folder_that_was_not_graded_is_refused(tmp_path, capsys):
    assert main(["integrity", str(tmp_path)]) == 2
    assert "no students/*/grading.json" in capsys.readouterr().err


@pytest.mark.timeout(600)
@pytest.mark.torch
def test_the_same_wrong_code_graded_for_real_gets_one_digest_listed_and_regraded_alike(tmp_path):
    """Every world of a batch runs on the data of OUT's key: two hand-ins of the same wrong code get
    the same weight_digest at a check, the command lists them with the same wrong weight, and a
    regrade into the same OUT reproduces every digest."""
    import json
    import stat
    from grader.batch.run import grade_batch
    from tests.corpus import MUTANTS, fast_rubric
    inbox, out = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    wrong = mutate("dp_summed")   # and acc_unscaled: usual mistakes in two parts, listed on that alone
    for old, new in MUTANTS["acc_unscaled"].edits:
        wrong = wrong.replace(old, new)
    for seed, name in enumerate(("same_a", "same_b"), start=140):
        code = wrong + f"# {name}\n"
        write_zip(inbox / f"{name}.zip", Files(code=code, log=run_log(code, seed), err=run_err(seed)))
    rubric = fast_rubric(tmp_path, checks=[{"name": "default"}])

    def digests():
        found = {}
        for name in ("same_a", "same_b"):
            result = json.loads((out / "students" / name / "grading.json").read_text())
            found[name] = {(part, o["check"]): o["weight_digest"] for part, p in result["parts"].items()
                           for o in p["checks"] if o.get("weight_digest")}
        return found

    grade_batch([inbox], out, rubric_path=rubric, progress=False)
    assert stat.S_IMODE((out / ".data-key").stat().st_mode) == 0o600
    first = digests()
    assert first["same_a"] and first["same_a"] == first["same_b"]
    assert {("data_parallel", "default"), ("grad_accumulation", "default")} <= set(first["same_a"])
    run_integrity(out, [inbox], rubric_path=rubric)
    rows = {(r["student_a"], r["student_b"]): r for r in csv.DictReader((out / "integrity.csv").open())}
    assert "the same wrong weight" in rows[("same_a", "same_b")]["evidence"]
    key = (out / ".data-key").read_bytes()
    grade_batch([inbox], out, rubric_path=rubric, progress=False, force=True)
    assert (out / ".data-key").read_bytes() == key and digests() == first
