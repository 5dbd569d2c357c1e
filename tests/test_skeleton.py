"""The student skeleton: generated from the reference, parses, runs, and each part can be filled alone."""

import ast

import pytest
import torch

from grader.parts import BY_ID
from grader.instructor.skeleton import SkeletonError, make_skeleton
from tests.test_reference import CONFIGS, PARTS, TOL, call_part
from tests.worlds import REFERENCE, SKELETON, closed_form_step, load_module, run_world


def test_committed_skeleton_is_generated_from_the_reference():
    assert SKELETON.read_text() == make_skeleton(REFERENCE.read_text(), REFERENCE.name), (
        "assignment_4/assignment4.py has drifted from the reference: run `make skeleton`")


def test_skeleton_parses_and_keeps_every_public_name():
    public = ["CustomLinearLayer", "single_step", "single_step_with_grad_accumulation",
              "data_parallel_single_step", "BroadcastParallel", "GatherParallel",
              "FullColumnParallelLinear", "full_column_parallel_single_step"]
    names = {n.name for n in ast.parse(SKELETON.read_text()).body
             if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert set(public) <= names
    text = SKELETON.read_text()
    assert "SOLUTION" not in text and "REFERENCE ONLY" not in text
    # The lines students write are gone.
    for solution_line in ["dist.all_reduce(param.grad", "BroadcastParallel.apply(X)",
                          "GatherParallel.apply(local_out)", "scaled_loss = micro_loss",
                          "loss.backward()\n    optimizer.step()\n    # END"]:
        assert solution_line not in text


def test_markers_that_do_not_pair_are_refused_with_the_line():
    with pytest.raises(SkeletonError, match="ref.py:2: block is never closed"):
        make_skeleton("def f():\n    # BEGIN SOLUTION: x\n    return 1\n", "ref.py")
    with pytest.raises(SkeletonError, match="ref.py:1: end marker without a begin marker"):
        make_skeleton("# END SOLUTION\n", "ref.py")
    with pytest.raises(SkeletonError, match="marker inside the block opened at line 2"):
        make_skeleton("def f():\n    # BEGIN SOLUTION: x\n    # BEGIN SOLUTION: y\n", "ref.py")
    with pytest.raises(SkeletonError, match="'# BEGIN SOLUTION: <what to write>'"):
        make_skeleton("def f():\n    # BEGIN SOLUTION\n    # END SOLUTION\n", "ref.py")


def _try_every_part(rank, world_size, path):
    module = load_module(path)
    outcome = {}
    for part in PARTS:
        try:
            outcome[part] = ("ok", call_part(module, part, CONFIGS["odd"]).tolist())
        except NotImplementedError as e:
            outcome[part] = ("not implemented", str(e))
    return outcome


@pytest.mark.timeout(120)
def test_untouched_skeleton_raises_not_implemented_in_every_part():
    for outcome in run_world(2, _try_every_part, str(SKELETON)):
        for part in PARTS:
            state, message = outcome[part]
            assert state == "not implemented" and message.startswith("TODO in "), (part, outcome[part])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("filled", PARTS)
def test_filling_one_part_makes_that_part_pass_alone(filled, tmp_path):
    path = tmp_path / "assignment4.py"
    path.write_text(make_skeleton(REFERENCE.read_text(), keep=BY_ID[filled].scopes))
    cfg = CONFIGS["odd"]
    expected = closed_form_step(cfg["seed"], cfg["global_batch_size"], cfg["input_dim"],
                                cfg["output_dim"], cfg["learning_rate"])
    for outcome in run_world(2, _try_every_part, str(path)):
        for part in PARTS:
            state, value = outcome[part]
            if part == filled:
                assert state == "ok", value
                torch.testing.assert_close(torch.tensor(value, dtype=torch.float64), expected, **TOL)
            else:
                assert state == "not implemented", (part, value)
