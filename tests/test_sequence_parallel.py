"""Sequence parallelism on the transformer block (optional, on Part 7): the verdict's math against
the reference's own code at several world sizes, the collectives' counts (an all-reduce in place of
a reduce-scatter named from the calls), the rubric's refusals (Part 7 off, a sequence that does not
divide), and a batch graded with the part turned on (the reference, the skeleton, a mutant per usual
mistake)."""

import json
from types import SimpleNamespace

import pytest
import torch
import yaml

from grader.batch.run import grade_batch
from grader.rerun.check import prepare_code, run_check
from grader.rerun.executor import WarmExecutor
from grader.rubric import Check, RubricError, load_rubric, rubric_from_dict
from grader.verdict import comm, sequence, transformer
from tests.corpus import (MUTANTS, PART8, REFERENCE, ROOT, Files, fast_rubric, mutate, refingerprint, skeleton,
                          with_part8, without_optional, write_zip)
from tests.worlds import load_module, run_world

PART = "sequence_parallel"
SP_MUTANTS = sorted(n for n, m in MUTANTS.items() if m.part == PART)
CHECK = dict(seed=11, global_batch_size=3, hidden_dim=16, num_heads=4, head_dim=4, seq_len=8)


def _reference_slices(rank, world_size, config):
    """The reference's sequence_parallel_forward_backward at `config`, in one rank of a real gloo
    world, with the single-device block's output and input gradient, as plain lists."""
    module = load_module(REFERENCE)
    for key, value in config.items():
        setattr(module, key, value)
    parallel = module.sequence_parallel_forward_backward(seed=config["seed"], device="cpu")
    single = module.block_single_device(seed=config["seed"], device="cpu")
    return [t.tolist() for t in (*parallel, *single)]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_the_graders_slices_are_the_references_and_the_single_blocks(world_size):
    check = Check(world_size=world_size, **CHECK)
    layer = transformer.seeded(check)
    want, block = sequence.ranks(layer, world_size), transformer.ranks(layer, 1)[0]
    s = check.seq_len // world_size
    for r, found in enumerate(want):   # rank r's slices of the single-device block's; Part 7's gradients
        mine = slice(r * s, (r + 1) * s)
        assert torch.allclose(found["output"], block["output"][:, mine])
        assert torch.allclose(found["input_grad"], block["input_grad"][:, mine])
        for name in ("ln1_weight", "ln1_bias", "ln2_weight", "ln2_bias"):   # all-reduced: whole on every rank
            assert torch.allclose(found[f"{name}_grad"], block[f"{name}_grad"]), name
    part7 = transformer.ranks(layer, world_size)
    for r in range(world_size):
        for name in ("qkv", "proj", "w1", "w2"):
            assert torch.allclose(want[r][f"{name}_grad"], part7[r][f"{name}_grad"]), (r, name)
    config = {k: getattr(check, k) for k in CHECK}
    for r, (out, grad_x, single_out, single_grad) in enumerate(run_world(world_size, _reference_slices, config)):
        mine = slice(r * s, (r + 1) * s)
        assert torch.allclose(torch.tensor(out, dtype=torch.float64), want[r]["output"], atol=1e-5)
        assert torch.allclose(torch.tensor(grad_x, dtype=torch.float64), want[r]["input_grad"], atol=1e-5)
        assert torch.allclose(torch.tensor(single_out)[:, mine], torch.tensor(out), atol=1e-5)
        assert torch.allclose(torch.tensor(single_grad)[:, mine], torch.tensor(grad_x), atol=1e-5)


def test_each_mistake_computes_something_else_and_only_ranks_of_several_tell():
    layer = transformer.seeded(Check(world_size=4, **CHECK))
    right = sequence.ranks(layer, 4)
    for mistake in sequence.ORDER:
        found = sequence.ranks(layer, 4, mistake)
        assert [n for n in right[1] if not torch.allclose(found[1][n], right[1][n])], mistake
        alone = sequence.ranks(layer, 1, mistake)[0]
        assert all(torch.allclose(alone[n], sequence.ranks(layer, 1)[0][n]) for n in alone), mistake
    ln = sequence.ranks(layer, 4, sequence.Mistake.LN_NOT_REDUCED)
    assert all(torch.allclose(ln[r]["output"], right[r]["output"]) for r in range(4))   # backward only
    assert torch.allclose(sum(f["ln1_weight_grad"] for f in ln), right[0]["ln1_weight_grad"])   # a partial sum


def _calls(**volumes) -> list:
    """A rank's recorded calls: one call per collective moving `volumes[collective]` values per rank."""
    ops = {"all_reduce": "all_reduce", "all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor"}
    return [{"op": ops[c], "numel": n if c == "all_reduce" else 5 * n, "reduce_op": None} for c, n in volumes.items()]


def test_an_all_reduce_beyond_the_layernorms_fails_and_is_named():
    check = Check(world_size=4, kind="backward", **CHECK)
    slice_, d = 3 * 2 * 16, 16
    right = _calls(all_gather=4 * slice_, reduce_scatter=4 * slice_, all_reduce=4 * d)
    assert comm.needed(PART, check) == {"all_gather": 4 * slice_, "reduce_scatter": 4 * slice_, "all_reduce": 4 * d}
    run = SimpleNamespace(comm=right)
    assert comm.shortfalls(PART, check, {r: run for r in range(4)}) == {}
    swapped = SimpleNamespace(comm=_calls(all_gather=4 * slice_, all_reduce=4 * d + 4 * 3 * 8 * 16))
    short = comm.shortfalls(PART, check, {r: swapped for r in range(4)})
    assert list(short) == ["reduce_scatter", "all_reduce"]
    said = comm.explain(PART, check, short, 4, sequence.Say(check))
    assert said.startswith("no rank called a reduce-scatter: Part 8 must reduce-scatter the attention's partial")
    assert "every rank all-reduced 1600 values in all, where Part 8 must all-reduce only the gradient of LN1's" in said
    assert comm.shortfalls("transformer_block", check, {r: swapped for r in range(4)}) == {}   # Part 7 caps none


def _rubric_data() -> dict:
    """The course's rubric, its optional parts off: each test turns on the parts it grades."""
    return without_optional(yaml.safe_load((ROOT / "grader" / "rubric.yaml").read_text()))


def test_the_part_needs_part_7_and_a_sequence_the_world_sizes_divide_listed_at_once():
    data = with_part8(_rubric_data())
    on = rubric_from_dict(data)
    assert on.part_ids[-2:] == ("transformer_block", PART) and on.max_score == load_rubric().max_score
    assert all((PART in on.parts_at(c)) == (c.kind == "backward") for c in on.checks)
    data["parts"]["transformer_block"] = None
    data["checks"][1]["seq_len"] = 6   # default-backward, at 4 ranks (and 1, 2)
    with pytest.raises(RubricError) as info:
        rubric_from_dict(data, "r.yaml")
    said = str(info.value)
    assert "2 problems" in said, said
    assert "builds on the code of Part 7 (optional): a transformer block in tensor parallel" in said
    assert "splits the sequence over the ranks, but seq_len (6) is not divisible by world_size (4)" in said


@pytest.mark.stock_rubric
def test_the_stock_course_leaves_the_part_off():
    stock = load_rubric()
    assert PART not in stock.parts and all(PART not in stock.parts_at(c) for c in stock.checks)


def test_the_reference_moves_exactly_what_the_part_says_and_passes_at_every_check(tmp_path):
    """The part's `moves` are the reference's real calls (four all-gathers and four reduce-scatters of
    a [B, S/p, d] slice, the LayerNorms' four gradients all-reduced, per rank at a check of several
    ranks; none at one), and the verdict passes the reference's values."""
    rubric = load_rubric(fast_rubric(tmp_path, **{k: v for k, v in with_part8(_rubric_data()).items()
                                                  if k in ("parts", "checks")}))
    executor = WarmExecutor("best")
    executor.start()
    try:
        for check in (c for c in rubric.checks if PART in rubric.parts_at(c)):
            run = run_check(executor, prepare_code(REFERENCE), check, rubric, tmp_path, [PART])[PART]
            assert run.status == "passed", (check.name, run.detail)
            needs = comm.needed(PART, check)
            assert bool(needs) == (check.world_size > 1), check.name
            for rank, r in run.ranks.items():
                assert {c: comm.moved(r.comm, c, check.world_size)[1] for c in needs} == needs, (check.name, rank)
    finally:
        executor.close()


@pytest.fixture(scope="module")
def graded_on(reference_run, tmp_path_factory):
    """A batch graded with sequence parallelism (and Parts 5-7) on: {student: grading.json}, the rubric."""
    tmp = tmp_path_factory.mktemp("sequence")
    rubric_path = fast_rubric(tmp, **{k: v for k, v in with_part8(_rubric_data()).items() if k in ("parts", "checks")})
    log, err = reference_run
    inbox = tmp / "inbox"
    inbox.mkdir()
    handins = {"reference": REFERENCE.read_text(),
               "skeleton": skeleton(("baseline", "grad_accumulation", "data_parallel", "tensor_parallel",
                                     "megatron_mlp", "vocab_parallel", "transformer_block")),
               **{name: mutate(name) for name in SP_MUTANTS}}
    for name, code in handins.items():
        write_zip(inbox / f"{name}.zip", Files(code=code, log=refingerprint(log, code), err=err))
    out = tmp / "out"
    grade_batch([inbox], out, jobs=2, rubric_path=rubric_path, progress=False)
    results = {p.parent.name: json.loads(p.read_text()) for p in (out / "students").glob("*/grading.json")}
    return results, load_rubric(rubric_path)


@pytest.mark.timeout(900)
@pytest.mark.optional   # the part graded in a batch: make test-optional
def test_the_reference_passes_the_part_at_every_check_with_its_log_and_bonus(graded_on):
    results, rubric = graded_on
    r = results["reference"]
    part = r["parts"][PART]
    assert part["status"] == "passed", part["message"]
    assert [o["check"] for o in part["checks"]] == [c.name for c in rubric.checks if c.kind == "backward"]
    assert part["log"]["passed"] and part["score"] == PART8[PART]["log"] + PART8[PART]["rerun"]
    assert r["max_score"] == rubric.max_score and r["score"] == rubric.max_score + 40   # four bonuses


@pytest.mark.optional   # the part graded in a batch: make test-optional
def test_the_skeleton_scores_nothing_in_the_part(graded_on):
    part = graded_on[0]["skeleton"]["parts"][PART]
    assert part["status"] == "not_implemented" and part["score"] == 0, part["message"]
    assert graded_on[0]["skeleton"]["parts"]["transformer_block"]["status"] == "passed"   # its own TODOs only


@pytest.mark.parametrize("name", SP_MUTANTS)
@pytest.mark.optional   # the part graded in a batch: make test-optional
def test_each_mistake_fails_the_part_with_its_diagnosis_and_costs_nothing_else(graded_on, name):
    results, rubric = graded_on
    mutant, r = MUTANTS[name], results[name]
    part = r["parts"][PART]
    assert part["status"] == "failed" and mutant.diagnosis in part["message"], part["message"]
    assert part["rerun_points"] < rubric.parts[PART].rerun
    for other, p in r["parts"].items():
        if other != PART:
            assert p["status"] == "passed", (other, p["message"])
