"""What the parts' modules share: the layouts' names, the usual hooks, and the helpers their hooks use.

Hooks run where torch is loaded already (a rank, the verdict); each imports it when called, so that
the shared vocabulary imports no torch.

Layouts, each drawn by grader.rerun.wire.secret (its docstring says what a rank sees of each):

    WHOLE     the real X and Y, the same on every rank
    ROWS      real rows only in the rank's own slice of X and Y
    COLUMNS   the real X, real targets only in the rank's own columns of Y
    WEIGHT    the real X, and a W0 real only in the rank's own columns (a layer run alone)
    SHARDS    the real X and Y [B, d], and a seed of the rank's own that draws its MLP weights
    BLOCK     the real X, and W1, W2 real only in the rank's own shards (an MLP block run alone)
    VOCAB     the real tokens and targets, an embedding E and a head W real only in the rank's own
              vocabulary ids (E's rows, W's columns), in float64 (the vocabulary split over the ranks)
    LAYER     the real X [B, S, d], and a transformer block's weights real only in the rank's own
              shards (its heads' columns of W_qkv and rows of W_o, its MLP's shards)
    MODEL     the real tokens and targets [B, S], and a tiny transformer's weights real only in the
              rank's own shards (E's rows, each block's shards, the head's columns)
"""

from grader.parts import BACKWARD

WHOLE, ROWS, COLUMNS, WEIGHT, SHARDS, BLOCK = "whole", "rows", "columns", "weight", "shards", "block"
VOCAB, LAYER, MODEL = "vocab", "layer", "model"
LAYOUTS = (WHOLE, ROWS, COLUMNS, WEIGHT, SHARDS, BLOCK, VOCAB, LAYER, MODEL)   # every layout grader.rerun.wire.secret draws
HIDDEN_DIM = 128   # the rubric's default hidden width: a check mapping without one


def dims(check: dict) -> tuple:
    """(d_in, d_out, h, B) of a job's check mapping."""
    d_in, d_out, h, b = (int(check.get(k) or 0) for k in ("input_dim", "output_dim", "hidden_dim", "global_batch_size"))
    return d_in, d_out, h or HIDDEN_DIM, b


# ---- the rank's side ----------------------------------------------------------------------------

def returned_weight(value):
    """The updated weight in what a part returned: a tensor, or the last tensor of a tuple."""
    import torch
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
        value = value[-1]
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"returned {type(value).__name__}, not a tensor")
    if not value.is_floating_point():
        raise TypeError(f"returned a tensor of {value.dtype}, not a floating-point tensor")
    return value


def one_weight(module, call, check: dict, data) -> dict:
    """A step that returns one weight: {"weight": W [d_in, d_out]}."""
    return {"weight": returned_weight(call())}


def output_gradient(seed: int, *shape: int):
    """G [*shape]: the gradient a layer or block run alone starts its backward from (seeded with the
    check's seed + 1; the verdict draws the same)."""
    import torch
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed + 1))


def run_alone(module, class_name: str, weights: tuple, x, check: dict, out_dim: int) -> tuple:
    """The hand-in's class `class_name`, built on this rank as `class_name(*weights, world_size,
    rank)`, run alone on X [B, d_in] (or [B, S, d_in]: a block of sequences), its backward started
    from G [B, out_dim] ([B, S, out_dim]; output_gradient): ({"output": Y, "input_grad": dX}, the
    layer, whose parameters hold their gradients), or ({"output": Y}, None) where Y has the wrong
    shape or no graph (the shape is then the diagnosis)."""
    import torch
    import torch.distributed as dist
    layer_class = getattr(module, class_name, None)
    if not isinstance(layer_class, type):
        raise TypeError(f"assignment4.py has no class {class_name}")
    shape = (*x.shape[:-1], out_dim)
    grad_output = output_gradient(check["seed"], *shape)
    x = x.detach().clone().requires_grad_(True)
    layer = layer_class(*weights, dist.get_world_size(), dist.get_rank())
    out = layer(x)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{class_name} returned {type(out).__name__}, not a tensor")
    tensors = {"output": out.detach().clone()}
    if tuple(out.shape) != shape or not out.requires_grad:
        return tensors, None
    out.backward(grad_output.to(out.dtype))
    if x.grad is not None:
        tensors["input_grad"] = x.grad.detach().clone()
    return tensors, layer


def shard_gradient(module, shard):
    """The gradient of `module`'s output with respect to `shard` (the block of the weights it was
    built from that is its own), [*shard.shape]: the sum of the gradients of every parameter that
    holds it, as handed or transposed (nn.Linear holds [out, in]), or None where none of them got
    one. Found by value, not by order or count: a layer may hold more parameters (a bias), and
    another parameter's gradient is not the shard's."""
    import torch
    shard = shard.detach()
    total = None
    for param in module.parameters():
        value = param.detach()
        as_held = value.shape == shard.shape and torch.equal(value.to(shard.dtype), shard)
        turned = not as_held and value.dim() == 2 and value.T.shape == shard.shape and \
            torch.equal(value.T.to(shard.dtype), shard)
        if (as_held or turned) and param.grad is not None:
            grad = param.grad.detach().to(shard.dtype)
            grad = grad if as_held else grad.T
            total = grad.clone() if total is None else total + grad
    return total


def weight_room(check: dict, kind: str) -> int:
    """The most values a tensor of a one-weight part holds: W [d_in, d_out]; a layer run alone adds
    its output [B, d_out] and the gradient of X [B, d_in]."""
    d_in, d_out, _, b = dims(check)
    return max(d_in * d_out, b * max(d_in, d_out) if kind == BACKWARD else 0)


def alone_should(room: int, hidden: bool) -> str:
    """What a layer or block run alone should return, said in a refusal."""
    return "the layer's output and gradients" + ("" if hidden else f", at most {room} values each")


def weight_should(check: dict, kind: str, hidden: bool) -> str:
    """What a one-weight part should return, said in a refusal (no size at a hidden check)."""
    if kind == BACKWARD:
        return alone_should(weight_room(check, kind), hidden)
    d_in, d_out, _, _ = dims(check)
    return "the weight" + ("" if hidden else f", {d_in} x {d_out}")


# ---- the verdict's side -------------------------------------------------------------------------

def close(a, b, tol) -> bool:
    """The same shape and every value within the rubric's tolerance."""
    return a.shape == b.shape and bool(a.allclose(b, rtol=tol.rtol, atol=tol.atol))


def as_weight(got, want, tol, same=close) -> bool:
    """A parameter's gradient `got` is `want` as the skeleton holds the parameter ([in, out]), or its
    transpose: a layer built on nn.Linear holds its weight [out, in], and computes the same."""
    return same(got, want, tol) or (got.dim() == 2 and same(got.T, want, tol))


def local_ranks(check) -> list:
    """Each rank's LOCAL_RANK in the check's layout of `nodes` nodes."""
    per_node = check.world_size // max(check.nodes, 1)
    return [r % per_node for r in range(check.world_size)]


def layout_matters(check, passed) -> bool:
    """The check lays its world out on several nodes, and the part passed on one node at its world size."""
    return check.nodes > 1 and any(p.nodes == 1 and p.world_size == check.world_size for p in passed)
