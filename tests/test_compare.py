"""Judging re-run weights: the closed form on the data a part was served, and the diagnoses of the usual mistakes."""

import re

import pytest
import torch
import yaml

from grader.rerun.wire import secret
from grader.rerun.check import PartRun, RankRun
from grader.results import Status
from grader.rubric import DEFAULT_RUBRIC, Check, RubricError, Tolerance, load_rubric, public_rubric, rubric_from_dict
from grader.verdict.compare import diagnose, expected, judge
from grader.parts.common import local_ranks
from grader.parts.tensor_parallel import tp_step
from grader.verdict.say import Say
from tests.worlds import closed_form_step
from tests.corpus import fitted

CHECK = Check(name="t", world_size=4, seed=5, global_batch_size=24, input_dim=7, output_dim=8, accumulation_steps=3)
HIDDEN = Check(name="h", hidden=True, world_size=4, seed=5, global_batch_size=24, input_dim=7, output_dim=8,
               accumulation_steps=3)
TOL = Tolerance()


def shards(w, p=4):
    cols = w.shape[1] // p
    return [w[:, j * cols:(j + 1) * cols] for j in range(p)]


@pytest.fixture(scope="module")
def exp():
    return expected(CHECK, 0.5)


def test_expected_is_the_closed_form_seeded_like_the_handout(exp):
    torch.testing.assert_close(exp.w1, closed_form_step(5, 24, 7, 8, 0.5), rtol=0, atol=0)


@pytest.mark.parametrize("part,make,words", [
    ("baseline", lambda e: e.w0.clone(), "did not change"),
    ("baseline", lambda e: 2 * e.w0 - e.w1, "wrong sign"),
    ("baseline", lambda e: e.w0 + 24 * 8 * (e.w1 - e.w0), "a sum, not a mean"),
    ("data_parallel", lambda e: e.w0 + 4 * (e.w1 - e.w0), "summed over the 4 ranks, not averaged"),
    ("data_parallel", lambda e: e.w0 + (e.w1 - e.w0) / 4, "averaged twice"),
    ("data_parallel", lambda e: e.step(slice(0, 6)), "rank 0 stepped on its own slice"),
    ("grad_accumulation", lambda e: e.w0 + 3 * (e.w1 - e.w0), "not divided by accumulation_steps = 3"),
    ("grad_accumulation", lambda e: e.step(slice(16, 24), 1 / 3), "only the last micro-batch"),
    ("tensor_parallel", lambda e: e.w1[:, :2], "one rank's shard of the columns"),
    ("tensor_parallel", lambda e: e.w1.T, "the transpose"),
    ("tensor_parallel", lambda e: torch.cat([e.w1[:, :2], e.w0[:, 2:]], 1), "right on rank 0's shard only (columns 0 to 1)"),
    ("tensor_parallel", lambda e: torch.cat([e.w1[:, 2:4], e.w1[:, :2], e.w1[:, 4:]], 1), "wrong order"),
    ("tensor_parallel", lambda e: e.w1 * float("nan"), "NaN or inf"),
    ("tensor_parallel", lambda e: e.w1 + 0.1, "differs from the reference by up to 1.000e-01"),
    # Shards joined along the wrong dimension, aliased, from the wrong gradient columns.
    ("tensor_parallel", lambda e: torch.cat(shards(e.w1), 0).reshape(7, 8), "joined along dimension 0 (the rows)"),
    ("tensor_parallel", lambda e: torch.stack(shards(e.w1), -1).reshape(7, 8), "interleaves their columns"),
    ("tensor_parallel", lambda e: torch.cat([shards(e.w1)[3]] * 4, 1), "the same shard, the last rank's"),
    ("tensor_parallel", lambda e: torch.cat([shards(e.w1)[1]] * 2 + shards(e.w1)[2:], 1), "appear more than once"),
    ("tensor_parallel", lambda e: e.w0 - (e.w0 - e.w1)[:, :2].repeat(1, 4), "took the step of rank 0's columns"),
    ("tensor_parallel", lambda e: e.w0 + 4 * (e.w1 - e.w0), "the mean over its own columns only"),
    # A micro-batch repeated, or the loop cut short; one rank's slice for every rank.
    ("grad_accumulation", lambda e: e.step(slice(0, 8)), "every accumulation step used the first micro-batch"),
    ("grad_accumulation", lambda e: e.step(slice(16, 24)), "every accumulation step used the last micro-batch"),
    ("grad_accumulation", lambda e: e.step(slice(0, 8), 1 / 3), "only the first micro-batch's gradient"),
])
def test_each_usual_mistake_is_named(exp, part, make, words):
    assert words in diagnose(make(exp).double(), exp, part, CHECK, 0, TOL)


@pytest.mark.parametrize("batch", [128, 256])
def test_a_summed_loss_is_named_whatever_the_batch(batch):
    """At B*O = 8192 the factor is large: the run's float32 rounding must not hide it."""
    check = Check(name="big", world_size=1, seed=42, global_batch_size=batch, input_dim=64, output_dim=32)
    exp = expected(check, 0.5)
    x, y, w0 = exp.x.float(), exp.y.float(), exp.w0.float()
    got = w0 - 0.5 * 2.0 * x.T @ (x @ w0 - y)   # the summed loss's step, in float32 as a run takes it
    assert "a sum, not a mean" in diagnose(got.double(), exp, "baseline", check, 0, TOL)


def test_one_ranks_slice_on_every_rank_is_told_from_each_rank_on_its_own(exp):
    first = exp.step(slice(0, 6))
    same = {r: first for r in range(4)}
    assert "on every rank the update is the gradient of rank 0's slice of the batch alone" in \
        diagnose(first, exp, "data_parallel", CHECK, 0, TOL, weights=same)
    own = {r: exp.step(slice(6 * r, 6 * r + 6)) for r in range(4)}
    assert "rank 0 stepped on its own slice" in diagnose(own[0], exp, "data_parallel", CHECK, 0, TOL, weights=own)


@pytest.mark.parametrize("part,key", [("data_parallel", "world_size"), ("grad_accumulation", "accumulation_steps")])
def test_a_number_written_into_the_code_is_told_from_dividing_twice(part, key):
    """At 2 ranks (2 micro-batches) a hard-coded 4 and dividing twice give the same weight; only the
    check the part passed, where 4 was right, tells them apart."""
    here = Check(name="two", hidden=True, world_size=2, seed=3, global_batch_size=12, input_dim=5, output_dim=4,
                 accumulation_steps=2)
    e = expected(here, 0.5)
    half = e.w0 + (e.w1 - e.w0) / 2
    twice = diagnose(half, e, part, here, 0, TOL, Say(here))
    assert "once too often" in twice or "averaged twice" in twice
    fixed = diagnose(half, e, part, here, 0, TOL, Say(here), passed=[Check(name="default")])
    assert fixed.endswith(f"divided by 4 written into the code, not by {key}; it is right where {key} is 4, as at "
                          f"check 'default'")
    # Every check passed with that number is named (hidden ones counted), never "only" one of them.
    more = [Check(name="default"), Check(name="big"), Check(name="secret", hidden=True)]
    said = diagnose(half, e, part, here, 0, TOL, Say(here), passed=more)
    assert said.endswith(f"right where {key} is 4, as at checks 'default', 'big' and 1 hidden check"), said
    alone = diagnose(half, e, part, here, 0, TOL, Say(here), passed=[Check(name="secret", hidden=True)])
    assert alone.endswith(f"divided by a fixed number written into the code, not by {key}; it is right where {key} "
                          f"is that number, as at 1 hidden check"), alone
    public = Check(**{**here.__dict__, "hidden": False})
    assert f"not by {key} (2 at this check)" in diagnose(half, e, part, public, 0, TOL, passed=[Check(name="default")])


def test_the_local_rank_where_the_global_rank_belongs_on_four_nodes():
    nodes = Check(name="n", world_size=4, nodes=4, seed=9, global_batch_size=8, input_dim=5, output_dim=8)
    e = expected(nodes, 0.5)
    assert local_ranks(nodes) == [0, 0, 0, 0] and local_ranks(Check(world_size=4, nodes=2)) == [0, 1, 0, 1]
    one_node = [Check(name="default", world_size=4)]
    tp = diagnose(tp_step(e, nodes, [0, 0, 0, 0]), e, "tensor_parallel", nodes, 0, TOL, passed=one_node)
    assert "every rank held the columns of its LOCAL_RANK" in tp and "dist.get_rank()" in tp
    assert torch.allclose(tp_step(e, nodes, [0, 1, 2, 3]), e.w1)
    dp = diagnose(e.step(slice(0, 2)), e, "data_parallel", nodes, 1, TOL, passed=one_node)
    assert "every rank used the slice of the batch of its LOCAL_RANK" in dp
    # Code that fails on one node as well is not blamed on the layout.
    assert "LOCAL_RANK" not in diagnose(e.step(slice(0, 2)), e, "data_parallel", nodes, 1, TOL)


def test_an_update_right_but_for_rounding_is_said_to_be_rounded_not_one_times_the_reference():
    e = expected(CHECK, 0.5)
    said = diagnose(e.w0 + 1.0007 * (e.w1 - e.w0), e, "data_parallel", CHECK, 0, TOL)
    assert said.startswith("the update is the reference's but for rounding") and "float16" in said, said
    assert "1.5 times" in diagnose(e.w0 + 1.5 * (e.w1 - e.w0), e, "data_parallel", CHECK, 0, TOL)


def test_a_hidden_checks_numbers_are_never_said():
    e = expected(HIDDEN, 0.5)
    for got, part in [(e.w0 + 0.75 * (e.w1 - e.w0), "baseline"), (e.w1 + 0.1, "baseline"),
                      (e.w0 + 4 * (e.w1 - e.w0), "data_parallel"), (e.w1[:, :2], "tensor_parallel"),
                      (torch.cat([e.w1[:, :2], e.w0[:, 2:]], 1), "tensor_parallel")]:
        said = diagnose(got, e, part, HIDDEN, 0, TOL, Say(HIDDEN))
        assert not any(ch.isdigit() for ch in said), said
    assert diagnose(e.w0 + 0.75 * (e.w1 - e.w0), e, "baseline", HIDDEN, 0, TOL, Say(HIDDEN)) == \
        "the update points the right way but is the wrong length (a constant factor off the reference's)"
    say = Say(HIDDEN, public=[CHECK])   # every number it has is a public check's: none is secret
    assert say.secrets == []
    say = Say(HIDDEN, public=[Check(name="default")])
    assert say.text("global_batch_size (24) is not divisible by 11 in assignment4.py, line 24") == \
        "global_batch_size (#) is not divisible by 11 in assignment4.py, line #"


def ranks_with(weight, comm=(), n=4):
    return {r: RankRun(rank=r, status="ok", weight=weight, comm=[dict(c) for c in comm]) for r in range(n)}


@pytest.fixture(scope="module")
def served():
    """Parts 3 and 4 at CHECK on data drawn as a world's leader draws it."""
    return {part: expected(CHECK, 0.5, secret.draw(part, 4, "step"), part) for part in ("data_parallel", "tensor_parallel")}


def test_each_rank_is_served_real_data_only_where_it_is_its_own(served):
    dp, tp = served["data_parallel"], served["tensor_parallel"]
    for r in range(4):
        x, y = dp.data(r)
        rows = slice(6 * r, 6 * r + 6)
        assert torch.equal(x[rows], dp.x[rows]) and torch.equal(y[rows], dp.y[rows])
        others = torch.ones(24, dtype=torch.bool)
        others[rows] = False
        assert not torch.isclose(x[others], dp.x[others]).any()
        x, y = tp.data(r)
        assert torch.equal(x, tp.x) and torch.equal(y[:, 2 * r:2 * r + 2], tp.y[:, 2 * r:2 * r + 2])
        assert not torch.isclose(y[:, :2 * r], tp.y[:, :2 * r]).any()
    assert not torch.equal(dp.x, expected(CHECK, 0.5).x)   # not the handout's seeded batch


def test_a_step_on_data_a_rank_does_not_own_is_a_wrong_weight_with_its_diagnosis(served):
    """Computing everything on one rank (and all-reducing nothing, or the closed form) is wrong."""
    dp, tp = served["data_parallel"], served["tensor_parallel"]
    for part, e in served.items():
        weights = {r: e.step(rank=r) for r in range(4)}   # each rank the step on all it was handed
        ranks = {r: RankRun(rank=r, status="ok", weight=w, comm=[{"op": "all_reduce", "numel": 56}])
                 for r, w in weights.items()}
        outcome = judge(PartRun(part, Status.PASSED, ranks), e, part, CHECK, TOL)
        assert outcome.status == Status.FAILED and outcome.failing_ranks == [0, 1, 2, 3]
        words = "never all-reduced the gradients" if part == "data_parallel" else "each rank took the whole step alone"
        assert words in outcome.message, outcome.message
    mean = dp.mean_step(lambda r: slice(None), 4)   # the whole batch's gradients, really all-reduced
    outcome = judge(PartRun("data_parallel", Status.PASSED, ranks_with(mean)), dp, "data_parallel", CHECK, TOL)
    assert "all-reduced, but of the wrong rows" in outcome.message
    honest = judge(PartRun("data_parallel", Status.PASSED, ranks_with(dp.mean_step(lambda r: slice(6 * r, 6 * r + 6), 4))),
                   dp, "data_parallel", CHECK, TOL)
    assert honest.status == Status.PASSED
    shards_right = torch.cat([tp.step(rank=r)[:, 2 * r:2 * r + 2] for r in range(4)], dim=1)
    assert judge(PartRun("tensor_parallel", Status.PASSED, ranks_with(shards_right)), tp, "tensor_parallel", CHECK,
                 TOL).status == Status.PASSED


def test_one_ranks_batch_broadcast_and_rows_taken_strided_are_named(served):
    """Code that ran right on a cluster, its batch made on one rank and broadcast (or its slices
    scattered), or its rows split rank::world_size: a re-run's ranks each own only their slice's
    rows (their columns' targets in Part 4), and the feedback says why the weight is wrong."""
    import torch
    from grader.parts.tensor_parallel import column_step
    dp, tp = served["data_parallel"], served["tensor_parallel"]
    for k in (0, 2):
        broadcast = dp.mean_step(lambda r: slice(6 * r, 6 * r + 6), 4, batch_of=lambda r: k)
        outcome = judge(PartRun("data_parallel", Status.PASSED, ranks_with(broadcast)), dp, "data_parallel", CHECK, TOL)
        assert outcome.status == Status.FAILED and f"every rank took its slice of rank {k}'s batch" in outcome.message
        hidden = judge(PartRun("data_parallel", Status.PASSED, ranks_with(broadcast)), dp, "data_parallel", HIDDEN, TOL)
        assert "rank 2" not in hidden.message and "broadcast" in hidden.message
        stepped = torch.cat([column_step(tp, r, r, r, r, 2, batch=k) for r in range(4)], dim=1)
        outcome = judge(PartRun("tensor_parallel", Status.PASSED, ranks_with(stepped)), tp, "tensor_parallel", CHECK, TOL)
        assert outcome.status == Status.FAILED and f"every rank stepped on rank {k}'s batch" in outcome.message
    strided = dp.mean_step(lambda r: slice(r, None, 4), 4)
    outcome = judge(PartRun("data_parallel", Status.PASSED, ranks_with(strided)), dp, "data_parallel", CHECK, TOL)
    assert outcome.status == Status.FAILED and "every world_size-th row" in outcome.message


def test_no_collective_a_rank_reports_decides_a_verdict(exp):
    """Right weights pass whatever the rank says it called; wrong ones fail whatever it says."""
    for comm in ((), [{"op": "all_reduce", "numel": 56}]):
        assert judge(PartRun("data_parallel", Status.PASSED, ranks_with(exp.w1.clone(), comm)), exp,
                     "data_parallel", CHECK, TOL).status == Status.PASSED
        assert judge(PartRun("data_parallel", Status.PASSED, ranks_with(exp.w0.clone(), comm)), exp,
                     "data_parallel", CHECK, TOL).status == Status.FAILED


def test_judge_passes_right_weights_and_names_the_failing_ranks(exp):
    ranks = ranks_with(exp.w1.clone(), [{"op": "all_reduce", "numel": 56}])
    assert judge(PartRun("data_parallel", Status.PASSED, ranks), exp, "data_parallel", CHECK, TOL).status == Status.PASSED
    ranks[2].weight = exp.step(slice(12, 18))
    outcome = judge(PartRun("data_parallel", Status.PASSED, ranks), exp, "data_parallel", CHECK, TOL)
    assert outcome.status == Status.FAILED and outcome.failing_ranks == [2]
    assert outcome.message.startswith("wrong weight on rank 2: rank 2 stepped on its own slice")


def test_a_reduce_where_an_all_reduce_belongs_says_what_was_seen(exp):
    ranks = ranks_with(exp.w1.clone(), [{"op": "reduce", "numel": 56}])
    for r in (1, 2, 3):
        ranks[r].weight = exp.step(slice(6 * r, 6 * r + 6), 0.25)
    outcome = judge(PartRun("data_parallel", Status.PASSED, ranks), exp, "data_parallel", CHECK, TOL)
    assert outcome.message.startswith("wrong weight on ranks 1, 2, 3: only rank 0 ends with the right weight: the "
                                      "gradients went through dist.reduce")
    assert "whole batch" not in outcome.message


def test_not_implemented_names_the_todo_that_is_left(exp):
    ranks = {r: RankRun(rank=r, status="not_implemented",
                        exception="NotImplementedError: TODO in single_step: loss = ... (1 line)") for r in range(4)}
    outcome = judge(PartRun("baseline", Status.NOT_IMPLEMENTED, ranks), exp, "baseline", CHECK, TOL)
    assert outcome.message == "not implemented yet: TODO in single_step: loss = ... (1 line)"


@pytest.mark.stock_rubric
def test_the_default_rubric_is_valid_and_adds_up_to_100():
    rubric = load_rubric()
    assert [(c.name, c.world_size, c.kind) for c in public_rubric(rubric).checks] == [
        ("default", 4, "step"), ("default-1-rank", 1, "step"), ("default-2-ranks", 2, "step"),
        ("default-backward", 4, "backward"), ("default-backward-1-rank", 1, "backward"),
        ("default-backward-2-ranks", 2, "backward")]
    assert rubric.max_score == 100
    assert [(c.world_size, c.nodes, c.kind) for c in rubric.checks] == [
        (4, 1, "step"), (1, 1, "step"), (2, 1, "step"),                       # the public check at 4, 1, 2 ranks
        (4, 1, "backward"), (1, 1, "backward"), (2, 1, "backward"),           # the layer alone, at the same
        (1, 1, "step"), (2, 1, "step"), (4, 1, "step"), (4, 4, "step"), (2, 1, "backward"), (4, 1, "backward")]
    assert not any(c.hidden for c in rubric.checks[:6]) and all(c.hidden for c in rubric.checks[6:])
    assert sum(c.weight for c in rubric.checks[:3]) == pytest.approx(1.0)   # together, the one public check's weight
    tp = sum(c.weight for c in rubric.checks)
    assert 28 * sum(c.weight for c in rubric.checks if c.kind == "backward") / tp == pytest.approx(14)   # the backward's share
    assert (rubric.log_min_world_size, rubric.log_min_nodes, rubric.log_slurm_job) == (4, 1, False)
    assert rubric.one_rank_needs_parallel and rubric.score_decimals == 2


def test_the_public_rubric_is_the_graders_public_checks_at_the_public_world_sizes():
    rubric = load_rubric()
    public = public_rubric(rubric)
    written = [c for c in rubric_from_dict(yaml.safe_load(DEFAULT_RUBRIC.read_text()) | {"public_world_sizes": []}).checks
               if not c.hidden]
    want = [(c.seed, c.global_batch_size, c.input_dim, c.output_dim, c.accumulation_steps, c.kind, size)
            for c in written for size in dict.fromkeys([c.world_size, *rubric.public_world_sizes])]
    assert [(c.seed, c.global_batch_size, c.input_dim, c.output_dim, c.accumulation_steps, c.kind, c.world_size)
            for c in public.checks] == want
    # Grading runs the very checks students' check runs: the feedback and check agree check by check.
    assert [c for c in rubric.checks if not c.hidden] == public.checks
    assert not any(c.hidden for c in public.checks) and public.default_check == rubric.default_check
    for key in ("parts", "tolerance", "learning_rate", "log_min_world_size", "log_min_nodes", "log_slurm_job",
                "timeouts", "limits", "files"):
        assert getattr(public, key) == getattr(rubric, key), key
    assert public_rubric(public) == public   # what the release ships derives to itself


def test_a_public_world_size_a_public_check_cannot_run_at_is_refused_naming_check_and_size():
    # Grading runs the public checks at every public world size too, so the rubric itself is refused.
    with pytest.raises(RubricError) as info:
        rubric_from_dict({"checks": [{"name": "default", "world_size": 2, "output_dim": 30}],
                          "public_world_sizes": [2, 1, 4]}, "r.yaml")
    assert str(info.value).startswith("r.yaml.public_world_sizes: 4 runs the public check 'default' at 4 ranks "
                                      "(as 'default-4-ranks'), where Part 4: full column-parallel tensor parallel "
                                      "splits W's columns over the ranks, but output_dim (30) is not divisible by "
                                      "world_size (4)")
    assert str(info.value).endswith("or leave 4 out of public_world_sizes")


@pytest.mark.parametrize("change,words", [
    # Each size a part splits, at a check that runs the part, with the part and the numbers named.
    ({"world_size": 3, "global_batch_size": 96, "output_dim": 16},
     "(wide): Part 4: full column-parallel tensor parallel splits W's columns over the ranks, but output_dim (16) "
     "is not divisible by world_size (3): set the check's output_dim to a multiple of 3 (e.g. 15 or 18)"),
    ({"world_size": 3, "global_batch_size": 100, "output_dim": 15},
     "(wide): Part 3: data parallel splits the batch over the ranks, but global_batch_size (100) is not divisible "
     "by world_size (3)"),
    ({"world_size": 2, "global_batch_size": 100, "accumulation_steps": 3},
     "(wide): Part 2: gradient accumulation splits the batch into micro-batches, but global_batch_size (100) is "
     "not divisible by accumulation_steps (3)"),
])
def test_a_check_whose_sizes_a_part_cannot_split_is_refused_naming_check_part_and_numbers(change, words):
    data = yaml.safe_load(DEFAULT_RUBRIC.read_text())
    data["checks"].append({"name": "wide", "hidden": True, "seed": 3, **change})
    with pytest.raises(RubricError) as info:
        rubric_from_dict(data, "r.yaml")
    assert f"r.yaml.checks[{len(data['checks']) - 1}] (wide)" in str(info.value) and words in str(info.value)


def test_a_backward_check_needs_only_what_its_layer_splits():
    """A backward check runs the layer alone on the whole batch: its batch need not divide."""
    data = yaml.safe_load(DEFAULT_RUBRIC.read_text())
    data["checks"].append({"name": "odd-batch", "hidden": True, "kind": "backward", "world_size": 3, "seed": 3,
                           "global_batch_size": 7, "input_dim": 5, "output_dim": 9, "accumulation_steps": 2,
                           "hidden_dim": 12})
    # what the optional parts a course turns on split over its 3 ranks (Part 5's width: 12) divides
    assert rubric_from_dict(fitted(data), "r.yaml").checks[-1].name == "odd-batch"


FIX = re.compile(r"(?:checks\[\d+\] \((?P<check>[^)]+)\)|the public check '(?P<public>[^']+)').*set the "
                 r"(?:public )?check's (?P<size>\w+) to a multiple of (?P<step>\d+) \(e\.g\. (?P<value>\d+)")


def _take_the_advice(data: dict, refusal: str) -> list:
    """Each size the refusal says to set, set as it says (its first example) in `data`'s checks."""
    taken = []
    for line in refusal.splitlines():
        for fix in FIX.finditer(line):
            name, size, value = fix["check"] or fix["public"], fix["size"], int(fix["value"])
            next(c for c in data["checks"] if c["name"] == name)[size] = value
            taken.append((name, size, int(fix["step"]), value))
    return taken


def test_one_refusal_lists_every_broken_rule_and_its_advice_is_accepted():
    """A course adds a hidden 3-rank check and a public one to a rubric with Part 5 on: every size
    that does not divide is named at once, each advised multiple is the least common multiple of all
    that must divide it (world size, micro-batches, public world sizes), and taking the advice once
    gives a rubric the kit accepts."""
    data = {"parts": {"megatron_mlp": {"log": 2, "rerun": 8, "bonus": True}}, "public_world_sizes": [4, 1, 2]}
    data["checks"] = [{"name": "default", "world_size": 4, "global_batch_size": 128, "output_dim": 32}, {
         "name": "three", "hidden": True, "world_size": 3, "seed": 5, "global_batch_size": 128, "input_dim": 10,
         "output_dim": 32, "accumulation_steps": 4},
        {"name": "public-three", "world_size": 3, "seed": 6, "global_batch_size": 90, "input_dim": 9, "output_dim": 30,
         "accumulation_steps": 5, "hidden_dim": 20}]
    with pytest.raises(RubricError) as info:
        rubric_from_dict(data, "r.yaml")
    refusal = str(info.value)
    assert refusal.startswith("r.yaml: 6 problems; fix them all before reading it again:"), refusal
    taken = _take_the_advice(data, refusal)
    assert sorted((n, s, step) for n, s, step, _ in taken) == [
        ("public-three", "global_batch_size", 5 * 12), ("public-three", "hidden_dim", 12),
        ("public-three", "output_dim", 12), ("three", "global_batch_size", 12), ("three", "hidden_dim", 3),
        ("three", "output_dim", 3)], refusal
    assert "which accumulation_steps (4) and world_size (3) both divide" in refusal
    assert "world_size (3) and the public world sizes 4 and 2 all divide" in refusal
    rubric = rubric_from_dict(data, "r.yaml")   # the advice, taken once, is accepted
    assert {c.name for c in rubric.checks} >= {"three", "public-three", "public-three-4-ranks"}


def test_every_value_no_check_can_have_is_refused_in_one_message():
    with pytest.raises(RubricError) as info:
        rubric_from_dict({"checks": [{"name": "a"}, {"name": "b", "world_size": 0}, {"name": "c", "kind": "forward"}],
                          "score_decimals": 9, "timeouts": {"part": 0}}, "r.yaml")
    lines = str(info.value).splitlines()
    assert lines[0] == "r.yaml: 4 problems; fix them all before reading it again:"
    assert [line.split(":")[0] for line in lines[1:]] == [
        "  - r.yaml.checks[1] (b).world_size", "  - r.yaml.checks[2] (c).kind", "  - r.yaml.score_decimals",
        "  - r.yaml.timeouts.part"]
    with pytest.raises(RubricError) as info:   # a misspelt key in two checks: both named
        rubric_from_dict({"checks": [{"nmae": "a"}, {"name": "b", "sede": 1}]}, "r.yaml")
    assert "checks[0]: unknown key 'nmae'" in str(info.value) and "checks[1]: unknown key 'sede'" in str(info.value)


def test_a_parallel_part_no_check_runs_on_more_than_one_rank_is_refused():
    with pytest.raises(RubricError, match=r"r.yaml.checks: Part 3: data parallel is communication, but every check "
                                          r"of kind step that runs it has world_size 1"):
        rubric_from_dict({"checks": [{"name": "solo", "world_size": 1}], "public_world_sizes": [1]}, "r.yaml")


def test_a_rubric_that_rounds_to_another_number_of_decimals_rounds_every_score_there():
    from grader import worth
    rubric = rubric_from_dict({"score_decimals": 3}, "r.yaml")
    assert worth.rounded(rubric, 28 / 15) == 1.867 and worth.rounded(rubric_from_dict({}, "r.yaml"), 28 / 15) == 1.87
    with pytest.raises(RubricError, match="r.yaml.score_decimals: 9 is not a number of decimals from 0 to 6"):
        rubric_from_dict({"score_decimals": 9}, "r.yaml")


@pytest.mark.parametrize("data,message", [
    ({"tolerence": {}}, "r.yaml: unknown key 'tolerence'; valid keys: parts, checks, tolerance"),
    ({"parts": {"baselin": {}}}, "r.yaml.parts: unknown part 'baselin'; valid parts: baseline, grad_accumulation"),
    ({"parts": {"baseline": {"log": "two"}}}, "r.yaml.parts.baseline.log: expected a number, got 'two'"),
    ({"checks": [{"name": "a", "world_size": 3}]}, "global_batch_size (128) is not divisible by world_size (3)"),
    ({"checks": [{"name": "a", "hidden": True}]}, "at least one check must be public"),
    ({"checks": [{"name": "a"}, {"name": "a", "seed": 1}]}, "the check name 'a' is used twice"),
    ({"checks": [{"nmae": "a"}]}, "r.yaml.checks[0]: unknown key 'nmae'; valid keys: name, world_size"),
    ({"timeouts": {"part": 0}}, "r.yaml.timeouts.part: must be positive"),
    ({"files": {"student_id_pattern": "(\\d+)"}}, "needs a named group (?P<id>...)"),
    ({"checks": [{"name": "a", "nodes": 3}]}, "r.yaml.checks[0] (a).nodes: must be at least 1 and divide world_size (4)"),
    ({"checks": [{"name": "a", "kind": "forward"}]}, "'forward' is not a kind of check; valid kinds: step, backward"),
    ({"checks": [{"name": "a", "kind": "backward"}]}, "at least one check must be public (hidden: false) and of kind step"),
    ({"log_slurm_job": "yes"}, "r.yaml.log_slurm_job: expected true or false"),
    ({"public_world_sizes": [4, 0]}, "r.yaml.public_world_sizes: expected a list of world sizes"),
])
def test_a_bad_rubric_is_refused_with_the_key_and_what_is_valid(data, message):
    with pytest.raises(RubricError) as info:
        rubric_from_dict(data, "r.yaml")
    assert message in str(info.value)


def test_a_rubric_file_that_is_not_yaml_names_the_file(tmp_path):
    path = tmp_path / "rubric.yaml"
    path.write_text("parts: [unclosed\n")
    with pytest.raises(RubricError, match=f"{path}: not valid YAML"):
        load_rubric(path)


def test_a_wrong_key_in_a_rubric_file_is_one_line_naming_the_file_the_key_and_the_valid_keys(tmp_path):
    path = tmp_path / "rubric.yaml"
    path.write_text("tolerance: {rtol: 1.0e-4, atoll: 1.0e-5}\n")
    with pytest.raises(RubricError) as info:
        load_rubric(path)
    assert str(info.value) == f"{path}.tolerance: unknown key 'atoll'; valid keys: rtol, atol"


def test_the_protocol_decoder_refuses_an_unknown_key_a_wrong_type_and_a_bool_for_a_number():
    from grader.rerun.wire import protocol
    message = protocol.encode(protocol.Result(part="baseline", status=protocol.RankStatus.OK, seconds=1.0))
    assert protocol.decode(message) == protocol.Result(part="baseline", status=protocol.RankStatus.OK, seconds=1.0)
    report = protocol.decode(protocol.encode(protocol.WorldReport(exit_codes={0: 0, 1: None})))
    assert report.exit_codes == {0: 0, 1: None}   # JSON's keys are text; the decoder makes them numbers again
    for change, words in [({"verdict": "ok"}, "result: unknown key 'verdict'"),
                          ({"seconds": "1"}, "result.seconds: expected a number"),
                          ({"seconds": True}, "result.seconds: expected a number"),
                          ({"status": "great"}, "result.status: 'great' is not one of ok, not_implemented"),
                          ({"devices": [0, "1"]}, "result.devices[1]: expected a whole number")]:
        with pytest.raises(protocol.ProtocolError, match=re.escape(words)):
            protocol.decode(message | change)


def test_a_layer_holding_its_weight_as_nn_linear_does_has_its_gradient_taken_transposed():
    """FullColumnParallelLinear built on nn.Linear(input_dim, output_dim / p) holds its weight
    [output_dim / p, input_dim]: its gradient is X^T G_r transposed, the same values. Another
    rank's columns, transposed or not, are still named."""
    from types import SimpleNamespace
    from grader.verdict.backward import ExpectedLayer, _weight_problem
    torch.manual_seed(0)
    e = ExpectedLayer(x=torch.randn(6, 5, dtype=torch.float64), w=torch.randn(5, 8, dtype=torch.float64),
                      g=torch.randn(6, 8, dtype=torch.float64))
    shares = e.shares(4)
    say = Say(CHECK)
    for rank in range(4):
        right = e.x.T @ shares[rank][1]
        assert _weight_problem(SimpleNamespace(extra={"weight_grad": right}), rank, e, 4, TOL, say) == ""
        assert _weight_problem(SimpleNamespace(extra={"weight_grad": right.T.contiguous()}), rank, e, 4, TOL, say) == ""
    others = (e.x.T @ shares[2][1]).T.contiguous()
    assert "that of rank 2's columns" in _weight_problem(SimpleNamespace(extra={"weight_grad": others}), 1, e, 4, TOL, say)
    wrong = torch.zeros(2, 5, dtype=torch.float64)
    assert "differs from X^T G_r" in _weight_problem(SimpleNamespace(extra={"weight_grad": wrong}), 1, e, 4, TOL, say)
