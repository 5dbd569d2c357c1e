"""A backward check's run inside one rank: Part 4's layer alone, forward and backward.

The SGD step of Part 4 never needs the gradient of the layer's input X, so the step alone cannot
tell whether `BroadcastParallel` (Megatron-LM's f: identity forward, all-reduce backward) is in
the layer and works. Here the hand-in's `FullColumnParallelLinear(W0, world_size, rank)` runs on
an X that requires a gradient, and backward starts from a fixed, non-uniform gradient of the
output, G (so that no transpose or sum can hide). What comes back, for the grader to compare
with the single-device layer in its own process (grader.verdict.backward):

    output       the layer's output, [B, output_dim] on every rank (X @ W0)
    input_grad   the gradient of X, [B, input_dim] on every rank (G @ W0^T)
    weight_grad  the gradient of the rank's own parameter, [input_dim, output_dim / p] (X^T G_rank)

X and W0 are the part's data (grader.rerun.secret): X is real and the same on every rank; the W0
rank r's layer is handed is real in rank r's own columns only and this rank's noise elsewhere, so
the gathered output and the all-reduced gradient of X are right only if the ranks communicated. G
is drawn from its own generator, seeded with the check's seed + 1 (grader.verdict.backward draws
the same).
"""

import torch
import torch.distributed as dist


def output_gradient(seed: int, batch: int, output_dim: int) -> torch.Tensor:
    """G: the gradient the backward pass starts from."""
    return torch.randn(batch, output_dim, generator=torch.Generator().manual_seed(seed + 1))


def forward_and_backward(module, check: dict, data) -> dict:
    """Run the hand-in's layer on every rank on `data` (a grader.rerun.secret.PartData: x, w0);
    return its output and the gradients (see above)."""
    layer_class = getattr(module, "FullColumnParallelLinear", None)
    if not isinstance(layer_class, type):
        raise TypeError("assignment4.py has no class FullColumnParallelLinear")
    seed, batch = check["seed"], check["global_batch_size"]
    output_dim = check["output_dim"]
    initial_weight, inputs = data.w0.clone(), data.x.clone()
    grad_output = output_gradient(seed, batch, output_dim)
    x = inputs.detach().clone().requires_grad_(True)
    layer = layer_class(initial_weight, dist.get_world_size(), dist.get_rank())
    out = layer(x)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"FullColumnParallelLinear returned {type(out).__name__}, not a tensor")
    tensors = {"output": out.detach().clone()}
    if tuple(out.shape) != (batch, output_dim) or not out.requires_grad:
        return tensors   # nothing to start backward from; the output's shape is the diagnosis
    out.backward(grad_output.to(out.dtype))
    if x.grad is not None:
        tensors["input_grad"] = x.grad.detach().clone()
    params = [p for p in layer.parameters() if p.grad is not None]
    if len(params) == 1:
        tensors["weight_grad"] = params[0].grad.detach().clone()
    return tensors
