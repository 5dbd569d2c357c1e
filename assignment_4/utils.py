"""Provided utilities for Assignment 4 (Data and Tensor Parallelism). You do not need to edit this file.

    torchrun --standalone --nproc_per_node=4 assignment_4/assignment4.py   # 4 ranks on this machine
    python assignment_4/assignment4.py                                     # one rank

`assignment4.py` imports everything it needs from here:

    init_distributed()   start the process group from torchrun's environment (or a one-rank world)
    get_device()         the device this rank computes on, so no code needs the literal "cuda"
    create_batch(...)    the synthetic batch every part trains on
    check(t, shape)      a run-time shape guard
    compare_tensors(...) one "[Part][Rank r] Tensors match: ..." line in the log
    expected_weight(...) the closed-form result of one SGD step, the ground truth of every part
    divide(...)          integer division that explains itself when it does not divide
    log(...)             print one whole line, even when several ranks share one stdout
    leave()              end the process at once after a run that went well

Environment knobs: A4_BACKEND=gloo forces CPU even where GPUs exist; A4_TIMEOUT_S (default 60) is
how long a collective may wait for a missing rank before the run fails instead of hanging (this
assignment's collectives take milliseconds: a rank that skipped one is not coming).
"""

import atexit
import datetime
import gc
import hashlib
import os
import socket
import sys

import torch
import torch.distributed as dist


def log(message: str) -> None:
    """Write `message` and its newline with a single write.

    Ranks on one node share one stdout; `print()` issues the text and the newline as two writes,
    which other ranks' lines can land between. One write per line keeps every line whole.
    """
    sys.stdout.flush()
    sys.stdout.write(f"{message}\n")
    sys.stdout.flush()


def code_fingerprint(path=None) -> str:
    """sha256 of the running script (by default `__main__`), so a log can be matched to its code."""
    if path is None:
        path = getattr(sys.modules.get("__main__"), "__file__", None)
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except (OSError, TypeError):
        return "unknown"


def _pick_backend(local_rank: int, local_world_size: int) -> str:
    """nccl when every rank on this node can have its own GPU, gloo on the CPU otherwise."""
    forced = os.environ.get("A4_BACKEND", "").strip().lower()
    if forced:
        if forced not in ("gloo", "nccl"):
            raise ValueError(f"A4_BACKEND must be 'gloo' or 'nccl', not {forced!r}")
        return forced
    if torch.cuda.is_available() and torch.cuda.device_count() >= max(local_world_size, local_rank + 1):
        return "nccl"
    return "gloo"


def init_distributed():
    """Initialise the default process group and pick this rank's device.

    Under torchrun the ranks come from the environment (RANK, LOCAL_RANK, WORLD_SIZE). Run as plain
    `python`, without those variables, the script becomes a one-rank world. If a process group
    already exists (a caller set one up), it is used as it is.

    Returns:
        (rank, local_rank, world_size)
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0)), dist.get_world_size()

    # What a rank prints reaches the job's .log line by line: under Slurm stdout is a file, which
    # Python writes in blocks of 8 KB, and a run killed at its time limit (a hang) would lose the
    # last lines it printed, the ones that say where it stopped. (stderr is line-buffered already.)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)

    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    node = os.environ.get("SLURM_NODEID", "N/A")

    backend = _pick_backend(local_rank, local_world_size)
    timeout = datetime.timedelta(seconds=float(os.environ.get("A4_TIMEOUT_S", 60)))
    device_id = None
    if backend == "nccl":
        # Each process on a node drives the GPU numbered by its local rank.
        torch.cuda.set_device(local_rank)
        device_id = torch.device("cuda", local_rank)
    if launched:
        dist.init_process_group(backend=backend, timeout=timeout, device_id=device_id)
    else:
        # No launcher: a world of one rank needs no rendezvous, an in-memory store will do.
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout, device_id=device_id)

    # Tensors left in reference cycles (autograd graphs of the parts) can keep gloo's worker threads
    # alive until the interpreter is torn down, and tearing them down then aborts the process
    # ("terminate called without an active exception") after a run that went well. Collect such
    # cycles at exit, while the interpreter still works.
    atexit.register(gc.collect)

    device = get_device()
    log(f"[Distributed Init] Rank {rank} initialized on node {node} ({socket.gethostname()}) on "
        f"{device} | backend {backend} | world size {world_size} | torch {torch.__version__} | "
        f"code sha256 {code_fingerprint()}")
    dist.barrier()
    if rank == 0:
        log(f"[Rank {rank}] All ranks ready!")
    return rank, local_rank, world_size


def leave(status: int = 0) -> None:
    """End the process now, skipping the interpreter's teardown.

    Called once the run is over and the process group destroyed. gloo's worker threads can still
    hold tensors then, and tearing the interpreter down under them aborts the process (SIGABRT,
    "terminate called without an active exception") after a run that went well, which makes the
    job look failed. Everything was written already; nothing is lost by leaving at once.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def get_device() -> torch.device:
    """The device this rank computes on: its GPU under nccl, the CPU under gloo.

    Without a process group: the first GPU if there is one, else the CPU.
    """
    if dist.is_available() and dist.is_initialized():
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def divide(numerator: int, denominator: int, numerator_name: str, denominator_name: str) -> int:
    """numerator // denominator, or a ValueError that prints both numbers when it does not divide."""
    if numerator % denominator != 0:
        raise ValueError(f"{numerator_name} ({numerator}) is not divisible by "
                         f"{denominator_name} ({denominator})")
    return numerator // denominator


def create_batch(batch_size, input_dim, output_dim, seed=42, device=None):
    """Create the synthetic inputs and regression targets of one batch.

    The numbers are drawn on the CPU after `torch.manual_seed(seed)` and then moved to `device`,
    so every device (and every rank) gets exactly the same batch for the same seed.

    Parameters:
        batch_size (int): number of examples B
        input_dim (int): features per example (the rows of W)
        output_dim (int): targets per example (the columns of W)
        seed (int): random seed
        device: where the tensors live (default: get_device())

    Returns:
        (inputs, targets): inputs of shape [B, input_dim], targets of shape [B, output_dim]
    """
    device = get_device() if device is None else device
    torch.manual_seed(seed)
    inputs = torch.randn(batch_size, input_dim)
    targets = torch.randn(batch_size, output_dim)
    return inputs.to(device), targets.to(device)


def check(tensor, expected_shape):
    """Assert that `tensor` has `expected_shape`; a dimension <= 0 in `expected_shape` matches any size.

    Example:
        >>> x = torch.randn(32, 64, 10)
        >>> check(x, [32, 64, 10])   # passes
        >>> check(x, [32, -1, 10])   # passes: the middle dimension is a wildcard
        >>> check(x, [32, 128, 10])  # AssertionError naming dimension 1
    """
    if tensor is None:
        return
    assert isinstance(tensor, torch.Tensor), "SHAPE GUARD: Provided tensor is not a torch.Tensor!"
    actual_shape = list(tensor.detach().shape)
    assert isinstance(expected_shape, (list, tuple)), "SHAPE GUARD: expected_shape must be a list or tuple!"
    assert len(expected_shape) == len(actual_shape), (
        f"SHAPE GUARD: Expected shape length {len(expected_shape)} but got {len(actual_shape)} "
        f"with shape {actual_shape}.")
    for idx, (actual_dim, expected_dim) in enumerate(zip(actual_shape, expected_shape)):
        if expected_dim <= 0:
            continue
        assert actual_dim == expected_dim, (
            f"SHAPE GUARD: At dimension {idx}: expected {expected_dim}, but got {actual_dim} "
            f"(actual shape: {actual_shape}).")


def compare_tensors(tensor1, tensor2, tol=1e-5, prefix=""):
    """Compare two tensors and log one line: "[prefix][Rank r] Tensors match: ... | Max diff: ...".

    Both are compared on the CPU with torch.allclose(rtol=tol, atol=tol). Tensors of different
    shapes do not match (the line says which shapes).

    Returns:
        bool: whether the tensors match
    """
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    head = f"[{prefix}]" if prefix else ""
    a = tensor1.detach().to("cpu", torch.float32)
    b = tensor2.detach().to("cpu", torch.float32)
    if a.shape != b.shape:
        log(f"{head}[Rank {rank}] Tensors match: False | Max diff: inf | Mean diff: inf | "
            f"shapes {list(a.shape)} vs {list(b.shape)}")
        return False
    abs_diff = (a - b).abs()
    max_diff = abs_diff.max().item() if abs_diff.numel() else 0.0
    mean_diff = abs_diff.mean().item() if abs_diff.numel() else 0.0
    is_close = torch.allclose(a, b, rtol=tol, atol=tol)
    log(f"{head}[Rank {rank}] Tensors match: {is_close} | Max diff: {max_diff:.6e} | "
        f"Mean diff: {mean_diff:.6e}")
    return is_close


def expected_weight(seed, batch_size, input_dim, output_dim, lr, device=None):
    """The weight after one SGD step on the MSE loss, in closed form: the ground truth of every part.

    With W0 [input_dim, output_dim] drawn by torch.randn after torch.manual_seed(seed), and
    X [B, input_dim], Y [B, output_dim] from create_batch(B, input_dim, output_dim, seed):

        L(W) = 1/(B*O) * sum((X W - Y)^2)        (nn.MSELoss(reduction="mean"), O = output_dim)
        dL/dW = 2/(B*O) * X^T (X W0 - Y)         shape [input_dim, output_dim]
        W1 = W0 - lr * dL/dW

    Computed in float64 and returned as float32 on `device`.
    """
    torch.manual_seed(seed)
    initial_weight = torch.randn(input_dim, output_dim).double()
    inputs, targets = create_batch(batch_size, input_dim, output_dim, seed=seed, device="cpu")
    inputs, targets = inputs.double(), targets.double()
    grad = 2.0 / (batch_size * output_dim) * inputs.T @ (inputs @ initial_weight - targets)
    updated = initial_weight - lr * grad
    return updated.float().to(get_device() if device is None else device)
