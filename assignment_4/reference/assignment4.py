"""Assignment 4: Data and Tensor Parallelism.

    torchrun --standalone --nproc_per_node=4 assignment_4/assignment4.py   # 4 ranks on this machine
    python assignment_4/assignment4.py                                     # 1 rank
    sbatch slurm/assignment4.sbatch                                        # 4 nodes on the cluster

(run from the top folder of the kit; the ranks use the GPUs when every rank has one, the CPU if not)

Four ways to take the same single SGD step on a linear layer Y = X W with the MSE loss. Every part
returns the full updated weight W1 of shape [input_dim, output_dim]; the script compares each of
them, on every rank, with the closed-form W1 from utils.expected_weight. A correct part logs

    [Part][Rank r] Tensors match: True | Max diff: ... | Mean diff: ...

Part 1  single_step                          the single-device baseline
Part 2  single_step_with_grad_accumulation   the same step from micro-batches, one after another
Part 3  data_parallel_single_step            each rank takes a slice of the batch; gradients all-reduced
Part 4  full_column_parallel_single_step     each rank holds a slice of W's columns; outputs all-gathered

Fill in the lines marked TODO. Each TODO raises NotImplementedError until you replace it, and the
script reports that part as not implemented yet and goes on with the next.
"""

# BEGIN REFERENCE ONLY
import os
import sys

# The reference lives one folder below utils.py; the students' copy sits next to it.
_utils_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _utils_dir not in sys.path:
    sys.path.insert(0, _utils_dir)
# END REFERENCE ONLY
from utils import (check, compare_tensors, create_batch, divide, expected_weight, get_device,
                   init_distributed, leave, log)

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim

# Configuration. The part functions read these when they are called, so they may be changed first.
global_batch_size = 128   # examples in one optimizer step; data parallel splits them across ranks
input_dim = 64            # features per example: the rows of W
output_dim = 32           # targets per example: the columns of W; tensor parallel splits them
seed = 42                 # seeds the initial weight and the batch, identically on every rank
learning_rate = 0.5       # the SGD step size
accumulation_steps = 4    # micro-batches per step in Part 2


class CustomLinearLayer(nn.Module):
    """A linear layer without bias: out = X @ W.

    W has shape [in_dim, out_dim], X has shape [bsz, in_dim], out has shape [bsz, out_dim].
    """

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        # A copy, so that the optimizer's in-place update never changes the caller's tensor.
        self.W = nn.Parameter(weight.detach().clone())
        self.in_dim, self.out_dim = weight.shape

    def forward(self, X):
        local_bsz = X.shape[0]
        check(X, (local_bsz, self.in_dim))
        out = torch.einsum("bi,ij->bj", X, self.W)  # the same as X @ self.W
        check(out, (local_bsz, self.out_dim))
        return out


### Part 1: the single-device baseline.
def single_step(seed=42, device=None):
    """One SGD step on the whole batch on one device.

    Returns:
        (initial_weight, updated_weight), both of shape [input_dim, output_dim]
    """
    device = get_device() if device is None else device
    # Same seed, same initial weight: on every rank and in every part.
    torch.manual_seed(seed)
    initial_weight = torch.randn(input_dim, output_dim)

    model = CustomLinearLayer(initial_weight).to(device)
    optimizer = optim.SGD(model.parameters(), lr=learning_rate)
    # The mean over the batch and the output dimensions: 1/(B*O) * sum((out - Y)^2).
    loss_fn = nn.MSELoss(reduction="mean")

    # Create a synthetic batch of global_batch_size examples with create_batch.
    # BEGIN SOLUTION: inputs, targets = ... (1 line)
    inputs, targets = create_batch(global_batch_size, input_dim, output_dim, seed=seed, device=device)
    # END SOLUTION
    check(inputs, (global_batch_size, input_dim))
    check(targets, (global_batch_size, output_dim))

    # Forward pass through the model.
    # BEGIN SOLUTION: outputs = ... (1 line)
    outputs = model(inputs)
    # END SOLUTION
    check(outputs, (global_batch_size, output_dim))

    # The MSE loss with loss_fn: the average over the batch and the output dimension.
    # BEGIN SOLUTION: loss = ... (1 line)
    loss = loss_fn(outputs, targets)
    # END SOLUTION
    check(loss, [])

    # Reset the gradients, compute new ones, take the step.
    # BEGIN SOLUTION: zero the gradients, backward pass, optimizer step (3 lines)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    # END SOLUTION

    return initial_weight, model.W.detach()


### Part 2: the same step from micro-batches, one after another.
def single_step_with_grad_accumulation(seed=42, device=None, accumulation_steps=4):
    """One SGD step whose gradient is accumulated over `accumulation_steps` micro-batches.

    Returns:
        updated_weight of shape [input_dim, output_dim]
    """
    device = get_device() if device is None else device
    torch.manual_seed(seed)
    initial_weight = torch.randn(input_dim, output_dim)
    model = CustomLinearLayer(initial_weight).to(device)
    optimizer = optim.SGD(model.parameters(), lr=learning_rate)
    loss_fn = nn.MSELoss(reduction="mean")

    inputs, targets = create_batch(global_batch_size, input_dim, output_dim, seed=seed, device=device)
    check(inputs, (global_batch_size, input_dim))
    check(targets, (global_batch_size, output_dim))
    micro_batch_size = divide(global_batch_size, accumulation_steps,
                              "global_batch_size", "accumulation_steps")

    optimizer.zero_grad()
    for i in range(accumulation_steps):
        # The rows of micro-batch i.
        # BEGIN SOLUTION: start_idx = ..., end_idx = ... (2 lines)
        start_idx = i * micro_batch_size
        end_idx = start_idx + micro_batch_size
        # END SOLUTION
        micro_inputs = inputs[start_idx:end_idx]
        micro_targets = targets[start_idx:end_idx]
        check(micro_inputs, (micro_batch_size, input_dim))
        check(micro_targets, (micro_batch_size, output_dim))

        # Forward pass and the loss of this micro-batch.
        # BEGIN SOLUTION: micro_outputs = ..., micro_loss = ... (2 lines)
        micro_outputs = model(micro_inputs)
        micro_loss = loss_fn(micro_outputs, micro_targets)
        # END SOLUTION
        check(micro_outputs, (micro_batch_size, output_dim))
        check(micro_loss, [])

        # backward() adds to .grad, so the micro-batch gradients are summed. Each micro-loss is a
        # mean over 1/accumulation_steps of the batch: scale it so that the sum is the full batch's
        # mean. Dividing before summing keeps the accumulated numbers small.
        # BEGIN SOLUTION: scaled_loss = ... (1 line)
        scaled_loss = micro_loss / accumulation_steps
        # END SOLUTION
        scaled_loss.backward()

    optimizer.step()
    return model.W.detach()


### Part 3: data parallel.
def data_parallel_single_step(seed=42, device=None):
    """One SGD step where each rank computes the gradient of its own slice of the batch.

    Every rank holds the whole W [input_dim, output_dim] and the rows
    [rank * local_batch_size, (rank + 1) * local_batch_size) of the batch. The local gradient is the
    gradient of the local mean; the mean of the local gradients over the ranks is the gradient of
    the global mean, so every rank takes the same step as the baseline.

    Returns:
        updated_weight of shape [input_dim, output_dim], the same on every rank
    """
    device = get_device() if device is None else device
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_batch_size = divide(global_batch_size, world_size, "global_batch_size", "world_size")

    # The same seed on every rank gives every rank the same initial weight. (Creating it on rank 0
    # and calling dist.broadcast(initial_weight, src=0) would do the same.)
    torch.manual_seed(seed)
    initial_weight = torch.randn(input_dim, output_dim)
    model = CustomLinearLayer(initial_weight).to(device)
    optimizer = optim.SGD(model.parameters(), lr=learning_rate)
    loss_fn = nn.MSELoss(reduction="mean")

    # Every rank creates the full batch with the same seed and keeps its own slice.
    full_inputs, full_targets = create_batch(global_batch_size, input_dim, output_dim,
                                             seed=seed, device=device)
    start_idx = rank * local_batch_size
    end_idx = start_idx + local_batch_size
    local_inputs = full_inputs[start_idx:end_idx]
    local_targets = full_targets[start_idx:end_idx]
    check(local_inputs, (local_batch_size, input_dim))
    check(local_targets, (local_batch_size, output_dim))

    optimizer.zero_grad()
    local_outputs = model(local_inputs)
    check(local_outputs, (local_batch_size, output_dim))
    local_loss = loss_fn(local_outputs, local_targets)
    check(local_loss, [])
    local_loss.backward()

    # Average the gradients over the ranks before the step.
    for param in model.parameters():
        # Sum the gradients of all ranks, in place, on every rank.
        # BEGIN SOLUTION: the collective that sums param.grad over all ranks, in place (1 line)
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
        # END SOLUTION
        # ... and turn the sum into a mean (a trailing underscore means in place).
        param.grad.div_(world_size)

    # Every rank now has the same gradient, so every rank takes the same step.
    optimizer.step()
    return model.W.detach()


### Part 4: tensor parallel, a full column-parallel linear layer.
class BroadcastParallel(torch.autograd.Function):
    """Forward: identity. Backward: all-reduce (sum) of the gradient over the ranks.

    The function f of Megatron-LM (https://arxiv.org/abs/1909.08053; copy_to_model_parallel_region
    in its mpu/mappings.py): every rank already holds the whole input X [bsz, in_dim], so forward
    passes it on unchanged; in backward, each rank's gradient of X comes from its own columns of W
    only (grad_out_i @ W_i^T), so the full gradient is their sum over the ranks.
    """

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad_output):
        if dist.get_world_size() == 1:
            return grad_output
        # Reduce a private copy: autograd may still need grad_output as it is.
        grad = grad_output.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad


class GatherParallel(torch.autograd.Function):
    """Forward: all-gather along the last dimension. Backward: split, keep this rank's slice.

    Megatron-LM's gather_from_model_parallel_region: each rank holds out_i [bsz, out_dim / p];
    forward concatenates them into out [bsz, out_dim] on every rank; backward hands each rank the
    columns of the gradient that belong to its own out_i. (It is not the paper's g, which all-reduces
    in forward and is the identity in backward: g ends a row-parallel layer, which this assignment
    does not have.)
    """

    @staticmethod
    def forward(ctx, x):
        world_size = dist.get_world_size()
        if world_size == 1:
            return x
        x = x.contiguous()
        x_list = [torch.empty_like(x) for _ in range(world_size)]
        dist.all_gather(x_list, x)
        return torch.cat(x_list, dim=-1).contiguous()

    @staticmethod
    def backward(ctx, grad_output):
        world_size = dist.get_world_size()
        if world_size == 1:
            return grad_output
        local_dim = grad_output.shape[-1] // world_size
        grad_slices = torch.split(grad_output, local_dim, dim=-1)
        return grad_slices[dist.get_rank()].contiguous()


class FullColumnParallelLinear(nn.Module):
    """A column-parallel linear layer whose output is gathered on every rank.

    out = X @ W with W [in_dim, out_dim] split along its columns: W = [W_0 | W_1 | ... | W_{p-1}],
    p = world_size; rank i holds W_i of shape [in_dim, out_dim / p] and computes
    out_i = X @ W_i of shape [bsz, out_dim / p]. The full output out = [out_0 | ... | out_{p-1}]
    of shape [bsz, out_dim] is the concatenation (all-gather) of the ranks' outputs, not a sum.

    Parameters:
        weight (torch.Tensor): the full weight matrix, shape [in_dim, out_dim]
        world_size (int): number of ranks p; must divide out_dim
        rank (int): this rank i
    """

    def __init__(self, weight: torch.Tensor, world_size: int, rank: int):
        super().__init__()
        in_dim, out_dim = weight.shape
        self.in_dim = in_dim
        self.out_dim = out_dim
        self.world_size = world_size
        self.rank = rank
        self.local_out_dim = divide(out_dim, world_size, "out_dim", "world_size")
        # This rank's columns of the full weight.
        start = rank * self.local_out_dim
        end = start + self.local_out_dim
        self.W = nn.Parameter(weight[:, start:end].clone().contiguous())

    def forward(self, X):
        """X [bsz, in_dim] -> out [bsz, out_dim], the same on every rank."""
        local_bsz = X.shape[0]
        check(X, (local_bsz, self.in_dim))

        # f: every rank uses the whole X; in backward, the ranks' gradients of X are summed (all-reduced).
        # BEGIN SOLUTION: X = ... (1 line)
        X = BroadcastParallel.apply(X)
        # END SOLUTION

        local_out = torch.einsum("bi,ij->bj", X, self.W).contiguous()
        check(local_out, (local_bsz, self.local_out_dim))

        # Gather every rank's columns of the output; in backward, keep only this rank's columns.
        # BEGIN SOLUTION: out = ... (1 line)
        out = GatherParallel.apply(local_out)
        # END SOLUTION
        check(out, (local_bsz, self.out_dim))
        return out


def full_column_parallel_single_step(seed=42, device=None):
    """One SGD step of a FullColumnParallelLinear layer, returning the full updated weight.

    Every rank computes on the whole batch and updates its own columns W_i [input_dim,
    output_dim / p]; the updated shards are gathered into W1 [input_dim, output_dim].

    Returns:
        updated_weight of shape [input_dim, output_dim], the same on every rank
    """
    device = get_device() if device is None else device
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_output_dim = divide(output_dim, world_size, "output_dim", "world_size")

    torch.manual_seed(seed)
    initial_weight = torch.randn(input_dim, output_dim)
    model = FullColumnParallelLinear(initial_weight, world_size, rank).to(device)
    optimizer = optim.SGD(model.parameters(), lr=learning_rate)
    loss_fn = nn.MSELoss(reduction="mean")

    full_inputs, full_targets = create_batch(global_batch_size, input_dim, output_dim,
                                             seed=seed, device=device)
    outputs = model(full_inputs)
    check(outputs, (global_batch_size, output_dim))
    loss = loss_fn(outputs, full_targets)

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    # Each rank holds its updated shard; gather the shards into the full matrix.
    local_updated_weight = model.W.detach().contiguous()
    check(local_updated_weight, (input_dim, local_output_dim))
    # all_gather fills a list of world_size tensors shaped like the shard, one per rank.
    # BEGIN SOLUTION: weight_shards = ... (1 line)
    weight_shards = [torch.empty_like(local_updated_weight) for _ in range(world_size)]
    # END SOLUTION
    dist.all_gather(weight_shards, local_updated_weight)
    global_updated_weight = torch.cat(weight_shards, dim=1)
    check(global_updated_weight, (input_dim, output_dim))
    return global_updated_weight


def run_part(prefix, part, *args, **kwargs):
    """Call one part; log it as not implemented (and return None) while it still has a TODO."""
    try:
        return part(*args, **kwargs)
    except NotImplementedError as e:
        log(f"[{prefix}][Rank {dist.get_rank()}] Not implemented yet: {e}")
        return None


def main():
    rank, local_rank, world_size = init_distributed()
    device = get_device()

    # The ground truth: one SGD step in closed form (see utils.expected_weight).
    expected = expected_weight(seed, global_batch_size, input_dim, output_dim, learning_rate, device)

    if rank == 0:
        log(f"[Rank {rank}] Part 1: the single-device baseline (every rank computes it alone).")
    result = run_part("Baseline", single_step, seed=seed, device=device)
    if result is not None:
        initial_weight, updated_weight = result
        compare_tensors(expected, updated_weight, prefix="Baseline")

    if rank == 0:
        log(f"[Rank {rank}] Part 2: the same step by accumulating {accumulation_steps} micro-batches.")
    accumulated_weight = run_part("GradAccumulation", single_step_with_grad_accumulation,
                                  seed=seed, device=device, accumulation_steps=accumulation_steps)
    if accumulated_weight is not None:
        compare_tensors(expected, accumulated_weight, prefix="GradAccumulation")

    if rank == 0:
        log(f"[Rank {rank}] Part 3: data parallel, world size {world_size}.")
    data_parallel_weight = run_part("DataParallel", data_parallel_single_step, seed=seed, device=device)
    if data_parallel_weight is not None:
        compare_tensors(expected, data_parallel_weight, prefix="DataParallel")

    if rank == 0:
        log(f"[Rank {rank}] Part 4: full column-parallel tensor parallel, world size {world_size}.")
    column_parallel_weight = run_part("FullColumnParallel", full_column_parallel_single_step,
                                      seed=seed, device=device)
    if column_parallel_weight is not None:
        compare_tensors(expected, column_parallel_weight, prefix="FullColumnParallel")

    dist.barrier()
    dist.destroy_process_group()
    log(f"[Rank {rank}] done")


if __name__ == "__main__":
    main()
    leave()  # at once: see utils.leave for why
