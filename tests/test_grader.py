"""The grader on a corpus of real hand-in zips: the reference, the skeleton, a mutant per usual
mistake, broken and hostile packaging, a hand-in written to the handout word for word. Graded
in one batch (two jobs at once) with short timeouts; each test then reads the outputs."""

import csv
import json
import re
import shutil

import pytest
import torch

from grader import kit, results as results_module
from grader.batch.run import grade_batch
from grader.parts import BY_ID, CORE_PART_IDS, PART_IDS
from grader.rerun.executor import SandboxUnavailable
from grader.results import Cause, read_canary
from grader.rubric import load_rubric
from tests.corpus import (
    DATA,
    MUTANTS,
    REFERENCE,
    UTILS,
    Files,
    built_on,
    fast_rubric,
    graded_mutants,
    mutant_params,
    mutate,
    refingerprint,
    skeleton,
    write_zip,
    zip_bytes,
)

LOGS = DATA / "logs"
# The rubric the batch below is graded with (fast_rubric: this one with short timeouts): every
# number these tests expect is read from it.
RUBRIC = load_rubric()
WEIGHTS = {c.name: c.weight for c in RUBRIC.checks}
CHECKS = {c.name: c for c in RUBRIC.checks}
# The time the whole corpus takes to grade on two cores: each optional part a course turns on adds
# its work to every check's world.
GRADING_S = 600 + 300 * sum(BY_ID[p].optional for p in RUBRIC.part_ids)
POINTS = {part: (points.log, points.rerun) for part, points in RUBRIC.parts.items()}
FULL = sum(p.log + p.rerun for p in RUBRIC.parts.values())   # the reference's score: bonus points included
# The checked-in sample logs are runs of Parts 1-4: with an optional part on, its log points are not in them.
SAMPLE_FULL = FULL - sum(RUBRIC.parts[p].log for p in RUBRIC.part_ids if BY_ID[p].optional)
HIDDEN = [c for c in RUBRIC.checks if c.hidden]


def num(x) -> str:
    """A score as grades.csv writes it."""
    return f"{x:g}"


def corpus(reference_run) -> dict:
    log, err = reference_run
    ref = REFERENCE.read_text()
    handins = {"reference": Files(code=ref, log=log, err=err)}
    for name in graded_mutants(RUBRIC):
        code = mutate(name)
        handins[name] = Files(code=code, log=refingerprint(log, code), err=err)
    skel = skeleton()
    handins["skeleton_forged_log"] = Files(code=skel, log=refingerprint(log, skel), err=err)
    three = skeleton(filled=[p for p in PART_IDS if p != "tensor_parallel"])
    handins["tensor_parallel_todo"] = Files(code=three, log=refingerprint(log, three), err=err)
    handins["stale_log"] = Files(code=ref + "\n# tidied up after the run\n", log=log, err=err)
    handins["modified_utils"] = Files(code=ref, log=log, err=err,
                                      utils=UTILS.read_text().replace("is_close = torch.allclose(a, b, rtol=tol, atol=tol)",
                                                                      "is_close = True"))
    handins["missing_err"] = Files(code=ref, log=log, err=None)
    handins["no_code"] = Files(code=None, log=log, err=err)
    literal = DATA / "handout_literal"
    handins["handout_literal"] = Files(code=(literal / "assignment4.py").read_text(),
                                       utils=(literal / "utils.py").read_text(),
                                       log=(DATA / "logs" / "handout_cluster_4nodes.log").read_text(), err="")
    # Slurm's default: the run's stdout and stderr in slurm-<jobid>.out, no .err, the cluster's lines first.
    handins["slurm_default_out"] = Files(code=ref, log=refingerprint((LOGS / "slurm-48213.out").read_text(), ref),
                                         err=None, log_name="slurm-48213.out")
    # Two runs' logs: an earlier one of other code, killed at its time limit, and the one of this code.
    earlier = (LOGS / "a4_time_limit.log").read_text().replace("assignment4", "a4")
    handins["two_runs"] = Files(code=ref, log=refingerprint((LOGS / "output_2_48240.out").read_text(), ref),
                                err=(LOGS / "output_2_48240.err").read_text(), log_name="output_2_48240.out",
                                extra={"output_1_48199.out": earlier,
                                       "output_1_48199.err": (LOGS / "a4_time_limit.err").read_bytes()})
    return handins


@pytest.fixture(scope="session")
def graded(reference_run, tmp_path_factory):
    """Grade the whole corpus once; return (out folder, {student: grading.json}, summary, input folder)."""
    tmp = tmp_path_factory.mktemp("grading")
    inbox = tmp / "inbox"
    inbox.mkdir()
    for name, files in corpus(reference_run).items():
        write_zip(inbox / f"{name}.zip", files)
    # The reference once more, zipped as a folder inside a zip inside a zip, with macOS junk.
    log, err = reference_run
    inner = zip_bytes(Files(code=REFERENCE.read_text(), log=log, err=err,
                            extra={"hw4/__pycache__/utils.cpython-311.pyc": b"\0", "hw4/.DS_Store": b"\0"}), "hw4/")
    write_zip(inbox / "nested_junk.zip", Files(code=None, utils=None, log=None, err=None,
                                               extra={"handin.zip": inner, "__MACOSX/._handin.zip": b"\0"}))
    out = tmp / "out"
    summary = grade_batch([inbox], out, jobs=2, rubric_path=fast_rubric(tmp), progress=False)
    results = {p.parent.name: json.loads(p.read_text()) for p in (out / "students").glob("*/grading.json")}
    return out, results, summary, inbox, tmp


def parts_status(result):
    return {p: result["parts"][p]["status"] for p in RUBRIC.part_ids}


@pytest.mark.timeout(GRADING_S)   # the whole corpus is graded in this test's time
def test_reference_scores_full_marks(graded):
    _, results, summary, _, _ = graded
    r = results["reference"]
    assert (r["status"], r["score"], r["max_score"]) == ("graded", FULL, RUBRIC.max_score), r["message"]
    assert set(parts_status(r).values()) == {"passed"}
    assert r["flags"] == []
    assert summary.trouble == 0


def test_nested_zip_with_junk_is_normalised_and_scores_full_marks(graded):
    r = graded[1]["nested_junk"]
    assert r["score"] == FULL, r
    assert any("inside another zip" in n for n in r["notes"])
    assert any("inside a folder 'hw4/'" in n for n in r["notes"])


def test_skeleton_scores_zero_and_its_forged_log_earns_nothing(graded):
    r = graded[1]["skeleton_forged_log"]
    assert r["score"] == 0
    for part in r["parts"].values():
        assert part["status"] == "not_implemented"
        assert {o["status"] for o in part["checks"]} == {"not_implemented"}
        assert part["log"]["passed"] is True and part["log"]["points"] == 0
    assert "log_not_reproduced" in r["flags"]


@pytest.mark.parametrize("name", mutant_params(sorted(graded_mutants(RUBRIC))))
def test_each_mutant_fails_the_part_it_targets_with_its_diagnosis(graded, name):
    mutant = MUTANTS[name]
    r = graded[1][name]
    assert r["status"] == "graded"
    for part_id, part in r["parts"].items():
        if part_id == mutant.part or not mutant.part:
            assert part["status"] == mutant.status or (mutant.or_crashes and part["status"] == "crashed"), \
                part["message"]
            assert mutant.diagnosis in part["message"], part["message"]
            public = [o for o in part["checks"] if not o["hidden"]]
            assert all(o["status"] == "passed" for o in public) == mutant.hidden_only, part["message"]
            # The log counts only where the re-run at the first public check (the log's own
            # configuration) reproduces it: a 4 written into the code fails at 1 rank, not there.
            reproduced = public[0]["status"] == "passed"
            assert reproduced == (mutant.hidden_only or mutant.log_counts)
            assert part["log_points"] == (POINTS[part_id][0] if reproduced else 0)
            assert part["rerun_points"] == expected_rerun_points(part_id, part)
            # a part built on its code may not reproduce its log either (where a course turns one on)
            later = [p for p in built_on(part_id) & set(r["parts"])
                     if next(o for o in r["parts"][p]["checks"] if not o["hidden"])["status"] != "passed"]
            assert ("log_not_reproduced" in r["flags"]) == (not reproduced or bool(later)), later
        elif part_id in mutant.also:   # the code it broke is this part's too
            assert part["status"] == mutant.status, (part_id, part["message"])
        elif mutant.part and part_id in built_on(mutant.part):   # an optional part built on its code
            assert part["status"] in ("passed", "failed", "crashed"), (part_id, part["message"])
        else:
            assert part["status"] == mutant.others, (part_id, part["message"])
            if mutant.others == "passed":
                assert part["score"] == sum(POINTS[part_id])


def expected_rerun_points(part_id: str, part: dict) -> float:
    """A part's re-run points from the weights of the checks it passed, rounded as the rubric says:
    a parallel part's one-rank checks count only where it passed a check of their kind on more ranks."""
    passed = {o["check"] for o in part["checks"] if o["status"] == "passed"}
    if BY_ID[part_id].parallel and RUBRIC.one_rank_needs_parallel:
        proven = {CHECKS[n].kind for n in passed if CHECKS[n].world_size > 1}
        passed = {n for n in passed if CHECKS[n].world_size > 1 or CHECKS[n].kind in proven}
    share = sum(WEIGHTS[n] for n in passed) / sum(WEIGHTS[o["check"]] for o in part["checks"])
    return round(POINTS[part_id][1] * share, RUBRIC.score_decimals)


def test_a_data_parallel_step_without_its_all_reduce_earns_nothing_at_the_one_rank_checks_it_passes(graded):
    """One rank needs no collective: the checks it passes there show none of Part 3's work."""
    part = graded[1]["dp_no_allreduce"]["parts"]["data_parallel"]
    one_rank = [o for o in part["checks"] if o["world_size"] == 1]
    assert one_rank and all(o["status"] == "passed" and o["points"] == 0 < o["max_points"] for o in one_rank)
    assert all(o["status"] != "passed" for o in part["checks"] if o["world_size"] > 1)
    assert part["rerun_points"] == 0 and part["score"] == 0, part["message"]
    assert "what it passed at one rank earns nothing until it passes a check of more ranks" in part["message"]
    # A parallel part that passed a check of more ranks keeps its one-rank checks of that kind, where
    # it fails elsewhere (tp_no_f's step, say): code must also be right at world size 1.
    kept = []
    for r in graded[1].values():
        for part_id, part in r["parts"].items():
            many = {CHECKS[o["check"]].kind for o in part["checks"] if o["status"] == "passed" and o["world_size"] > 1}
            kept += [o for o in part["checks"] if BY_ID[part_id].parallel and part["status"] != "passed"
                     and o["status"] == "passed" and o["world_size"] == 1 and CHECKS[o["check"]].kind in many]
    assert kept and all(o["points"] == o["max_points"] > 0 for o in kept)


def test_every_score_is_rounded_once_and_the_same_number_reaches_every_file(graded):
    out, results, _, _, _ = graded
    rows = {row["student"]: row for row in csv.DictReader((out / "grades.csv").open())}
    decimals = RUBRIC.score_decimals
    for student, r in results.items():
        if r["score"] is None:
            continue
        assert r["score"] == round(r["score"], decimals), (student, r["score"])
        for part_id, part in r["parts"].items():
            assert part["score"] == round(part["score"], decimals) and \
                part["rerun_points"] == round(part["rerun_points"], decimals), (student, part_id, part["score"])
            assert float(rows[student][part_id]) == part["score"]
        assert float(rows[student]["score"]) == r["score"]
        gradescope = json.loads((out / "students" / student / "results.json").read_text())
        assert gradescope["score"] == r["score"]
        assert f"{r['score']:g}" in (out / "students" / student / "feedback.md").read_text()


def test_a_part_left_todo_costs_only_that_part_and_names_the_todo(graded):
    r = graded[1]["tensor_parallel_todo"]
    # Every other part filled in, the optional ones a course turns on too: each has its own f and g.
    assert parts_status(r) == {**{p: "passed" for p in RUBRIC.part_ids}, "tensor_parallel": "not_implemented"}
    assert r["score"] == FULL - sum(POINTS["tensor_parallel"])
    assert r["parts"]["tensor_parallel"]["message"] == \
        "not implemented yet: TODO in FullColumnParallelLinear.forward: X = ... (1 line)"


def test_slurms_default_out_with_stderr_inside_scores_full_marks_and_says_which_file(graded):
    r = graded[1]["slurm_default_out"]
    assert (r["score"], r["penalties"]) == (SAMPLE_FULL, {}), (r["notes"], r["flags"])
    assert r["files"]["log"] == r["files"]["err"] == "slurm-48213.out"
    assert "missing_err" not in r["flags"] and r["log"]["slurm"] == "the job script's own lines"
    assert any("slurm-48213.out" in n and "its stderr is in the same file" in n for n in r["notes"]), r["notes"]


def test_of_two_runs_the_complete_one_of_this_code_counts(graded):
    r = graded[1]["two_runs"]
    assert r["score"] == SAMPLE_FULL and r["files"] == {
        "assignment": "assignment4.py", "utils": "utils.py", "log": "output_2_48240.out", "err": "output_2_48240.err"}
    note = next(n for n in r["notes"] if "of 2 runs" in n)
    assert "used output_2_48240.out (a run of this assignment4.py (its code sha256), finished on 4 ranks)" in note
    assert "left aside: output_1_48199.out (other code)" in note


@pytest.mark.stock_rubric
def test_a_backward_check_and_a_four_node_check_run_part_4(graded):
    r = graded[1]["reference"]
    checks = {o["check"]: o for o in r["parts"]["tensor_parallel"]["checks"]}
    assert list(checks) == ["default", "default-1-rank", "default-2-ranks", "default-backward",
                            "default-backward-1-rank", "default-backward-2-ranks", "single-rank", "two-ranks",
                            "odd-sizes", "four-nodes", "layer-backward-2", "layer-backward-4"]
    assert len(r["parts"]["baseline"]["checks"]) == 7   # the backward checks run Part 4 only
    assert checks["layer-backward-4"]["collectives"]["all_reduce"] == 4   # f's backward, on every rank
    text = (graded[0] / "students" / "tp_no_f" / "feedback.md").read_text()
    assert "hidden check `layer-backward-2`: **failed**, the layer is wrong on every rank: each rank's gradient" in text


def test_a_log_from_other_code_earns_no_log_points(graded):
    r = graded[1]["stale_log"]
    assert "stale_log" in r["flags"]
    assert r["score"] == FULL - sum(log for log, _ in POINTS.values())
    assert any("written by different code" in n for n in r["notes"])


def test_a_modified_utils_is_reported_and_the_provided_one_used(graded):
    r = graded[1]["modified_utils"]
    assert r["score"] == FULL and "modified_utils" in r["flags"]
    assert any("is_close = True" in n for n in r["notes"])


def test_a_missing_err_costs_its_penalty(graded):
    r = graded[1]["missing_err"]
    penalty = RUBRIC.files.penalty_missing_err
    assert r["score"] == FULL - penalty and r["penalties"].get("missing_err", 0) == penalty
    assert "missing_err" in r["flags"]


def test_a_handin_without_code_is_invalid_with_a_message_and_no_score(graded):
    r = graded[1]["no_code"]
    assert (r["status"], r["score"]) == ("invalid", None)   # not a 0: the student hands in again
    assert "no assignment4.py in the hand-in" in r["message"]


def test_a_handin_written_to_the_handout_word_for_word_runs_on_cpu_and_its_f_backward_is_caught(graded):
    """Every step passes on a CPU-only machine. The original handout's BroadcastParallel.backward
    calls `ReduceOp.SUM` without importing it: the step never runs it, the backward checks do."""
    r = graded[1]["handout_literal"]
    optional = [p for p in RUBRIC.part_ids if BY_ID[p].optional]   # the handout has none: no such function
    assert parts_status(r) == {"baseline": "passed", "grad_accumulation": "passed", "data_parallel": "passed",
                               "tensor_parallel": "crashed", **{p: "crashed" for p in optional}}, r["parts"]
    failing = [o for o in r["parts"]["tensor_parallel"]["checks"] if o["status"] != "passed"]
    backward = [c for c in RUBRIC.checks if c.kind == "backward"]
    # At one rank f needs no all-reduce: its backward returns before the line that raises.
    assert [o["check"] for o in failing] == [c.name for c in backward if c.world_size > 1] != []
    # A hidden check says the exception's type and the hand-in's own line, never the message.
    hidden = next(o for o in failing if o["hidden"])
    assert hidden["message"].startswith("crashed: NameError at assignment4.py:")
    assert "in backward" in hidden["message"] and "ReduceOp" not in hidden["message"]
    tp = [c for c in RUBRIC.checks if "tensor_parallel" in c.parts()]
    # Every backward check's share is lost: the one-rank one too, since no backward check of more ranks passed.
    lost = POINTS["tensor_parallel"][1] * sum(c.weight for c in backward) / sum(c.weight for c in tp)
    lost += sum(sum(POINTS[p]) for p in optional)
    # Each part is rounded to score_decimals, then summed: within a last decimal of the exact difference.
    assert r["score"] == pytest.approx(FULL - lost, abs=10 ** -RUBRIC.score_decimals), (r["message"], r["notes"])
    assert "modified_utils" in r["flags"]


def test_grades_csv_has_a_row_per_handin_and_a_column_per_part(graded):
    out, results, _, _, _ = graded
    rows = list(csv.DictReader((out / "grades.csv").open()))
    assert list(rows[0]) == ["student", "score", "max_score", "status", *RUBRIC.part_ids, "flags", "source"]
    assert {row["student"] for row in rows} == set(results)
    ref = next(row for row in rows if row["student"] == "reference")
    assert (ref["score"], ref["baseline"], ref["tensor_parallel"], ref["status"]) == (
        num(FULL), num(sum(POINTS["baseline"])), num(sum(POINTS["tensor_parallel"])), "graded")
    assert ref["source"] == "reference.zip"
    no_code = next(row for row in rows if row["student"] == "no_code")
    assert (no_code["score"], no_code["status"]) == ("", "invalid")


def test_results_json_follows_gradescope_schema(graded):
    out = graded[0]
    for path in (out / "students").glob("*/results.json"):
        doc = json.loads(path.read_text())
        assert doc["output_format"] == "md" and isinstance(doc["score"], (int, float))   # invalid: 0 there
        assert set(doc["extra_data"]) >= {"sha256", "flags", "parts", "status"}
        for test in doc["tests"]:
            assert test["status"] in ("passed", "failed") and "max_score" in test
        names = [t["name"] for t in doc["tests"]]
        for part in RUBRIC.part_ids:
            assert any(n.startswith(part) and "re-run" in n for n in names)
            assert any(n.startswith(part) and "log" in n for n in names)
    doc = json.loads((out / "students" / "dp_summed" / "results.json").read_text())
    dp = next(t for t in doc["tests"] if t["name"].startswith("data_parallel") and "re-run" in t["name"])
    assert dp["status"] == "failed" and f"summed over the {RUBRIC.default_check.world_size} ranks" in dp["output"]
    hidden = [t for t in doc["tests"] if t["name"].endswith("hidden checks")]
    assert len(hidden) == sum(1 for part in RUBRIC.part_ids if any(part in RUBRIC.parts_at(c) for c in HIDDEN))
    assert {t["visibility"] for t in hidden} == {"after_due_date"}
    shown = json.dumps({k: v for k, v in doc.items() if k != "extra_data"})
    assert "hidden check 1" in shown and not any(c.name in shown for c in HIDDEN)


def test_feedback_names_hidden_checks_but_never_their_values(graded):
    out = graded[0]
    text = (out / "students" / "crash_on_one_rank" / "feedback.md").read_text()
    assert text.index("rank 1 raised RuntimeError") < text.index("Traceback")
    for path in list((out / "students").glob("*/feedback.md")) + list((out / "students").glob("*/results.json")):
        text = path.read_text()
        values = [f"{word} {getattr(c, key)}" for c in HIDDEN for word, key in (("seed", "seed"),
                  ("batch", "global_batch_size")) if getattr(c, key) != getattr(RUBRIC.default_check, key)]
        values += [f"{c.input_dim}x{c.output_dim}" for c in HIDDEN]
        for hidden in values + ["assignment#", "#.#", "#e-"]:   # nor digits masked in text
            assert hidden not in text, (path, hidden)
    text = (out / "students" / "dp_summed" / "feedback.md").read_text()
    assert all(f"hidden check `{c.name}`" in text for c in HIDDEN if "data_parallel" in c.parts())


@pytest.mark.stock_rubric
def test_a_number_written_into_the_code_is_said_once_where_it_is_made(graded):
    """The headline and the line under it agree, and a check's name keeps its digits (only the
    stock course's hidden checks vary accumulation_steps, which is what catches this)."""
    text = (graded[0] / "students" / "acc_hard_coded_steps" / "feedback.md").read_text()
    said = "each micro-batch loss was divided by 4 written into the code, not by accumulation_steps; it is " \
           "right where accumulation_steps is 4, as at checks 'default', 'default-1-rank' and 'default-2-ranks'"
    assert text.count(said) >= 2
    assert "; 3 more of the 7 checks fail too" in text   # the headline's count, apart from its list


def test_tracebacks_show_the_handins_own_frames_once(graded):
    text = (graded[0] / "students" / "does_not_parse" / "feedback.md").read_text()
    assert text.count('File "assignment4.py", line') == 1, text
    assert "Traceback: the same as Part 1's, above." in text
    assert "/grader/" not in text and "site-packages" not in text and "/tmp/" not in text
    crash = (graded[0] / "students" / "crash_on_one_rank" / "feedback.md").read_text()
    frames = [line for line in crash.splitlines() if line.strip().startswith("File ")]
    assert frames and all(line.strip().startswith(('File "assignment4.py"', 'File "utils.py"')) for line in frames)


def test_summary_has_pass_rates_common_failures_and_scores(graded):
    text = (graded[0] / "summary.md").read_text()
    assert "| Part 3: data parallel |" in text and "pass rate" in text
    dp_row = next(line for line in text.splitlines() if line.startswith("| Part 3: data parallel |"))
    assert "crashed (2)" in dp_row  # crash_on_one_rank and does_not_parse
    assert "## Scores" in text and "mean " in text


def _wrong_at(result) -> set:
    return {p for p, part in result["parts"].items() if part["status"] in ("failed", "crashed", "timeout", "oom")}


def test_the_report_has_the_numbers_of_grades_csv_and_the_results(graded):
    out, results, _, _, _ = graded
    numbers = json.loads((out / "analytics.json").read_text())
    rows = list(csv.DictReader((out / "grades.csv").open()))
    assert numbers["handins"] == len(rows) == len(results)
    # grades.csv writes six significant digits (100.454 for 100.4545 under a course's own points)
    assert numbers["scores"] == pytest.approx(sorted(float(row["score"]) for row in rows if row["score"]), abs=1e-3)
    # Pass rates per check x part: every attempted outcome counts.
    for check in RUBRIC.checks:
        for part in check.parts():
            outcomes = [o for r in results.values() for o in r["parts"][part]["checks"]
                        if o["check"] == check.name and o["status"] not in ("not_run", "infra_error")]
            assert numbers["pass_rates"][check.name][part] == {
                "passed": sum(o["status"] == "passed" for o in outcomes), "ran": len(outcomes)}, (check.name, part)
    # every check, in the order the results first show them (a course's added check may come last in
    # the rubric and before the backward checks in the results)
    assert sorted(c["check"] for c in numbers["checks"]) == sorted(c.name for c in RUBRIC.checks)
    # Diagnoses: each mutant's, under its part, with the hand-in that has it.
    for part in CORE_PART_IDS:
        expected = {}
        for student, r in results.items():
            said = [o["diagnosis"] for o in r["parts"][part]["checks"] if o["diagnosis"] and o["status"] != "passed"]
            if said:   # the first check's (public first)
                expected.setdefault(said[0], []).append(student)
        assert {d["diagnosis"]: d["handins"] for d in numbers["diagnoses"][part]} == \
            {d: sorted(s) for d, s in expected.items()}
        counts = [len(d["handins"]) for d in numbers["diagnoses"][part]]
        assert counts == sorted(counts, reverse=True)
    summed = next(d for d in numbers["diagnoses"]["data_parallel"] if MUTANTS["dp_summed"].diagnosis in d["diagnosis"])
    assert "dp_summed" in summed["handins"]
    # Co-failure: hand-ins with a score wrong at both parts (the diagonal: wrong at the part).
    scored = [r for r in results.values() if r["score"] is not None]
    matrix = numbers["cofailure"]["matrix"]
    for i, p in enumerate(CORE_PART_IDS):
        for j, q in enumerate(CORE_PART_IDS):
            assert matrix[i][j] == sum({p, q} <= _wrong_at(r) for r in scored), (p, q)
    wrong_checks = {s: {o["check"] for p in r["parts"].values() for o in p["checks"]
                        if o["status"] in ("failed", "crashed", "timeout", "oom")} for s, r in results.items()
                    if r["score"] is not None}
    names = numbers["cofailure"]["checks"]
    assert numbers["cofailure"]["by_check"] == [[sum({c, d} <= w for w in wrong_checks.values()) for d in names]
                                                for c in names]
    assert matrix[CORE_PART_IDS.index("data_parallel")][CORE_PART_IDS.index("data_parallel")] >= len(
        [m for m in MUTANTS.values() if m.part == "data_parallel" and m.status != "not_implemented"])
    # The reference passes every check: nobody-passes is never said of this rubric.
    assert not [x for x in numbers["look_at"] if x["why"].startswith("nobody passes")]


def test_the_report_is_one_page_with_one_embedded_image_per_plot_and_no_external_reference(graded):
    out = graded[0]
    page = (out / "report.html").read_text()
    assert page.count("<img ") == 3 and re.findall(r'data-plot="([^"]+)"', page) == ["scores", "pass rates", "co-failure"]
    assert all(src.startswith("data:image/svg+xml;base64,") for src in re.findall(r'src="([^"]*)"', page))
    assert not re.search(r"<script|<link|<iframe|@import|url\(|//[a-z]", page, re.I)
    for href in re.findall(r'href="([^"]*)"', page):   # links: files beside it, the hand-ins' feedback
        assert not re.match(r"[a-z]+:|/", href) and (out / href).is_file(), href
    assert "staff only" in page.lower() and all(f"<code>{c.name}</code>" in page for c in HIDDEN)
    assert "[report.html](report.html)" in (out / "summary.md").read_text()


def test_a_second_run_only_grades_what_changed(graded):
    out, results, _, inbox, tmp = graded
    rubric = fast_rubric(tmp)
    again = grade_batch([inbox], out, jobs=2, rubric_path=rubric, progress=False)
    assert (again.graded, again.cached) == (0, len(results))
    before = (out / "students" / "reference" / "grading.json").read_text()
    forced = grade_batch([inbox / "reference.zip"], out, rubric_path=rubric, force=True, progress=False)
    assert forced.graded == 1
    after = json.loads((out / "students" / "reference" / "grading.json").read_text())
    first = json.loads(before)
    for volatile in ("graded_at", "seconds"):
        first.pop(volatile), after.pop(volatile)
    for part in RUBRIC.part_ids:
        for o in first["parts"][part]["checks"] + after["parts"][part]["checks"]:
            o.pop("traceback", None)
            o.pop("max_abs_diff", None)   # the data is drawn afresh for every world: the same verdicts, other numbers
    assert first == after
    only = grade_batch([inbox], out, rubric_path=rubric, force=True, only=["missing_err"], progress=False)
    assert only.graded == 1


def test_a_changed_grader_grades_again_and_an_unchanged_one_reuses(graded, monkeypatch):
    """Cached results are keyed by the grader's own code (and utils.py), not by a version string."""
    out, results, _, inbox, tmp = graded
    rubric = fast_rubric(tmp)
    recorded = json.loads((out / "students" / "reference" / "grading.json").read_text())["grader_digest"]
    assert recorded == kit.source_digest()
    assert grade_batch([inbox / "reference.zip"], out, rubric_path=rubric, progress=False).cached == 1
    monkeypatch.setattr(kit, "source_digest", lambda: "a grader with a fix to its scoring")
    results_module.grader_digest.cache_clear()
    try:
        again = grade_batch([inbox / "reference.zip"], out, rubric_path=rubric, progress=False)
        assert (again.graded, again.cached) == (1, 0)
        assert json.loads((out / "students" / "reference" / "grading.json").read_text())["grader_digest"] == \
            "a grader with a fix to its scoring"
    finally:
        results_module.grader_digest.cache_clear()


def test_the_source_digest_covers_every_grader_source_and_utils(tmp_path):
    grader = tmp_path / "grader"
    shutil.copytree(kit.GRADER, grader, ignore=shutil.ignore_patterns("__pycache__"))
    utils = tmp_path / "utils.py"
    shutil.copyfile(kit.UTILS, utils)
    before = kit.source_digest(grader, utils)
    assert before == kit.source_digest()
    score = grader / "verdict" / "score.py"
    score.write_text(score.read_text() + "\n# a fix\n")
    assert kit.source_digest(grader, utils) != before
    score.write_text(score.read_text()[:-len("\n# a fix\n")])
    assert kit.source_digest(grader, utils) == before
    utils.write_text(utils.read_text() + "\n")
    assert kit.source_digest(grader, utils) != before


def test_the_source_digest_is_exactly_what_grading_depends_on(tmp_path):
    """The grading rooms, the shared modules and the torch version change it; the rooms that only
    read results or build trees and the rubric file (its digest is held on its own) do not (a comment there would
    otherwise regrade a whole course)."""
    grader = tmp_path / "grader"
    shutil.copytree(kit.GRADER, grader, ignore=shutil.ignore_patterns("__pycache__"))
    before = kit.source_digest(grader, kit.UTILS)
    for rel in ("integrity/similar.py", "grades/book.py", "instructor/release.py", "student/package.py",
                "gradescope/bundle.py", "rubric.yaml"):
        (grader / rel).write_text((grader / rel).read_text() + "\n# a comment\n")
        assert kit.source_digest(grader, kit.UTILS) == before, rel
    for rel in ("rerun/rank/worker.py", "verdict/compare.py", "batch/local.py", "rubric.py"):
        text = (grader / rel).read_text()
        (grader / rel).write_text(text + "\n# a fix\n")
        assert kit.source_digest(grader, kit.UTILS) != before, rel
        (grader / rel).write_text(text)
    assert kit.source_digest(grader, kit.UTILS) == before
    assert kit.source_digest(grader, kit.UTILS, torch=kit.torch_version() + ".post1") != before
    assert kit.torch_version().startswith(torch.__version__.split("+")[0])


@pytest.mark.timeout(600)
def test_a_result_graded_without_the_sandbox_is_never_reused_by_a_sandboxed_run(graded, tmp_path):
    """Both directions: `--sandbox off` regrades what auto graded, and auto what off graded; the same
    mode reuses."""
    out, _, _, inbox, tmp = graded
    rubric = fast_rubric(tmp)
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    reference = inbox / "reference.zip"
    mode = lambda: json.loads((copy / "students" / "reference" / "grading.json").read_text())["isolation"]["mode"]  # noqa: E731
    assert mode() == "auto"
    off = grade_batch([reference], copy, rubric_path=rubric, sandbox="off", progress=False)
    assert (off.graded, off.cached, mode()) == (1, 0, "off")
    assert grade_batch([reference], copy, rubric_path=rubric, sandbox="off", progress=False).cached == 1
    auto = grade_batch([reference], copy, rubric_path=rubric, progress=False)
    assert (auto.graded, auto.cached, mode()) == (1, 0, "auto")


def test_the_torchrun_executor_grades_like_the_warm_one(graded, tmp_path):
    # The default check at its own world size only: each torchrun world costs seconds to start.
    rubric = fast_rubric(tmp_path, checks=[{"name": "default"}], public_world_sizes=[])
    summary = grade_batch([graded[3] / "dp_summed.zip"], tmp_path / "out", rubric_path=rubric,
                          executor="torchrun", sandbox="off", progress=False)
    r = json.loads((tmp_path / "out" / "students" / "dp_summed" / "grading.json").read_text())
    assert summary.graded == 1
    assert r["parts"]["data_parallel"]["status"] == "failed"
    assert "summed over the 4 ranks" in r["parts"]["data_parallel"]["message"]
    assert parts_status(r)["tensor_parallel"] == "passed"
    assert r["isolation"]["sandbox"] == "none"


def test_the_torchrun_executor_refuses_to_run_hand_ins_unless_the_sandbox_is_off(graded, tmp_path):
    with pytest.raises(SandboxUnavailable, match="--sandbox off"):
        grade_batch([graded[3] / "dp_summed.zip"], tmp_path / "out", executor="torchrun", progress=False)


def test_when_gloo_cannot_start_every_result_is_infra_error_and_no_score_is_written(graded, tmp_path, monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "no-such-interface0")
    rubric = fast_rubric(tmp_path, checks=[{"name": "default"}])
    summary = grade_batch([graded[3] / "reference.zip", graded[3] / "skeleton_forged_log.zip"], tmp_path / "out",
                          rubric_path=rubric, progress=False)
    assert summary.statuses == {"infra_error": 2}
    assert summary.ungradable.startswith("Not graded: no hand-in has a score, because the reference solution fails")
    assert read_canary(tmp_path / "out").kind == Cause.MACHINE and "What to do: run `python -m grader doctor`" in \
        summary.ungradable   # gloo's own error: the machine, not the rubric's limits nor the reference
    rows = list(csv.DictReader((tmp_path / "out" / "grades.csv").open()))
    assert [row["score"] for row in rows] == ["", ""]
    doc = json.loads((tmp_path / "out" / "students" / "reference" / "results.json").read_text())
    assert "score" not in doc and all("score" not in t for t in doc["tests"])


def test_where_the_reference_cannot_run_in_its_memory_every_result_says_why_and_what_to_do(graded, tmp_path):
    """A rubric whose world memory no world of this Python fits in: the canary fails, and each result
    names limits.memory_mb with its number, what the reference used under the default, and the fix;
    a second try would fail alike, so no result says to grade it again."""
    rubric = fast_rubric(tmp_path, checks=[{"name": "default"}], limits={"memory_mb": 64})
    summary = grade_batch([graded[3] / "reference.zip"], tmp_path / "out", rubric_path=rubric, progress=False)
    assert summary.statuses == {"infra_error": 1}
    message = json.loads((tmp_path / "out" / "students" / "reference" / "grading.json").read_text())["message"]
    assert "limits.memory_mb (64 MB" in message and "raise limits.memory_mb" in message, message
    used = int(re.search(r"a world of the reference used (\d+) MB", message)[1])
    assert 64 < used < 4096 and read_canary(tmp_path / "out").kind == Cause.LIMITS, message
    assert "grade it again" not in message and "grading machine" not in message, message


def test_a_wrong_reference_is_named_with_its_part_and_diagnosis_and_doctor_fails_on_it(tmp_path, monkeypatch, capsys):
    """A reference without its gradient averaging runs and returns wrong weights: the canary blames
    the reference, naming Part 3 and the diagnosis, never the machine; `doctor`, which checks the
    reference's answers and not only that a world runs, exits 1 saying the same."""
    from grader.cli import main
    wrong = tmp_path / "assignment4.py"
    wrong.write_text(mutate("dp_summed"))
    monkeypatch.setattr(kit, "REFERENCE", wrong)
    rubric = fast_rubric(tmp_path, checks=[{"name": "default"}], public_world_sizes=[])
    handin = write_zip(tmp_path / "ann.zip", Files(code=REFERENCE.read_text()))
    summary = grade_batch([handin], tmp_path / "out", rubric_path=rubric, progress=False)
    canary = read_canary(tmp_path / "out")
    assert summary.statuses == {"infra_error": 1} and canary.kind == Cause.REFERENCE, canary
    assert canary.cause.startswith("the reference solution is wrong, not the machine or the students: its Part 3: "
                                   "data parallel ran at check 'default' and failed") and "summed over" in canary.cause
    assert "grading machine" not in summary.ungradable and "What to do: fix the reference" in summary.ungradable
    capsys.readouterr()
    assert main(["doctor", "--rubric", str(rubric)]) == 1
    said = capsys.readouterr().out
    assert "every part ran" in said and "the reference's answers: reference: the reference solution is wrong" in said
    assert "summed over" in said and "fix: fix the reference" in said


def test_grading_json_and_the_report_name_the_torch_build_that_graded(tmp_path):
    """torch's version alone does not tell its CUDA wheel ("2.13.0") from its CPU one: the build is named."""
    rubric = fast_rubric(tmp_path, checks=[{"name": "default"}], public_world_sizes=[])
    handin = write_zip(tmp_path / "ann.zip", Files(code=REFERENCE.read_text()))
    assert grade_batch([handin], tmp_path / "out", rubric_path=rubric, progress=False).graded == 1
    said = json.loads((tmp_path / "out" / "students" / "ann" / "grading.json").read_text())["torch"]
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
    assert said == f"{torch.__version__} ({build})"
    assert json.loads((tmp_path / "out" / "analytics.json").read_text())["run"]["torch"] == said
    assert said in (tmp_path / "out" / "report.html").read_text()
