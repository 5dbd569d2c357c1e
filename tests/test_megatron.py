"""Part 5 (optional), Megatron's MLP block: its math against the reference's own code, and a
batch graded with the part turned on (the reference, the skeleton, a mutant per usual mistake),
and the course's rubric with it left off."""

import json

import pytest
import torch
import yaml

from grader.batch.run import grade_batch
from grader.rubric import Check, RubricError, load_rubric, rubric_from_dict
from grader.verdict import megatron
from tests.corpus import (MUTANTS, PART5, REFERENCE, ROOT, Files, built_on, fast_rubric, mutate, refingerprint,
                          skeleton, with_part5, without_optional, write_zip)
from tests.worlds import load_module, run_world

MLP_MUTANTS = sorted(n for n, m in MUTANTS.items() if m.part == "megatron_mlp")


@pytest.mark.stock_rubric
def test_the_stock_course_leaves_part_5_off():
    stock = load_rubric()
    assert "megatron_mlp" not in stock.parts and "megatron_mlp" not in stock.part_ids
    assert all("megatron_mlp" not in stock.parts_at(c) for c in stock.checks)


def test_a_rubric_turns_part_5_on_as_a_bonus_and_off_with_null():
    data = yaml.safe_load((ROOT / "grader" / "rubric.yaml").read_text())
    for part in {"megatron_mlp"} | built_on("megatron_mlp"):   # off with the parts that build on it
        data["parts"].pop(part, None)
    off = rubric_from_dict(data)
    assert "megatron_mlp" not in off.part_ids and all("megatron_mlp" not in off.parts_at(c) for c in off.checks)
    data = with_part5(data)   # the hidden widths a course's world sizes need, if any
    on = rubric_from_dict(data)
    assert "megatron_mlp" in on.part_ids and on.max_score == off.max_score   # a bonus: on top
    assert all("megatron_mlp" in on.parts_at(c) for c in on.checks)
    data["parts"]["megatron_mlp"] = None   # an overlay's way of turning it off
    assert rubric_from_dict(data).digest() == off.digest() != on.digest()
    data["parts"].update(PART5)
    data["checks"][0]["hidden_dim"] = 130
    with pytest.raises(RubricError, match="hidden_dim \\(130\\) is not divisible by world_size"):
        rubric_from_dict(data)


def test_a_check_part_5_cannot_split_is_refused_once_part_5_is_on_naming_check_and_numbers():
    """A course adds a hidden check of 3 ranks: fine without Part 5 (128 need not divide by 3),
    refused with it, naming the check, the width and what would divide."""
    data = {"checks": [{"name": "default"}, {"name": "three-ranks", "hidden": True, "world_size": 3, "seed": 8,
                                             "global_batch_size": 96, "input_dim": 10, "output_dim": 15,
                                             "accumulation_steps": 3}], "public_world_sizes": [4, 1, 2]}
    assert rubric_from_dict(data, "r.yaml").checks[-1].world_size == 3
    data["parts"] = dict(PART5)
    with pytest.raises(RubricError) as info:
        rubric_from_dict(data, "r.yaml")
    assert str(info.value) == (
        "r.yaml.checks[1] (three-ranks): Part 5 (optional): Megatron's MLP block splits the hidden width over the "
        "ranks, but hidden_dim (128) is not divisible by world_size (3): set the check's hidden_dim to a multiple "
        "of 3 (e.g. 126 or 129), or leave the part off")
    assert rubric_from_dict(with_part5(data), "r.yaml").checks[-1].hidden_dim == 129


def _reference_step(rank, world_size, config):
    """The reference's megatron_mlp_single_step at `config`, in one rank of a real gloo world."""
    module = load_module(REFERENCE)
    for key in ("global_batch_size", "input_dim", "hidden_dim"):
        setattr(module, key, config[key])
    w1, w2 = module.megatron_mlp_single_step(seed=config["seed"], device="cpu")
    return w1.tolist(), w2.tolist()   # plain lists: a tensor through the queue outlives no rank


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_the_graders_block_step_is_the_references(world_size):
    check = Check(world_size=world_size, seed=11, global_batch_size=8, input_dim=6, hidden_dim=12)
    block = megatron.seeded(check, 0.5)
    want = megatron.step(block, world_size)
    single = megatron.step(block, 1)
    assert torch.allclose(want[0], single[0]) and torch.allclose(want[1], single[1])
    config = {k: getattr(check, k) for k in ("seed", "global_batch_size", "input_dim", "hidden_dim")}
    ranks = run_world(world_size, _reference_step, config)
    assert len(ranks) == world_size
    for w1, w2 in ranks:
        w1, w2 = torch.tensor(w1, dtype=torch.float64), torch.tensor(w2, dtype=torch.float64)
        assert torch.allclose(w1, want[0], atol=1e-6) and torch.allclose(w2, want[1], atol=1e-6)


def test_a_block_holding_its_shards_as_nn_linear_does_has_their_gradients_taken_transposed():
    """fc1 and fc2 built on nn.Linear hold [hidden_dim / p, input_dim] and [input_dim, hidden_dim / p]:
    their gradients are the shards' transposed, the same values; wrong values are still named."""
    from types import SimpleNamespace
    from grader.rubric import Tolerance
    from grader.verdict.say import Say
    check = Check(world_size=4, seed=3, global_batch_size=8, input_dim=6, hidden_dim=12)
    block = megatron.seeded(check, 0.5)
    for rank in range(4):
        want = megatron.backward(block, 4, rank)
        extra = dict(want, w1_grad=want["w1_grad"].T.contiguous(), w2_grad=want["w2_grad"].T.contiguous())
        got = SimpleNamespace(weight=want["output"], extra=extra)
        assert megatron._backward_problem(got, rank, block, 4, Tolerance(), Say(check)) == ""
        extra["w1_grad"] = extra["w1_grad"] * 2
        assert "the gradient of W1's shard" in megatron._backward_problem(got, rank, block, 4, Tolerance(), Say(check))


def test_each_mistake_computes_something_else_than_the_block():
    check = Check(world_size=4, seed=3, global_batch_size=8, input_dim=6, hidden_dim=12)
    block, right = megatron.seeded(check, 0.5), None
    right = megatron.step(block, 4)
    for mistake in megatron.STEP_MISTAKES:
        w1, w2 = megatron.step(block, 4, mistake)
        assert not (torch.allclose(w1, right[0]) and torch.allclose(w2, right[1])), mistake
    want = megatron.backward(block, 4, rank=1)
    no_f = megatron.backward(block, 4, rank=1, mistake=megatron.Mistake.NO_F)
    assert torch.allclose(no_f["output"], want["output"]) and not torch.allclose(no_f["input_grad"], want["input_grad"])
    shares = sum(megatron.backward(block, 4, r, megatron.Mistake.NO_F)["input_grad"] for r in range(4))
    assert torch.allclose(shares, want["input_grad"])   # f's all-reduce sums the ranks' shares


@pytest.fixture(scope="module")
def graded_on(reference_run, tmp_path_factory):
    """A batch graded with Part 5 on: {student: grading.json} and the rubric."""
    tmp = tmp_path_factory.mktemp("part5")
    data = without_optional(yaml.safe_load((ROOT / "grader" / "rubric.yaml").read_text()))
    rubric_path = fast_rubric(tmp, **{k: v for k, v in with_part5(data).items() if k in ("parts", "checks")})
    log, err = reference_run
    inbox = tmp / "inbox"
    inbox.mkdir()
    handins = {"reference": REFERENCE.read_text(), "skeleton": skeleton(),
               **{name: mutate(name) for name in MLP_MUTANTS}}
    for name, code in handins.items():
        write_zip(inbox / f"{name}.zip", Files(code=code, log=refingerprint(log, code), err=err))
    out = tmp / "out"
    grade_batch([inbox], out, jobs=2, rubric_path=rubric_path, progress=False)
    results = {p.parent.name: json.loads(p.read_text()) for p in (out / "students").glob("*/grading.json")}
    return results, load_rubric(rubric_path), out


@pytest.mark.timeout(900)
@pytest.mark.optional   # the part graded in a batch: make test-optional
def test_the_reference_passes_part_5_at_every_check_with_its_log_and_bonus(graded_on):
    results, rubric, out = graded_on
    r = results["reference"]
    part = r["parts"]["megatron_mlp"]
    assert part["status"] == "passed", part["message"]
    assert [o["check"] for o in part["checks"]] == [c.name for c in rubric.checks]
    assert part["log"]["passed"] and part["score"] == rubric.parts["megatron_mlp"].log + rubric.parts["megatron_mlp"].rerun
    bonus = sum(p.log + p.rerun for p in rubric.parts.values() if p.bonus)   # Part 5's, and any other's on
    assert r["max_score"] == rubric.max_score and r["score"] == rubric.max_score + bonus
    assert "megatron_mlp" in (out / "grades.csv").read_text().splitlines()[0]


@pytest.mark.optional   # the part graded in a batch: make test-optional
def test_the_skeleton_reports_part_5_not_implemented(graded_on):
    part = graded_on[0]["skeleton"]["parts"]["megatron_mlp"]
    assert part["status"] == "not_implemented" and "TODO in" in part["message"], part["message"]


@pytest.mark.parametrize("name", MLP_MUTANTS)
@pytest.mark.optional   # the part graded in a batch: make test-optional
def test_each_part_5_mistake_fails_part_5_with_its_diagnosis_and_costs_nothing_else(graded_on, name):
    results, rubric, _ = graded_on
    mutant, r = MUTANTS[name], results[name]
    part = r["parts"]["megatron_mlp"]
    assert part["status"] == "failed" and mutant.diagnosis in part["message"], part["message"]
    public = [o for o in part["checks"] if not o["hidden"]]
    assert all(o["status"] == "passed" for o in public) == mutant.hidden_only, part["message"]
    for other, p in r["parts"].items():
        if other in built_on("megatron_mlp"):   # its block is Part 5's: the mistake is its too
            assert p["status"] in ("passed", "failed"), (other, p["message"])
        elif other != "megatron_mlp":
            assert p["status"] == "passed" and p["score"] == rubric.parts[other].log + rubric.parts[other].rerun, \
                (other, p["message"])


@pytest.mark.parametrize("name", ["mlp_whole_on_every_rank", "mlp_whole_on_rank0_broadcast"])
@pytest.mark.optional   # the part graded in a batch: make test-optional
def test_a_part_5_step_taken_whole_on_one_rank_earns_nothing_of_the_step(graded_on, name):
    """Each rank's seed draws weights real in its own shards only: the single-device step on any one
    rank's full copy (recomputed on every rank, or on rank 0 and broadcast) fails every step check of
    more ranks, and the one-rank step checks it passes earn nothing. Its block is the reference's:
    the backward checks pass and keep their share."""
    results, rubric, _ = graded_on
    checks = {c.name: c for c in rubric.checks}
    part = results[name]["parts"]["megatron_mlp"]
    for o in part["checks"]:
        check = checks[o["check"]]
        if check.kind == "backward":
            assert o["status"] == "passed" and o["points"] == o["max_points"] > 0, o["message"]
        elif check.world_size > 1:
            assert o["status"] == "failed" and "the single-device MLP's step on" in o["message"], o["message"]
        else:
            assert o["status"] == "passed" and o["points"] == 0, o
    backward = sum(o["max_points"] for o in part["checks"] if checks[o["check"]].kind == "backward")
    assert part["rerun_points"] == round(backward, rubric.score_decimals) < rubric.parts["megatron_mlp"].rerun
