"""A backward check's run inside one rank: Part 4's layer alone, forward and backward.

The SGD step of Part 4 never needs the gradient of the layer's input X, so the step alone cannot
tell whether `BroadcastParallel` (Megatron-LM's f: identity forward, all-reduce backward) is in
the layer and works. Here the hand-in's `FullColumnParallelLinear(W0, world_size, rank)` runs on
an X that requires a gradient, and backward starts from a fixed, non-uniform gradient of the
output, G (so that no transpose or sum can hide). What comes back, for the grader to compare
with the single-device layer in its own process (grader.pipeline.backward):

    output       the layer's output, [B, output_dim] on every rank (X @ W0)
    input_grad   the gradient of X, [B, input_dim] on every rank (G @ W0^T)
    weight_grad  the gradient of the rank's own parameter, [input_dim, output_dim / p] (X^T G_rank)

W0 and X are seeded as the handout seeds them; G is drawn from its own generator, seeded with the
check's seed + 1 (grader.pipeline.backward draws the same).
"""

import torch
import torch.distributed as dist


def output_gradient(seed: int, batch: int, output_dim: int) -> torch.Tensor:
    """G: the gradient the backward pass starts from."""
    return torch.randn(batch, output_dim, generator=torch.Generator().manual_seed(seed + 1))


def forward_and_backward(module, check: dict) -> dict:
    """Run the hand-in's layer on every rank; return its output and the gradients (see above)."""
    import utils  # the trusted copy, next to the hand-in's assignment4.py
    layer_class = getattr(module, "FullColumnParallelLinear", None)
    if not isinstance(layer_class, type):
        raise TypeError("assignment4.py has no class FullColumnParallelLinear")
    seed, batch = check["seed"], check["global_batch_size"]
    input_dim, output_dim = check["input_dim"], check["output_dim"]
    torch.manual_seed(seed)
    initial_weight = torch.randn(input_dim, output_dim)
    inputs, _ = utils.create_batch(batch, input_dim, output_dim, seed=seed, device="cpu")
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
