"""Judging re-run weights: the closed form, the diagnoses of the usual mistakes, the communication check."""

import pytest
import torch

from grader.pipeline.compare import comm_check, diagnose, expected, judge
from grader.rerun.check import PartRun, RankRun
from grader.results import Status
from grader.rubric import Check, Tolerance, load_rubric, rubric_from_dict, RubricError
from tests.worlds import closed_form_step

CHECK = Check(name="t", world_size=4, seed=5, global_batch_size=24, input_dim=7, output_dim=8, accumulation_steps=3)
TOL = Tolerance()


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
])
def test_each_usual_mistake_is_named(exp, part, make, words):
    assert words in diagnose(make(exp).double(), exp, part, CHECK, 0, TOL)


def ranks_with(weight, comm=(), answer_key=0, n=4):
    return {r: RankRun(rank=r, status="ok", weight=weight, comm=[dict(c) for c in comm], answer_key_calls=answer_key)
            for r in range(n)}


def test_data_parallel_needs_an_all_reduce_of_the_gradient_or_reduce_scatter_and_all_gather(exp):
    ok, message = comm_check("data_parallel", CHECK, ranks_with(exp.w1))
    assert not ok and "never all-reduced the gradients (collectives called: no collective at all)" in message
    small = [{"op": "all_reduce", "numel": 1}]
    assert not comm_check("data_parallel", CHECK, ranks_with(exp.w1, small))[0]
    assert comm_check("data_parallel", CHECK, ranks_with(exp.w1, [{"op": "all_reduce", "numel": 56}]))[0]
    ring = [{"op": "reduce_scatter_tensor", "numel": 14}, {"op": "all_gather_into_tensor", "numel": 56}]
    assert comm_check("data_parallel", CHECK, ranks_with(exp.w1, ring))[0]
    one_rank = Check(name="one", world_size=1, global_batch_size=24, input_dim=7, output_dim=8)
    assert comm_check("data_parallel", one_rank, ranks_with(exp.w1, n=1))[0]


def test_tensor_parallel_needs_an_all_gather(exp):
    assert not comm_check("tensor_parallel", CHECK, ranks_with(exp.w1, [{"op": "all_reduce", "numel": 56}]))[0]
    assert comm_check("tensor_parallel", CHECK, ranks_with(exp.w1, [{"op": "all_gather", "numel": 14}]))[0]


def test_calling_the_answer_key_costs_the_part(exp):
    ok, message = comm_check("baseline", CHECK, ranks_with(exp.w1, answer_key=1))
    assert not ok and "utils.expected_weight" in message


def test_judge_passes_right_weights_and_names_the_failing_ranks(exp):
    ranks = ranks_with(exp.w1.clone(), [{"op": "all_reduce", "numel": 56}])
    assert judge(PartRun("data_parallel", Status.PASSED, ranks), exp, "data_parallel", CHECK, TOL).status == Status.PASSED
    ranks[2].weight = exp.step(slice(12, 18))
    outcome = judge(PartRun("data_parallel", Status.PASSED, ranks), exp, "data_parallel", CHECK, TOL)
    assert outcome.status == Status.FAILED and outcome.failing_ranks == [2]
    assert outcome.message.startswith("wrong weight on rank 2: rank 2 stepped on its own slice")


def test_the_default_rubric_is_valid_and_adds_up_to_100():
    rubric = load_rubric()
    assert rubric.max_score == 100
    assert [c.world_size for c in rubric.checks] == [4, 1, 2, 4]
    assert not rubric.checks[0].hidden and all(c.hidden for c in rubric.checks[1:])


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
