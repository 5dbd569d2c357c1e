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
Part 5  megatron_mlp_single_step             (optional) Megatron's MLP block: W1 by columns, W2 by rows
        a two-layer MLP, so it returns (W1, W2) and checks them against the single-device MLP's step
        (mlp_single_step) with "[MegatronMLP][Rank r] Tensors match: ..." lines
Part 6  vocab_parallel_loss                  (optional) the vocabulary split over the ranks: an embedding
        split by rows and a cross-entropy on logits split by columns, never gathered; checks its
        loss, its logits' gradient and its embedding's gradient against vocab_single_loss's (the
        full logits, torch's cross_entropy) with "[VocabParallel][Rank r] Tensors match: ..." lines
Part 7  transformer_block_forward_backward   (optional) a transformer block in tensor parallel: attention
        heads split over the ranks, Part 5's MLP; its output and its input's gradient are checked
        against the single-device block's (block_single_device) with "[TransformerBlock][Rank r] ..." lines;
        the grader also runs transformer_single_step, one SGD step of a tiny transformer built of it
Part 8  sequence_parallel_forward_backward   (optional) sequence parallelism on Part 7's block: LayerNorm on
        the rank's slice of the sequence, an all-gather before each column-parallel linear and a
        reduce-scatter after each row-parallel one; checked against block_single_device's slices
        with "[SequenceParallel][Rank r] ..." lines

Fill in the lines marked TODO. Each TODO raises NotImplementedError until you replace it, and the
script reports that part as not implemented yet and goes on with the next.
"""

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
hidden_dim = 128          # Part 5: the MLP's hidden width h (W1 [input_dim, h], W2 [h, input_dim]);
                          # tensor parallel splits it, so it must be divisible by the world size
vocab_size = 64           # Part 6: the vocabulary V (the embedding E [V, input_dim], the logits [B, V]);
                          # split over the ranks, so it must be divisible by the world size
num_heads = 4             # the transformer block's attention heads; tensor parallel splits them, so
                          # they must be divisible by the world size
head_dim = 8              # features per head: the block's width is d = num_heads * head_dim
seq_len = 8               # tokens per sequence: the block's input is [global_batch_size, seq_len, d]
dropout = 0.0             # the attention's dropout: 0, so that every run gives the same values
num_layers = 2            # the tiny transformer's blocks (the step: embedding, blocks, head, loss)


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
    # TODO: inputs, targets = ... (1 line)
    raise NotImplementedError('TODO in single_step: inputs, targets = ... (1 line)')
    check(inputs, (global_batch_size, input_dim))
    check(targets, (global_batch_size, output_dim))

    # Forward pass through the model.
    # TODO: outputs = ... (1 line)
    raise NotImplementedError('TODO in single_step: outputs = ... (1 line)')
    check(outputs, (global_batch_size, output_dim))

    # The MSE loss with loss_fn: the average over the batch and the output dimension.
    # TODO: loss = ... (1 line)
    raise NotImplementedError('TODO in single_step: loss = ... (1 line)')
    check(loss, [])

    # Reset the gradients, compute new ones, take the step.
    # TODO: zero the gradients, backward pass, optimizer step (3 lines)
    raise NotImplementedError('TODO in single_step: zero the gradients, backward pass, optimizer step (3 lines)')

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
        # TODO: start_idx = ..., end_idx = ... (2 lines)
        raise NotImplementedError('TODO in single_step_with_grad_accumulation: start_idx = ..., end_idx = ... (2 lines)')
        micro_inputs = inputs[start_idx:end_idx]
        micro_targets = targets[start_idx:end_idx]
        check(micro_inputs, (micro_batch_size, input_dim))
        check(micro_targets, (micro_batch_size, output_dim))

        # Forward pass and the loss of this micro-batch.
        # TODO: micro_outputs = ..., micro_loss = ... (2 lines)
        raise NotImplementedError('TODO in single_step_with_grad_accumulation: micro_outputs = ..., micro_loss = ... (2 lines)')
        check(micro_outputs, (micro_batch_size, output_dim))
        check(micro_loss, [])

        # backward() adds to .grad, so the micro-batch gradients are summed. Each micro-loss is a
        # mean over 1/accumulation_steps of the batch: scale it so that the sum is the full batch's
        # mean. Dividing before summing keeps the accumulated numbers small.
        # TODO: scaled_loss = ... (1 line)
        raise NotImplementedError('TODO in single_step_with_grad_accumulation: scaled_loss = ... (1 line)')
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
        # TODO: the collective that sums param.grad over all ranks, in place (1 line)
        raise NotImplementedError('TODO in data_parallel_single_step: the collective that sums param.grad over all ranks, in place (1 line)')
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
    in forward and is the identity in backward: g ends a row-parallel layer, which Part 4
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
        # TODO: X = ... (1 line)
        raise NotImplementedError('TODO in FullColumnParallelLinear.forward: X = ... (1 line)')

        local_out = torch.einsum("bi,ij->bj", X, self.W).contiguous()
        check(local_out, (local_bsz, self.local_out_dim))

        # Gather every rank's columns of the output; in backward, keep only this rank's columns.
        # TODO: out = ... (1 line)
        raise NotImplementedError('TODO in FullColumnParallelLinear.forward: out = ... (1 line)')
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
    # TODO: weight_shards = ... (1 line)
    raise NotImplementedError('TODO in full_column_parallel_single_step: weight_shards = ... (1 line)')
    dist.all_gather(weight_shards, local_updated_weight)
    global_updated_weight = torch.cat(weight_shards, dim=1)
    check(global_updated_weight, (input_dim, output_dim))
    return global_updated_weight


### Part 5 (optional): Megatron's MLP block, column-parallel then row-parallel.
# Megatron-LM's names for the four mappings (mpu/mappings.py): copy to the model-parallel region is
# f (BroadcastParallel above), reduce from it is g (ReduceParallel below), scatter to it is what the
# layers' constructors do to the full weights (each rank keeps its shard), gather from it is
# GatherParallel above (Part 4's output) and the all-gather of the updated shards at the end.
CopyToModelParallelRegion = BroadcastParallel


class ReduceParallel(torch.autograd.Function):
    """Forward: all-reduce (sum) over the ranks. Backward: identity.

    The function g of Megatron-LM (reduce_from_model_parallel_region): after a row-parallel layer,
    rank i holds a partial output Z_i [bsz, out_dim], its share of Z = sum_i Z_i; forward sums the
    shares so that every rank holds Z. Z is a sum, so the gradient of each Z_i is the gradient of Z,
    which every rank already holds whole: backward passes it on unchanged.
    """

    @staticmethod
    def forward(ctx, x):
        if dist.get_world_size() == 1:
            return x
        # Sum a private copy over the ranks: the caller's tensor stays as it was.
        # TODO: summed = a copy of x, summed in place over all ranks (2 lines)
        raise NotImplementedError('TODO in ReduceParallel.forward: summed = a copy of x, summed in place over all ranks (2 lines)')
        return summed

    @staticmethod
    def backward(ctx, grad_output):
        # TODO: return ... (1 line)
        raise NotImplementedError('TODO in ReduceParallel.backward: return ... (1 line)')


ReduceFromModelParallelRegion = ReduceParallel


class ColumnParallelLinear(nn.Module):
    """Megatron-LM's column-parallel linear layer: Part 4's layer without the final all-gather.

    W [in_dim, out_dim] is split along its columns, W = [W_0 | ... | W_{p-1}]; rank i holds W_i
    [in_dim, out_dim / p] and returns out_i = X @ W_i [bsz, out_dim / p], its own columns of the
    output, left split: the row-parallel layer after it takes exactly those columns.
    """

    def __init__(self, weight: torch.Tensor, world_size: int, rank: int):
        super().__init__()
        self.in_dim, self.out_dim = weight.shape
        self.local_out_dim = divide(self.out_dim, world_size, "out_dim", "world_size")
        start = rank * self.local_out_dim
        self.W = nn.Parameter(weight[:, start:start + self.local_out_dim].clone().contiguous())

    def forward(self, X):
        """X [bsz, in_dim], the same on every rank -> out_i [bsz, out_dim / p]."""
        local_bsz = X.shape[0]
        check(X, (local_bsz, self.in_dim))
        # f: identity forward; in backward the ranks' shares of the gradient of X are summed.
        # TODO: X = ... (f, 1 line)
        raise NotImplementedError('TODO in ColumnParallelLinear.forward: X = ... (f, 1 line)')
        local_out = torch.einsum("bi,ij->bj", X, self.W).contiguous()
        check(local_out, (local_bsz, self.local_out_dim))
        return local_out


class RowParallelLinear(nn.Module):
    """Megatron-LM's row-parallel linear layer: out = H @ W with W split along its rows.

    W [in_dim, out_dim] = [W_0; W_1; ...; W_{p-1}] (stacked); rank i holds the rows
    [i * in_dim / p, (i + 1) * in_dim / p), W_i of shape [in_dim / p, out_dim], and takes H_i
    [bsz, in_dim / p], the same columns of the input. Then H @ W = sum_i H_i @ W_i: each rank
    computes its partial sum Z_i = H_i @ W_i [bsz, out_dim] and g (ReduceParallel) adds them up.

    Parameters:
        weight (torch.Tensor): the full weight matrix, shape [in_dim, out_dim]
        world_size (int): number of ranks p; must divide in_dim
        rank (int): this rank i
    """

    def __init__(self, weight: torch.Tensor, world_size: int, rank: int):
        super().__init__()
        self.in_dim, self.out_dim = weight.shape
        self.local_in_dim = divide(self.in_dim, world_size, "in_dim", "world_size")
        # This rank's rows of the full weight.
        # TODO: start = ..., end = ... (2 lines)
        raise NotImplementedError('TODO in RowParallelLinear.__init__: start = ..., end = ... (2 lines)')
        self.W = nn.Parameter(weight[start:end, :].clone().contiguous())

    def forward(self, H_local):
        """H_i [bsz, in_dim / p] -> out [bsz, out_dim], the same on every rank."""
        local_bsz = H_local.shape[0]
        check(H_local, (local_bsz, self.local_in_dim))
        # This rank's partial sum, then g: the sum of every rank's partial sum.
        # TODO: partial = ..., out = ... (2 lines)
        raise NotImplementedError('TODO in RowParallelLinear.forward: partial = ..., out = ... (2 lines)')
        check(out, (local_bsz, self.out_dim))
        return out


class MegatronMLP(nn.Module):
    """Megatron-LM's MLP block: out = GeLU(X @ W1) @ W2, no biases, with one all-reduce each way.

    X [bsz, d] -> f -> ColumnParallelLinear W1_i [d, h / p] -> GeLU -> RowParallelLinear
    W2_i [h / p, d] -> g -> out [bsz, d]. GeLU works element by element, so rank i can apply it to
    its own columns H_i = X @ W1_i and hand GeLU(H_i) straight to its rows of W2: no all-gather in
    between. f all-reduces the gradient of X in backward, g the output in forward.

    Parameters:
        w1 (torch.Tensor): [d, h], split by columns
        w2 (torch.Tensor): [h, d], split by rows
        world_size, rank: as for the layers; p must divide h
    """

    def __init__(self, w1: torch.Tensor, w2: torch.Tensor, world_size: int, rank: int):
        super().__init__()
        self.fc1 = ColumnParallelLinear(w1, world_size, rank)   # first: its parameters come first
        self.fc2 = RowParallelLinear(w2, world_size, rank)

    def forward(self, X):
        # TODO: out = ... (fc1, GeLU, fc2: 1 line)
        raise NotImplementedError('TODO in MegatronMLP.forward: out = ... (fc1, GeLU, fc2: 1 line)')
        return out


def init_mlp_weights(seed):
    """W1 [input_dim, hidden_dim] and W2 [hidden_dim, input_dim], drawn after torch.manual_seed(seed)
    and scaled by 1/sqrt(fan_in), so that the activations stay of the order of 1."""
    torch.manual_seed(seed)
    w1 = torch.randn(input_dim, hidden_dim) / input_dim ** 0.5
    w2 = torch.randn(hidden_dim, input_dim) / hidden_dim ** 0.5
    return w1, w2


def mlp_single_step(seed=42, device=None):
    """Part 5's check: one SGD step of the same MLP, GeLU(X @ W1) @ W2, on one device.

    Returns:
        (updated_w1, updated_w2) of shapes [input_dim, hidden_dim] and [hidden_dim, input_dim]
    """
    device = get_device() if device is None else device
    w1, w2 = init_mlp_weights(seed)
    w1, w2 = nn.Parameter(w1.to(device)), nn.Parameter(w2.to(device))
    optimizer = optim.SGD([w1, w2], lr=learning_rate)
    inputs, targets = create_batch(global_batch_size, input_dim, input_dim, seed=seed, device=device)
    loss = nn.MSELoss(reduction="mean")(nn.functional.gelu(inputs @ w1) @ w2, targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return w1.detach(), w2.detach()


def megatron_mlp_single_step(seed=42, device=None):
    """One SGD step of MegatronMLP on the whole batch, returning both full updated weights.

    The batch is X [global_batch_size, input_dim] with targets Y of the same shape (the block maps
    d features to d). Rank i updates W1_i [input_dim, hidden_dim / p] and W2_i
    [hidden_dim / p, input_dim]; the updated shards are gathered into W1 [input_dim, hidden_dim]
    (columns) and W2 [hidden_dim, input_dim] (rows).

    Returns:
        (updated_w1, updated_w2), the same on every rank
    """
    device = get_device() if device is None else device
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_hidden_dim = divide(hidden_dim, world_size, "hidden_dim", "world_size")

    w1, w2 = init_mlp_weights(seed)
    model = MegatronMLP(w1, w2, world_size, rank).to(device)
    optimizer = optim.SGD(model.parameters(), lr=learning_rate)
    loss_fn = nn.MSELoss(reduction="mean")

    inputs, targets = create_batch(global_batch_size, input_dim, input_dim, seed=seed, device=device)
    predictions = model(inputs)
    check(predictions, (global_batch_size, input_dim))
    loss = loss_fn(predictions, targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    local_w1 = model.fc1.W.detach().contiguous()
    local_w2 = model.fc2.W.detach().contiguous()
    check(local_w1, (input_dim, local_hidden_dim))
    check(local_w2, (local_hidden_dim, input_dim))
    w1_shards = [torch.empty_like(local_w1) for _ in range(world_size)]
    w2_shards = [torch.empty_like(local_w2) for _ in range(world_size)]
    dist.all_gather(w1_shards, local_w1)
    dist.all_gather(w2_shards, local_w2)
    updated_w1 = torch.cat(w1_shards, dim=1)
    # W2's shards are blocks of its rows.
    # TODO: updated_w2 = ... (1 line)
    raise NotImplementedError('TODO in megatron_mlp_single_step: updated_w2 = ... (1 line)')
    check(updated_w1, (input_dim, hidden_dim))
    check(updated_w2, (hidden_dim, input_dim))
    return updated_w1, updated_w2


### Optional: the vocabulary split over the ranks, in the embedding and in the cross-entropy.
# With p ranks and a vocabulary of V ids, rank r holds the ids [r * V / p, (r + 1) * V / p): the
# embedding table's rows and the LM head's logit columns of those ids. Neither the table nor the
# logits [N, V] are ever gathered; the ranks exchange numbers of size [N, d] (the embedding) and [N]
# (the loss) only. These are Megatron-LM's VocabParallelEmbedding and vocab_parallel_cross_entropy.
def vocab_slice(vocab_size, world_size, rank):
    """(start, end): the vocabulary ids [start, end) that rank holds, V / p of them."""
    local_vocab = divide(vocab_size, world_size, "vocab_size", "world_size")
    return rank * local_vocab, (rank + 1) * local_vocab


class VocabReduce(torch.autograd.Function):
    """Forward: all-reduce (sum) over the ranks. Backward: identity (Megatron-LM's g).

    Each rank's share of the embedding is zero but for the tokens it holds, so the sum is the whole
    lookup; the gradient of the sum is the gradient of each share, already whole on every rank."""

    @staticmethod
    def forward(ctx, x):
        summed = x.contiguous().clone()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(summed, op=dist.ReduceOp.SUM)
        return summed

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


class VocabParallelEmbedding(nn.Module):
    """An embedding table E [V, d] split by vocabulary rows: rank r keeps E_r = E[start:end] [V / p, d].

    forward(tokens [...] int64) -> [..., d], the same on every rank:
        x_r[i] = E_r[t_i - start] where start <= t_i < end, else 0      the masked lookup
        x = sum_r x_r                                                   all-reduce (g)
    Backward: each rank's E_r gathers the gradient of the rows of its own tokens only.
    """

    def __init__(self, weight: torch.Tensor, world_size: int, rank: int):
        super().__init__()
        self.vocab_size, self.dim = weight.shape
        self.start, self.end = vocab_slice(self.vocab_size, world_size, rank)
        self.weight = nn.Parameter(weight[self.start:self.end].clone().contiguous())

    def forward(self, tokens):
        # Tokens outside [start, end) look up row 0 (any row would do), then their rows are zeroed.
        # TODO: owned = ..., local = ... (2 lines)
        raise NotImplementedError('TODO in VocabParallelEmbedding.forward: owned = ..., local = ... (2 lines)')
        share = nn.functional.embedding(local, self.weight)
        # TODO: share = ... (zero the rows of the tokens held elsewhere, 1 line)
        raise NotImplementedError('TODO in VocabParallelEmbedding.forward: share = ... (zero the rows of the tokens held elsewhere, 1 line)')
        # TODO: return ... (g, 1 line)
        raise NotImplementedError('TODO in VocabParallelEmbedding.forward: return ... (g, 1 line)')


def all_reduce_vocab(x, op):
    """x all-reduced over the ranks with `op` (a copy; x itself stays as it was)."""
    x = x.contiguous().clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(x, op=op)
    return x


class VocabParallelCrossEntropy(torch.autograd.Function):
    """The mean cross-entropy of logits split by vocabulary columns, none of them gathered.

    logits z_r [N, V / p] (rank r's columns of z [N, V]), targets t [N] (global ids, or ignore_index):
        m_i = max_j z_ij            local max, then all-reduce(MAX): every exp(z - m) <= 1
        S_i = sum_j exp(z_ij - m_i) local sum, then all-reduce(SUM)
        y_i = z_i,t_i - m_i         from the rank that holds t_i, 0 elsewhere, then all-reduce(SUM)
        loss = sum over the n non-ignored i of (log S_i - y_i), divided by n
    backward on each rank's own columns, no communication:
        dloss/dz_ij = (exp(z_ij - m_i) / S_i - [j = t_i]) / n, 0 on ignored rows;
        the one-hot only on the rank that holds t_i.
    """

    @staticmethod
    def forward(ctx, logits, targets, world_size, rank, ignore_index):
        start, end = vocab_slice(logits.shape[-1] * world_size, world_size, rank)
        # TODO: shifted = ... (the max over every rank's columns, subtracted: 1 line)
        raise NotImplementedError("TODO in VocabParallelCrossEntropy.forward: shifted = ... (the max over every rank's columns, subtracted: 1 line)")
        # TODO: owned = ..., local = ... (the targets this rank holds, and their columns: 2 lines)
        raise NotImplementedError('TODO in VocabParallelCrossEntropy.forward: owned = ..., local = ... (the targets this rank holds, and their columns: 2 lines)')
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1)
        # TODO: picked = ..., exp = ..., sum_exp = ... (3 lines)
        raise NotImplementedError('TODO in VocabParallelCrossEntropy.forward: picked = ..., exp = ..., sum_exp = ... (3 lines)')
        valid = targets != ignore_index
        count = valid.sum().clamp(min=1)
        # TODO: loss = ... (the mean over the non-ignored targets: 1 line)
        raise NotImplementedError('TODO in VocabParallelCrossEntropy.forward: loss = ... (the mean over the non-ignored targets: 1 line)')
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), owned, local, valid, count)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        softmax, owned, local, valid, count = ctx.saved_tensors
        rows = torch.arange(softmax.shape[0], device=softmax.device)
        grad = softmax.clone()
        # TODO: the one-hot where this rank holds the target, then the rows scaled (2 lines)
        raise NotImplementedError('TODO in VocabParallelCrossEntropy.backward: the one-hot where this rank holds the target, then the rows scaled (2 lines)')
        return grad, None, None, None, None


def vocab_parallel_cross_entropy(logits, targets, world_size, rank, ignore_index=-100):
    """logits [N, V / p], this rank's columns; targets [N] int64, global ids -> the scalar mean loss
    over the targets that are not ignore_index, the same on every rank (differentiable)."""
    check(logits, (targets.shape[0], -1))
    return VocabParallelCrossEntropy.apply(logits, targets, world_size, rank, ignore_index)

def vocab_parallel_loss(tokens, targets, embedding, head, world_size, rank, logit_shift=0.0, ignore_index=-100):
    """Part 6: the loss of B tokens through the vocabulary-parallel embedding and LM head, and its backward.

    tokens [B] and targets [B] (int64, global ids; a target may be ignore_index), embedding E [V, d]
    and head W [d, V], the full tables: rank r keeps E's rows and W's columns of its ids. The logits
    are z = E[tokens] @ W + logit_shift [B, V], of which rank r computes its columns z_r [B, V / p].

    Returns:
        (loss, the gradient of z_r [B, V / p], the gradient of E_r [V / p, d]): the loss, a scalar
        tensor, the same on every rank; the gradients of this rank's own columns and rows
    """
    embed = VocabParallelEmbedding(embedding, world_size, rank)
    start, end = vocab_slice(embedding.shape[0], world_size, rank)
    x = embed(tokens)                            # [B, d], the same on every rank
    # f: every rank's columns of the head use the whole x; in backward, the gradients of x are summed.
    # TODO: x = ... (f, 1 line)
    raise NotImplementedError('TODO in vocab_parallel_loss: x = ... (f, 1 line)')
    logits = x @ head[:, start:end] + logit_shift
    check(logits, (tokens.shape[0], end - start))
    logits.retain_grad()
    loss = vocab_parallel_cross_entropy(logits, targets, world_size, rank, ignore_index)
    loss.backward()
    return loss.detach(), logits.grad, embed.weight.grad


def vocab_single_loss(tokens, targets, embedding, head, logit_shift=0.0, ignore_index=-100):
    """Part 6's check: the same loss on one device, torch's cross_entropy on the full logits [B, V].
    Returns (loss, the gradient of the logits [B, V], the gradient of E [V, d])."""
    embedding = embedding.clone().requires_grad_(True)
    logits = embedding[tokens] @ head + logit_shift
    logits.retain_grad()
    loss = nn.functional.cross_entropy(logits, targets, ignore_index=ignore_index)
    loss.backward()
    return loss.detach(), logits.grad, embedding.grad


def init_vocab_data(seed, device):
    """tokens [B], targets [B] (the last 4 ignored: padding), E [vocab_size, input_dim] and W
    [input_dim, vocab_size] in float64, drawn after torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (global_batch_size,))
    targets = torch.randint(0, vocab_size, (global_batch_size,))
    targets[-4:] = -100
    embedding = torch.randn(vocab_size, input_dim, dtype=torch.float64)
    head = torch.randn(input_dim, vocab_size, dtype=torch.float64) / input_dim ** 0.5
    return tokens.to(device), targets.to(device), embedding.to(device), head.to(device)


def check_vocab_parallel(world_size, rank, device):
    """Run Part 6 on the handout's data and compare it with the full logits on one device: the loss,
    then this rank's columns of the logits' gradient and its rows of the embedding's."""
    data = init_vocab_data(seed, device)
    results = run_part("VocabParallel", vocab_parallel_loss, *data, world_size, rank)
    if results is not None:
        start, end = vocab_slice(vocab_size, world_size, rank)
        want_loss, want_logits_grad, want_embedding_grad = vocab_single_loss(*data)
        for want, got in zip((want_loss, want_logits_grad[:, start:end], want_embedding_grad[start:end]), results):
            compare_tensors(want, got, prefix="VocabParallel")


### Part 7 (optional): a transformer block in tensor parallel: Part 5's layers in the attention and the MLP.
class ParallelSelfAttention(nn.Module):
    """Causal multi-head self-attention, its heads split over the ranks (Megatron-LM's layout).

    X [bsz, seq, d], d = num_heads * head_dim. W_qkv [d, 3d] = [W_q | W_k | W_v], each [d, d] with
    head j's columns at [j * head_dim, (j + 1) * head_dim); W_o [d, d]. Rank i of p runs the
    heads [i * num_heads / p, (i + 1) * num_heads / p): its columns of W_q, W_k and W_v in one
    ColumnParallelLinear (f before it), and the same rows of W_o in a RowParallelLinear (g after
    it). Attention never mixes heads, so the ranks need nothing of each other in between:

        Q_i, K_i, V_i = X W_q,i, X W_k,i, X W_v,i                       [bsz, seq, d / p]
        A_i = softmax(Q_i K_i^T / sqrt(head_dim) + causal mask) V_i     head by head
        out = sum_i A_i W_o,i                                           [bsz, seq, d]

    Parameters:
        w_qkv (torch.Tensor): [d, 3d], the full [W_q | W_k | W_v]
        w_o (torch.Tensor): [d, d], split by rows
        world_size, rank: as for the layers; p must divide num_heads
    """

    def __init__(self, w_qkv: torch.Tensor, w_o: torch.Tensor, world_size: int, rank: int):
        super().__init__()
        self.d = w_o.shape[0]
        self.head_dim = divide(self.d, num_heads, "d", "num_heads")
        self.local_heads = divide(num_heads, world_size, "num_heads", "world_size")
        # ColumnParallelLinear keeps rank i's i-th block of columns: make that block its heads'
        # Q, K and V ([W_q,0 | W_k,0 | W_v,0 | W_q,1 | ...]).
        # TODO: grouped = W_qkv's columns regrouped rank by rank (2 lines)
        raise NotImplementedError("TODO in ParallelSelfAttention.__init__: grouped = W_qkv's columns regrouped rank by rank (2 lines)")
        self.qkv = ColumnParallelLinear(grouped, world_size, rank)   # first: its parameter comes first
        # TODO: self.proj = ... (1 line)
        raise NotImplementedError('TODO in ParallelSelfAttention.__init__: self.proj = ... (1 line)')

    def forward(self, X):
        """X [bsz, seq, d], the same on every rank -> out [bsz, seq, d], the same on every rank."""
        bsz, seq, d = X.shape
        check(X, (bsz, seq, self.d))
        qkv = self.qkv(X.reshape(bsz * seq, d))   # the layers take rows of tokens
        # TODO: q, k, v = ..., each [bsz, local heads, seq, head_dim] (2 lines)
        raise NotImplementedError('TODO in ParallelSelfAttention.forward: q, k, v = ..., each [bsz, local heads, seq, head_dim] (2 lines)')
        scores = q @ k.transpose(-2, -1) / self.head_dim ** 0.5
        future = torch.ones(seq, seq, dtype=torch.bool, device=X.device).triu(1)
        weights = nn.functional.dropout(scores.masked_fill(future, float("-inf")).softmax(dim=-1),
                                        dropout, self.training)
        heads = (weights @ v).transpose(1, 2).reshape(bsz * seq, self.local_heads * self.head_dim)
        # TODO: out = ... (1 line)
        raise NotImplementedError('TODO in ParallelSelfAttention.forward: out = ... (1 line)')
        return out.reshape(bsz, seq, d)


class ParallelTransformerBlock(nn.Module):
    """A pre-LayerNorm transformer block: H = X + Attn(LN1(X)), out = H + MLP(LN2(H)).

    The attention is ParallelSelfAttention, the MLP Part 5's MegatronMLP (on rows of tokens); the
    LayerNorms are replicated: every rank holds the whole of them and normalizes the whole X (each
    of their gradients is then the same on every rank). X and out are [bsz, seq, d].

    Parameters:
        w_qkv [d, 3d], w_o [d, d]: the attention's; w1 [d, h], w2 [h, d]: the MLP's
        world_size, rank: p must divide num_heads and h
    """

    def __init__(self, w_qkv, w_o, w1, w2, world_size: int, rank: int):
        super().__init__()
        d = w_o.shape[0]
        self.ln1 = nn.LayerNorm(d)   # the parameters' order: ln1, attention, ln2, MLP
        self.attn = ParallelSelfAttention(w_qkv, w_o, world_size, rank)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = MegatronMLP(w1, w2, world_size, rank)

    def forward(self, X):
        bsz, seq, d = X.shape
        # TODO: H = ..., out = ... (2 lines)
        raise NotImplementedError('TODO in ParallelTransformerBlock.forward: H = ..., out = ... (2 lines)')
        return out


def init_block_weights(seed):
    """W_qkv [d, 3d], W_o [d, d], W1 [d, hidden_dim], W2 [hidden_dim, d] (d = num_heads * head_dim),
    drawn after torch.manual_seed(seed) and scaled by 1/sqrt(fan_in)."""
    d = num_heads * head_dim
    torch.manual_seed(seed)
    shapes = ((d, 3 * d), (d, d), (d, hidden_dim), (hidden_dim, d))
    return tuple(torch.randn(*shape) / shape[0] ** 0.5 for shape in shapes)


def block_batch(seed, device):
    """The block's input X [global_batch_size, seq_len, d] and the gradient G of its output that
    backward starts from (the same shape), drawn after torch.manual_seed(seed + 1)."""
    d = num_heads * head_dim
    torch.manual_seed(seed + 1)
    inputs = torch.randn(global_batch_size, seq_len, d)
    return inputs.to(device), torch.randn(global_batch_size, seq_len, d).to(device)


def block_single_device(seed=42, device=None):
    """The check of the block: the same block on one device, in plain PyTorch.

    Returns:
        (output, input_grad), each [global_batch_size, seq_len, d]
    """
    device = get_device() if device is None else device
    w_qkv, w_o, w1, w2 = (w.to(device) for w in init_block_weights(seed))
    inputs, grad_output = block_batch(seed, device)
    inputs.requires_grad_(True)
    bsz, seq, d = inputs.shape
    norm = nn.functional.layer_norm
    q, k, v = (norm(inputs, (d,)) @ w_qkv).reshape(bsz, seq, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)
    future = torch.ones(seq, seq, dtype=torch.bool, device=device).triu(1)
    weights = (q @ k.transpose(-2, -1) / head_dim ** 0.5).masked_fill(future, float("-inf")).softmax(dim=-1)
    H = inputs + (weights @ v).transpose(1, 2).reshape(bsz, seq, d) @ w_o
    out = H + nn.functional.gelu(norm(H, (d,)) @ w1) @ w2
    out.backward(grad_output)
    return out.detach(), inputs.grad


def transformer_block_forward_backward(seed=42, device=None):
    """ParallelTransformerBlock on the batch of block_batch(seed), backward from its G.

    Returns:
        (output, input_grad), each [global_batch_size, seq_len, d], the same on every rank
    """
    device = get_device() if device is None else device
    rank, world_size = dist.get_rank(), dist.get_world_size()
    block = ParallelTransformerBlock(*init_block_weights(seed), world_size, rank).to(device)
    inputs, grad_output = block_batch(seed, device)
    inputs.requires_grad_(True)
    out = block(inputs)
    check(out, tuple(inputs.shape))
    out.backward(grad_output)
    return out.detach(), inputs.grad


def check_transformer_block(seed, device):
    """Run Part 7 and compare it with the single-device block: its output, then its input's gradient."""
    block_results = run_part("TransformerBlock", transformer_block_forward_backward, seed=seed, device=device)
    if block_results is not None:
        for want, got in zip(block_single_device(seed=seed, device=device), block_results):
            compare_tensors(want, got, prefix="TransformerBlock")


def transformer_single_step(tokens, targets, embedding, blocks, head, world_size, rank):
    """Part 7's step: one SGD step (learning_rate) of a tiny transformer in tensor parallel.

    tokens, targets [B, S] (int64, global ids); embedding E [V, d], blocks: num_layers tuples
    (W_qkv [d, 3d], W_o [d, d], W1 [d, h], W2 [h, d]), head W [d, V], the full weights. Rank r
    keeps E's rows and W's columns of its vocabulary ids, and each block's shards (Part 7's block):

        x = VocabParallelEmbedding(E)(tokens)              [B, S, d], the same on every rank (g)
        x = block_L(... block_1(x))                        ParallelTransformerBlock, one by one
        z_r = f(LayerNorm(x)) @ W_r                        [B S, V / p], never gathered
        loss = vocab_parallel_cross_entropy(z_r, targets)  the mean over the B S tokens

    Returns:
        (loss, the rank's updated parameters): the loss, a scalar tensor, the same on every rank; its
        parameters after the step, in this order: E_r [V / p, d], each block's eight (as
        ParallelTransformerBlock registers them), the final LayerNorm's weight and bias [d], W_r [d, V / p]
    """
    embed = VocabParallelEmbedding(embedding, world_size, rank)
    layers = nn.ModuleList(ParallelTransformerBlock(*weights, world_size, rank) for weights in blocks)
    norm = nn.LayerNorm(embedding.shape[1])
    start, end = vocab_slice(head.shape[1], world_size, rank)
    head_shard = nn.Parameter(head[:, start:end].clone())
    params = [embed.weight, *layers.parameters(), norm.weight, norm.bias, head_shard]
    optimizer = optim.SGD(params, lr=learning_rate)
    bsz, seq = tokens.shape
    x = embed(tokens)
    for layer in layers:
        x = layer(x)
    # f before the head: every rank's columns use the whole x; in backward, their gradients are summed.
    # TODO: x = ..., logits = ... (the rank's columns [B S, V / p], 2 lines)
    raise NotImplementedError("TODO in transformer_single_step: x = ..., logits = ... (the rank's columns [B S, V / p], 2 lines)")
    check(logits, (bsz * seq, end - start))
    # TODO: loss = ..., then the step (zero the gradients, backward, optimizer step: 4 lines)
    raise NotImplementedError('TODO in transformer_single_step: loss = ..., then the step (zero the gradients, backward, optimizer step: 4 lines)')
    return loss.detach(), [p.detach().clone() for p in params]
### Part 8 (optional): sequence parallelism on Part 7's block (Korthikanti et al., arXiv 2205.05198).
def sequence_first(x):
    """[bsz, seq, d] -> [seq, bsz, d], contiguous: the collectives join and cut along dimension 0."""
    return x.transpose(0, 1).contiguous()


def gather_sequence(x):
    """[bsz, seq / p, d], the rank's slice of the sequence -> [bsz, seq, d]: every rank's slice in
    rank order (rank 0's tokens first), on every rank."""
    world_size = dist.get_world_size()
    if world_size == 1:
        return x
    bsz, local_seq, d = x.shape
    out = torch.empty(world_size * local_seq, bsz, d, dtype=x.dtype, device=x.device)
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor   # its newer name
    # TODO: all-gather the slices along the sequence into out (1 line)
    raise NotImplementedError('TODO in gather_sequence: all-gather the slices along the sequence into out (1 line)')
    return out.transpose(0, 1)   # [seq, bsz, d] -> [bsz, seq, d]


def reduce_scatter_sequence(x):
    """[bsz, seq, d], a partial sum on each rank -> [bsz, seq / p, d]: the rank's own slice of the
    sequence of the sum over the ranks."""
    world_size = dist.get_world_size()
    if world_size == 1:
        return x
    bsz, seq, d = x.shape
    out = torch.empty(divide(seq, world_size, "seq_len", "world_size"), bsz, d, dtype=x.dtype, device=x.device)
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor   # its newer name
    # TODO: reduce-scatter x's sum along the sequence into out (1 line)
    raise NotImplementedError("TODO in reduce_scatter_sequence: reduce-scatter x's sum along the sequence into out (1 line)")
    return out.transpose(0, 1)


class GatherSequence(torch.autograd.Function):
    """Sequence parallel's f: forward all-gathers the slices along the sequence; backward
    reduce-scatters the gradient along it (every rank's share of the gradient of each token, summed,
    goes back to the rank that holds the token)."""

    @staticmethod
    def forward(ctx, x):
        return gather_sequence(x)

    @staticmethod
    def backward(ctx, grad_output):
        # TODO: return ... (1 line)
        raise NotImplementedError('TODO in GatherSequence.backward: return ... (1 line)')


class ReduceScatterSequence(torch.autograd.Function):
    """Sequence parallel's g: forward reduce-scatters the ranks' partial sums along the sequence;
    backward all-gathers the gradient of the slices (each partial sum feeds every token)."""

    @staticmethod
    def forward(ctx, x):
        return reduce_scatter_sequence(x)

    @staticmethod
    def backward(ctx, grad_output):
        # TODO: return ... (1 line)
        raise NotImplementedError('TODO in ReduceScatterSequence.backward: return ... (1 line)')


class SequenceParallelBlock(nn.Module):
    """Part 7's block with sequence parallelism: rank i of p holds X_i [bsz, seq / p, d], its slice
    of the sequence (tokens [i seq / p, (i + 1) seq / p)), and returns its slice of the output.

        H_i   = X_i + RS(Attn_i(AG(LN1(X_i))) @ W_o,i)       AG: all-gather, RS: reduce-scatter
        out_i = H_i + RS(GeLU(AG(LN2(H_i)) @ W1_i) @ W2_i)   along the sequence

    LayerNorm and the residuals work on the rank's slice; the attention and the MLP on the whole
    sequence, with Part 7's shards (its ParallelTransformerBlock holds them, and the LayerNorms).
    Every rank holds the whole LayerNorms but applies them to its own tokens only, so their
    gradients are partial sums: f (BroadcastParallel) on the weight and bias all-reduces them.

    Parameters:
        w_qkv [d, 3d], w_o [d, d], w1 [d, h], w2 [h, d]: as for ParallelTransformerBlock
        world_size, rank: p must divide num_heads, h and seq_len
    """

    def __init__(self, w_qkv, w_o, w1, w2, world_size: int, rank: int):
        super().__init__()
        self.block = ParallelTransformerBlock(w_qkv, w_o, w1, w2, world_size, rank)

    def layer_norm(self, norm, X):
        """norm (an nn.LayerNorm) on the rank's tokens X; its weight's and bias's gradients summed
        over the ranks in backward."""
        # TODO: weight = ..., bias = ... (2 lines)
        raise NotImplementedError('TODO in SequenceParallelBlock.layer_norm: weight = ..., bias = ... (2 lines)')
        return nn.functional.layer_norm(X, norm.normalized_shape, weight, bias, norm.eps)

    def attend(self, X):
        """The rank's heads on the whole sequence X [bsz, seq, d] -> [bsz, seq, d / p], before W_o."""
        attn, (bsz, seq, _) = self.block.attn, X.shape
        q, k, v = (X @ attn.qkv.W).reshape(bsz, seq, 3, attn.local_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        future = torch.ones(seq, seq, dtype=torch.bool, device=X.device).triu(1)
        weights = nn.functional.dropout((q @ k.transpose(-2, -1) / attn.head_dim ** 0.5)
                                        .masked_fill(future, float("-inf")).softmax(dim=-1), dropout, self.training)
        return (weights @ v).transpose(1, 2).reshape(bsz, seq, attn.local_heads * attn.head_dim)

    def forward(self, X):
        """X_i [bsz, seq / p, d] -> out_i [bsz, seq / p, d]."""
        block = self.block
        # TODO: normed = ..., H = ..., normed = ..., out = ... (4 lines)
        raise NotImplementedError('TODO in SequenceParallelBlock.forward: normed = ..., H = ..., normed = ..., out = ... (4 lines)')
        return out


def sequence_parallel_forward_backward(seed=42, device=None):
    """SequenceParallelBlock on this rank's slice of the batch of block_batch(seed), backward from
    the same slice of its G.

    Returns:
        (output, input_grad), each [global_batch_size, seq_len / p, d]: the rank's slices
    """
    device = get_device() if device is None else device
    rank, world_size = dist.get_rank(), dist.get_world_size()
    block = SequenceParallelBlock(*init_block_weights(seed), world_size, rank).to(device)
    inputs, grad_output = block_batch(seed, device)
    local = divide(inputs.shape[1], world_size, "seq_len", "world_size")
    mine = slice(rank * local, (rank + 1) * local)
    inputs = inputs[:, mine].detach().requires_grad_(True)
    out = block(inputs)
    check(out, tuple(inputs.shape))
    out.backward(grad_output[:, mine])
    return out.detach(), inputs.grad


def check_sequence_parallel(seed, device):
    """Run Part 8 and compare it with the rank's slices of the single-device block's output and input gradient."""
    if dist.get_rank() == 0:
        log(f"[Rank 0] Part 8: sequence parallelism on the block (optional), world size {dist.get_world_size()}.")
    results = run_part("SequenceParallel", sequence_parallel_forward_backward, seed=seed, device=device)
    if results is not None:
        local = results[0].shape[1]
        mine = slice(dist.get_rank() * local, (dist.get_rank() + 1) * local)
        for want, got in zip(block_single_device(seed=seed, device=device), results):
            compare_tensors(want[:, mine], got, prefix="SequenceParallel")


def run_part(prefix, part, *args, **kwargs):
    """Call one part; log it as not implemented (and return None) while it still has a TODO."""
    try:
        return part(*args, **kwargs)
    except NotImplementedError as e:
        log(f"[{prefix}][Rank {dist.get_rank()}] Not implemented yet: {e}")
        return None


def finish(rank):
    """Wait for every rank, then leave the process group."""
    dist.barrier()
    dist.destroy_process_group()
    log(f"[Rank {rank}] done")


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

    if rank == 0:
        log(f"[Rank {rank}] Part 5: Megatron's MLP block (optional), world size {world_size}.")
    megatron_weights = run_part("MegatronMLP", megatron_mlp_single_step, seed=seed, device=device)
    if megatron_weights is not None:
        # The single-device MLP's step is Part 5's ground truth: W1 first, then W2.
        for want, got in zip(mlp_single_step(seed=seed, device=device), megatron_weights):
            compare_tensors(want, got, prefix="MegatronMLP")

    if rank == 0:
        log(f"[Rank {rank}] Part 6: the vocabulary split over the ranks (optional), world size {world_size}.")
    check_vocab_parallel(world_size, rank, device)

    if rank == 0:
        log(f"[Rank {rank}] Part 7: a transformer block in tensor parallel (optional), world size {world_size}.")
    check_transformer_block(seed, device)
    check_sequence_parallel(seed, device)   # it logs its own header on rank 0

    finish(rank)


if __name__ == "__main__":
    main()
    leave()  # at once: see utils.leave for why
