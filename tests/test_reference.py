"""The reference solution against the closed form, in real gloo worlds of 1, 2, 4 and 8 ranks."""

import pytest
import torch

from tests.worlds import REFERENCE, closed_form_step, load_module, run_world

# The default and two others with odd, non-square sizes, so that a transpose cannot hide.
CONFIGS = {
    "default": dict(global_batch_size=128, input_dim=64, output_dim=32, seed=42,
                    learning_rate=0.5, accumulation_steps=4),
    "odd": dict(global_batch_size=52, input_dim=13, output_dim=12, seed=7,
                learning_rate=0.1, accumulation_steps=2),
    "wide": dict(global_batch_size=96, input_dim=48, output_dim=24, seed=1234,
                 learning_rate=0.05, accumulation_steps=3),
}
PARTS = ["baseline", "grad_accumulation", "data_parallel", "tensor_parallel"]
TOL = dict(rtol=1e-5, atol=1e-5)


def call_part(module, part, config):
    """Call one part of an assignment module at `config`; return the full updated weight."""
    for name in ("global_batch_size", "input_dim", "output_dim", "learning_rate"):
        setattr(module, name, config[name])
    seed = config["seed"]
    if part == "baseline":
        initial, updated = module.single_step(seed=seed, device="cpu")
        return updated
    if part == "grad_accumulation":
        return module.single_step_with_grad_accumulation(
            seed=seed, device="cpu", accumulation_steps=config["accumulation_steps"])
    if part == "data_parallel":
        return module.data_parallel_single_step(seed=seed, device="cpu")
    return module.full_column_parallel_single_step(seed=seed, device="cpu")


def _all_parts_all_configs(rank, world_size, path, configs):
    module = load_module(path)
    return {(name, part): call_part(module, part, cfg).tolist()
            for name, cfg in configs.items() for part in PARTS}


def assert_all_closed_form(results, configs):
    for rank, weights in enumerate(results):
        for (name, part), weight in weights.items():
            cfg = configs[name]
            expected = closed_form_step(cfg["seed"], cfg["global_batch_size"], cfg["input_dim"],
                                        cfg["output_dim"], cfg["learning_rate"])
            got = torch.tensor(weight, dtype=torch.float64)
            torch.testing.assert_close(got, expected, **TOL,
                                       msg=lambda m: f"rank {rank}, {part}, config {name}: {m}")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_every_part_equals_closed_form(world_size):
    results = run_world(world_size, _all_parts_all_configs, str(REFERENCE), CONFIGS)
    assert_all_closed_form(results, CONFIGS)


@pytest.mark.timeout(180)
def test_every_part_equals_closed_form_on_8_ranks():
    configs = {"default": CONFIGS["default"]}
    results = run_world(8, _all_parts_all_configs, str(REFERENCE), configs)
    assert_all_closed_form(results, configs)


def _parts_at_3_ranks(rank, world_size, path):
    module = load_module(path)
    outcome = {}
    for part in PARTS:
        try:
            outcome[part] = ("ok", call_part(module, part, CONFIGS["default"]).tolist())
        except ValueError as e:
            outcome[part] = ("ValueError", str(e))
    return outcome


@pytest.mark.timeout(120)
def test_a_world_size_that_does_not_divide_is_named_with_its_numbers():
    results = run_world(3, _parts_at_3_ranks, str(REFERENCE))
    for outcome in results:
        assert outcome["baseline"][0] == "ok" and outcome["grad_accumulation"][0] == "ok"
        assert outcome["data_parallel"] == (
            "ValueError", "global_batch_size (128) is not divisible by world_size (3)")
        assert outcome["tensor_parallel"] == (
            "ValueError", "output_dim (32) is not divisible by world_size (3)")


def _load_by_path_and_single_step(rank, world_size, path):
    # The acceptance scenario: load by path, change the config, call one part.
    module = load_module(path)
    module.input_dim, module.output_dim, module.global_batch_size = 48, 24, 96
    initial, updated = module.single_step(seed=7, device="cpu")
    return initial.tolist(), updated.tolist()


@pytest.mark.timeout(120)
def test_load_by_path_change_config_single_step():
    [(initial, updated)] = run_world(1, _load_by_path_and_single_step, str(REFERENCE))
    torch.manual_seed(7)
    torch.testing.assert_close(torch.tensor(initial), torch.randn(48, 24))
    torch.testing.assert_close(torch.tensor(updated, dtype=torch.float64),
                               closed_form_step(7, 96, 48, 24, 0.5), **TOL)


def _grads_of_tensor_parallel_input(rank, world_size, path):
    """Backward through f and g with an input that needs a gradient: f must all-reduce it."""
    module = load_module(path)
    torch.manual_seed(3)
    weight = torch.randn(13, 8)
    x = torch.randn(5, 13, requires_grad=True)
    layer = module.FullColumnParallelLinear(weight, world_size, rank)
    out = layer(x)
    (out * torch.arange(out.numel()).reshape(out.shape)).sum().backward()
    return out.tolist(), x.grad.tolist(), layer.W.grad.tolist()


@pytest.mark.timeout(120)
def test_column_parallel_layer_forward_and_backward_match_a_plain_linear_layer():
    results = run_world(4, _grads_of_tensor_parallel_input, str(REFERENCE))
    torch.manual_seed(3)
    weight = torch.randn(13, 8)
    x = torch.randn(5, 13, requires_grad=True)
    out = x @ weight.requires_grad_()
    (out * torch.arange(out.numel()).reshape(out.shape)).sum().backward()
    for rank, (out_r, x_grad_r, w_grad_r) in enumerate(results):
        torch.testing.assert_close(torch.tensor(out_r), out.detach(), **TOL)
        torch.testing.assert_close(torch.tensor(x_grad_r), x.grad, **TOL)
        torch.testing.assert_close(torch.tensor(w_grad_r), weight.grad[:, 2 * rank:2 * rank + 2], **TOL)
