"""The handout teaches Megatron-LM's names right: f (BroadcastParallel) is identity forward and
all-reduce backward; GatherParallel is the gather from the model-parallel region (all-gather
forward, split backward), not g; each docstring states the function's forward and backward as
the code does them, which a 2-rank world checks."""

import re

import pytest
import torch

from tests.worlds import REFERENCE, ROOT, SKELETON, load_module, run_world

HANDOUT = ROOT / "assignment_4" / "README.md"
FIRST_LINES = {"BroadcastParallel": "Forward: identity. Backward: all-reduce (sum) of the gradient over the ranks.",
               "GatherParallel": "Forward: all-gather along the last dimension. Backward: split, keep this rank's slice."}


@pytest.mark.parametrize("path", [REFERENCE, SKELETON])
@pytest.mark.parametrize("name", sorted(FIRST_LINES))
def test_each_docstring_opens_with_the_functions_forward_and_backward(path, name):
    doc = getattr(load_module(path, f"handout_{path.parent.name}_{name}"), name).__doc__
    assert doc.splitlines()[0] == FIRST_LINES[name]


@pytest.mark.parametrize("path", [REFERENCE, SKELETON, HANDOUT])
def test_the_gather_is_never_called_g(path):
    text = " ".join(path.read_text().split())
    assert not re.search(r"g\W{0,4}=\W{0,4}`?GatherParallel|function g of Megatron-LM: each rank", text)
    assert not re.search(r"# g:", path.read_text())
    assert "f and g of the Megatron-LM paper" not in text and "pair `f` and `g`" not in text
    if path != SKELETON:   # the docstring the skeleton shares is tested above
        assert "gather_from_model_parallel_region" in text and "copy_to_model_parallel_region" in text


def _both_functions(rank, world_size, path):
    module = load_module(path, f"handout_world_{rank}")
    x = torch.arange(6.0).reshape(2, 3) + 10 * rank
    x.requires_grad_(True)
    y = module.BroadcastParallel.apply(x)
    (y * (rank + 1)).sum().backward()
    local = torch.full((2, 2), float(rank)).requires_grad_(True)
    out = module.GatherParallel.apply(local)
    (out * torch.arange(8.0).reshape(2, 4)).sum().backward()
    return torch.equal(y, x), x.grad.tolist(), out.tolist(), local.grad.tolist()


@pytest.mark.timeout(120)
def test_the_functions_do_what_their_docstrings_say():
    results = run_world(2, _both_functions, str(REFERENCE))
    for rank, (identity, x_grad, gathered, local_grad) in enumerate(results):
        assert identity                                           # f forward: identity
        assert x_grad == [[3.0] * 3] * 2                          # f backward: all-reduce, 1 + 2
        assert gathered == [[0.0, 0.0, 1.0, 1.0]] * 2             # the gather's forward: concatenated columns
        cols = slice(2 * rank, 2 * rank + 2)
        assert local_grad == torch.arange(8.0).reshape(2, 4)[:, cols].tolist()   # backward: this rank's slice
