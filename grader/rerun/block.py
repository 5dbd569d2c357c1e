"""Part 5 inside one rank: what its step returns, and its block alone at a backward check.

The step (`megatron_mlp_single_step`) returns two full weights, W1 [input_dim, hidden_dim] and
W2 [hidden_dim, input_dim]: `returned_weights` takes them from what it returned. At a backward
check the hand-in's `MegatronMLP(W1, W2, world_size, rank)` runs alone on an X that requires a
gradient, and backward starts from a fixed, non-uniform gradient G of the output [B, input_dim].
What comes back, for the grader to compare with the single-device block in its own process
(grader.verdict.megatron):

    output      the block's output, [B, input_dim] on every rank (GeLU(X W1) W2)
    input_grad  the gradient of X, [B, input_dim] on every rank (f all-reduces it)
    w1_grad     the gradient of the rank's W1 shard, [input_dim, hidden_dim / p]
    w2_grad     the gradient of the rank's W2 shard, [hidden_dim / p, input_dim]

The shards are the block's parameters in the order it registers them (fc1's, then fc2's). Every
value the block starts from comes from `block_inputs`, one place: X, W1 and W2 are the part's
secret data (grader.rerun.secret.block), real in the rank's own shards only, so that the output and
the gradient of X are right only where the ranks really all-reduce; G is the check's.
"""

import torch
import torch.distributed as dist

from grader.rerun import secret
from grader.rerun.layer import output_gradient


def block_inputs(check: dict, data) -> dict:
    """W1, W2 and X of a backward check as this rank is handed them (`data`: the Run's PartSecret),
    and G from its own generator, seeded with the check's seed + 1."""
    seed, batch = check["seed"], check["global_batch_size"]
    x, w1, w2 = secret.block(data, batch, check["input_dim"], check["hidden_dim"], dist.get_rank())
    return {"w1": w1, "w2": w2, "x": x, "g": output_gradient(seed, batch, check["input_dim"])}


def returned_weights(value) -> tuple:
    """(W1, W2) from what megatron_mlp_single_step returned: a pair of floating-point tensors."""
    if not isinstance(value, (tuple, list)) or len(value) != 2 or \
            not all(isinstance(v, torch.Tensor) for v in value):
        raise TypeError(f"megatron_mlp_single_step returned {type(value).__name__}, not a pair of tensors "
                        f"(updated_w1, updated_w2)")
    if not all(v.is_floating_point() for v in value):
        raise TypeError("megatron_mlp_single_step returned tensors that are not floating-point")
    return value[0], value[1]


def forward_and_backward(module, check: dict, data) -> dict:
    """Run the hand-in's block on every rank; return its output and the gradients (see above)."""
    block_class = getattr(module, "MegatronMLP", None)
    if not isinstance(block_class, type):
        raise TypeError("assignment4.py has no class MegatronMLP")
    given = block_inputs(check, data)
    batch, d = given["x"].shape
    x = given["x"].detach().clone().requires_grad_(True)
    block = block_class(given["w1"], given["w2"], dist.get_world_size(), dist.get_rank())
    out = block(x)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"MegatronMLP returned {type(out).__name__}, not a tensor")
    tensors = {"output": out.detach().clone()}
    if tuple(out.shape) != (batch, d) or not out.requires_grad:
        return tensors   # nothing to start backward from; the output's shape is the diagnosis
    out.backward(given["g"].to(out.dtype))
    if x.grad is not None:
        tensors["input_grad"] = x.grad.detach().clone()
    params = list(block.parameters())
    if len(params) == 2 and all(p.grad is not None for p in params):
        tensors["w1_grad"], tensors["w2_grad"] = (p.grad.detach().clone() for p in params)
    return tensors
