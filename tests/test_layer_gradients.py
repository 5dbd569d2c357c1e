"""Part 4's layer at a backward check: the gradient of the rank's own columns of W is found by value.

The layer's backward is judged on its output, the gradient of X and the gradient of the rank's
columns of W (grader.verdict.backward). That gradient is the one of whichever parameter holds the
columns the layer was handed (grader.parts.common.shard_gradient), never "the layer's only
parameter": a layer with one more parameter (a bias of zeros) is judged on its weight all the same,
so a wrong weight gradient fails beside it, and a layer that holds its columns in no parameter has
no weight gradient to show. Real gloo worlds of one warm executor, at a 2-rank backward check.
"""

import dataclasses

import pytest

from grader.pipeline.grade import judge_check
from grader.rerun.check import prepare_code
from grader.rerun.executor import WarmExecutor
from grader.results import Status
from grader.rubric import load_rubric
from tests.corpus import REFERENCE, fast_rubric

PART = "tensor_parallel"


@pytest.fixture(scope="module")
def layer_check(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("layer")
    rubric = load_rubric(fast_rubric(tmp))
    backward = dataclasses.replace(next(c for c in rubric.checks if c.name == "default-backward"), world_size=2)
    executor = WarmExecutor("best", rubric.limits)
    executor.start()
    yield executor, rubric, backward, tmp
    executor.close()


# The reference's layer with one more parameter, or its columns held otherwise: appended to it.
WITH_BIAS = '''

_Reference = FullColumnParallelLinear


class FullColumnParallelLinear(_Reference):
    def __init__(self, weight, world_size, rank):
        super().__init__(weight, world_size, rank)
        self.bias = nn.Parameter(torch.zeros(weight.shape[1]))
        {weight_hook}

    def forward(self, X):
        return super().forward(X) + self.bias
'''
DOUBLED = "self.W.register_hook(lambda grad: 2 * grad)"
NOT_A_PARAMETER = '''

_Reference = FullColumnParallelLinear


class FullColumnParallelLinear(_Reference):
    def __init__(self, weight, world_size, rank):
        super().__init__(weight, world_size, rank)
        held = self.W.detach().clone()
        del self.W
        self.W = held * 1.0
'''
LINEAR = '''

class FullColumnParallelLinear(nn.Module):
    """On nn.Linear (its weight [out, in]), with its bias of zeros: the same layer."""

    def __init__(self, weight, world_size, rank):
        super().__init__()
        cols = weight.shape[1] // world_size
        self.linear = nn.Linear(weight.shape[0], cols)
        with torch.no_grad():
            self.linear.weight.copy_(weight[:, rank * cols:(rank + 1) * cols].T)
            self.linear.bias.zero_()

    def forward(self, X):
        return GatherParallel.apply(self.linear(BroadcastParallel.apply(X)))
'''


def _judged(layer_check, name: str, text: str):
    executor, rubric, check, tmp = layer_check
    path = tmp / f"{name}.py"
    path.write_text(text)
    return judge_check(executor, prepare_code(path), check, rubric, tmp, [PART])[PART]


@pytest.mark.parametrize("name, text", [("bias", REFERENCE.read_text() + WITH_BIAS.format(weight_hook="")),
                                        ("linear", REFERENCE.read_text() + LINEAR)])
def test_a_layer_with_more_parameters_than_its_weight_is_judged_on_its_weight(layer_check, name, text):
    outcome = _judged(layer_check, name, text)
    assert outcome.status == Status.PASSED, outcome.message


def test_a_wrong_weight_gradient_fails_beside_another_parameter(layer_check):
    outcome = _judged(layer_check, "doubled", REFERENCE.read_text() + WITH_BIAS.format(weight_hook=DOUBLED))
    assert outcome.status == Status.FAILED and "the weight gradient differs from X^T G_r" in outcome.message, \
        outcome.message


def test_columns_held_in_no_parameter_have_no_weight_gradient_to_show(layer_check):
    outcome = _judged(layer_check, "tensor", REFERENCE.read_text() + NOT_A_PARAMETER)
    assert outcome.status == Status.FAILED and "no parameter of the layer that holds this rank's columns of W" \
        in outcome.message, outcome.message
