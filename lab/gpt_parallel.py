"""The tiny GPT (lab/gpt.py) in tensor parallel, with loss parallel and with sequence parallel on top:
the same losses and gradients as on one process. lab/transformer.py trains it and prints them.

    torchrun --standalone --nproc-per-node 4 lab/transformer.py     # lab/gpt_parallel.py is its model

n ranks, rank r; shapes [s, b, h] (sequence first), H heads of d = h/H, MLP width f, vocabulary V.

Tensor parallel ("tp"), per block; every rank holds the whole residual stream x [s, b, h]:

    LayerNorm_1(x)                                   [s, b, h]     replicated weights
    f (copy to the region)                                         backward: all-reduce
    q, k, v = . @ W_q^r + b_q^r, ...                 [s, b, h/n]   columns of heads r*H/n .. (r+1)*H/n - 1
    attention of those H/n heads                     [s, b, h/n]   heads are independent: no communication
    . @ W_o^r                                        [s, b, h]     rows r*h/n ..: a partial sum
    g (reduce from the region), + b_o                [s, b, h]     all-reduce; the bias once, after it
    the MLP alike: f, gelu(. @ W_fc1^r + b_fc1^r) [s, b, f/n], . @ W_fc2^r, g, + b_fc2

Loss parallel ("tp+loss"): the embedding table split by vocabulary rows and the LM head by vocabulary
columns (lab/vocab_parallel.py): the logits stay [s, b, V/n] and the loss never gathers them.

Sequence parallel ("tp+loss+sp"): the residual stream, LayerNorm, dropout and the biases after g
work on the rank's rows of the sequence [s/n, b, h]; f becomes an all-gather along the sequence
(backward: reduce-scatter) and g a reduce-scatter (backward: all-gather). Same bytes as the
all-reduce (= reduce-scatter + all-gather), and every activation outside the heads and the MLP is
1/n the size. The weights every rank holds whole but applies to its own rows only (LayerNorm's,
b_o, b_fc2, the positions') get a part of their gradient on each rank: all-reduced after backward.
"""

import sys
from dataclasses import dataclass
from pathlib import Path

_KIT = str(Path(__file__).resolve().parents[1])
if _KIT not in sys.path:        # run as a script only lab/ is on the path; `lab` lives one above
    sys.path.insert(0, _KIT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lab import gpt  # noqa: E402
from lab.mappings import (CopyToTensorParallelRegion, GatherFromSequenceParallelRegion,  # noqa: E402
                          ReduceFromTensorParallelRegion, ReduceScatterToSequenceParallelRegion, all_reduce_grads,
                          tp_rank, tp_size)
from lab.vocab_parallel import vocab_parallel_cross_entropy, vocab_parallel_embedding  # noqa: E402
from utils import divide  # noqa: E402


@dataclass(frozen=True)
class Mode:
    """Which parallelism is on, beside tensor parallelism of the blocks."""
    loss_parallel: bool = False       # embedding and LM head split by vocabulary
    sequence_parallel: bool = False   # LayerNorm, dropout, residuals on the rank's rows of the sequence

    def __post_init__(self):
        if self.sequence_parallel and not self.loss_parallel:
            # the rows of the last LayerNorm meet the vocabulary-split LM head through the all-gather
            raise ValueError("sequence parallel builds on loss parallel here: set loss_parallel too")

    @property
    def name(self) -> str:
        return "tp" + ("+loss" if self.loss_parallel else "") + ("+sp" if self.sequence_parallel else "")


MODES = (Mode(), Mode(loss_parallel=True), Mode(loss_parallel=True, sequence_parallel=True))

# How each weight is split: along which dimension (0: rows, -1: columns), absent: held whole.
SPLIT = {"w_q": -1, "b_q": -1, "w_k": -1, "b_k": -1, "w_v": -1, "b_v": -1, "w_o": 0,
         "w_fc1": -1, "b_fc1": -1, "w_fc2": 0}
SPLIT_LOSS_PARALLEL = {"wte": 0, "w_head": -1}


def check_sizes(cfg: gpt.GPTConfig, n: int, mode: Mode) -> None:
    """A ValueError naming both numbers where a size does not split over n ranks."""
    divide(cfg.n_heads, n, "n_heads", "world_size")
    divide(cfg.ffn, n, "ffn", "world_size")
    if mode.loss_parallel:
        divide(cfg.vocab_size, n, "vocab_size", "world_size")
    if mode.sequence_parallel:
        divide(cfg.seq_len, n, "seq_len", "world_size")


def split_dim(name: str, mode: Mode):
    """The dimension `name` is split along, None where every rank holds it whole."""
    base = name.split(".")[-1]
    return SPLIT.get(base, SPLIT_LOSS_PARALLEL.get(base) if mode.loss_parallel else None)


def shard(name: str, full: torch.Tensor, mode: Mode, rank: int, n: int) -> torch.Tensor:
    """This rank's slice of a full weight (or gradient): the r-th of n equal pieces along its split."""
    dim = split_dim(name, mode)
    return full if dim is None else full.chunk(n, dim=dim)[rank]


def sequence_parallel_weights(params: dict, mode: Mode) -> list:
    """The weights held whole that sequence parallelism applies to the rank's rows only."""
    if not mode.sequence_parallel:
        return []
    return [p for name, p in params.items() if split_dim(name, mode) is None]


def local_heads(cfg: gpt.GPTConfig) -> int:
    """The heads this rank computes: H/n."""
    return cfg.n_heads // tp_size()


def _enter(x: torch.Tensor, mode: Mode) -> torch.Tensor:
    """Into a column-parallel linear: f, or with sequence parallelism the all-gather along the sequence."""
    return GatherFromSequenceParallelRegion.apply(x) if mode.sequence_parallel else CopyToTensorParallelRegion.apply(x)


def _leave(partial: torch.Tensor, mode: Mode) -> torch.Tensor:
    """Out of a row-parallel linear: g, or with sequence parallelism the reduce-scatter along the sequence."""
    if mode.sequence_parallel:
        return ReduceScatterToSequenceParallelRegion.apply(partial)
    return ReduceFromTensorParallelRegion.apply(partial)


def _rows(cfg: gpt.GPTConfig, mode: Mode) -> tuple:
    """(first row, number of rows) of the sequence this rank's residual stream holds."""
    if not mode.sequence_parallel:
        return 0, cfg.seq_len
    k = cfg.seq_len // tp_size()
    return tp_rank() * k, k


def embed(p: dict, inputs: torch.Tensor, cfg: gpt.GPTConfig, mode: Mode) -> torch.Tensor:
    """inputs [s, b] -> the residual stream: [s, b, h], or this rank's rows [s/n, b, h]."""
    start, rows = _rows(cfg, mode)
    if not mode.loss_parallel:
        x = p["wte"][inputs]
    elif mode.sequence_parallel:       # each rank's share of every row, summed into its own rows
        x = ReduceScatterToSequenceParallelRegion.apply(vocab_parallel_embedding(inputs, p["wte"], cfg.vocab_size))
    else:
        x = ReduceFromTensorParallelRegion.apply(vocab_parallel_embedding(inputs, p["wte"], cfg.vocab_size))
    return x + p["wpe"][start:start + rows, None, :]


def block(x: torch.Tensor, p: dict, i: int, cfg: gpt.GPTConfig, mode: Mode, step: int) -> torch.Tensor:
    """One block on this rank's heads and MLP columns; x and the result have the residual stream's shape."""
    w = lambda n: p[f"h{i}.{n}"]                                              # noqa: E731
    start, _ = _rows(cfg, mode)
    drop = lambda t, site: gpt.dropout(t, cfg.dropout, gpt.dropout_key(cfg, step, i, site), start, cfg.seq_len)  # noqa: E731
    h = _enter(gpt.layer_norm(x, p, f"h{i}.ln1"), mode)                       # [s, b, h] on every rank
    ctx = gpt.causal_attention(h @ w("w_q") + w("b_q"), h @ w("w_k") + w("b_k"), h @ w("w_v") + w("b_v"),
                               local_heads(cfg))                              # [s, b, h/n]: this rank's heads
    x = x + drop(_leave(ctx @ w("w_o"), mode) + w("b_o"), 0)                  # partial sums added up, then b_o
    h = _enter(gpt.layer_norm(x, p, f"h{i}.ln2"), mode)
    h = F.gelu(h @ w("w_fc1") + w("b_fc1"))                                   # [s, b, f/n]
    return x + drop(_leave(h @ w("w_fc2"), mode) + w("b_fc2"), 1)


def loss_of(p: dict, inputs: torch.Tensor, targets: torch.Tensor, cfg: gpt.GPTConfig, mode: Mode,
            step: int = 0) -> torch.Tensor:
    """The mean cross-entropy of the batch (the same on every rank) with this rank's weights `p`."""
    x = embed(p, inputs, cfg, mode)
    for i in range(cfg.n_layers):
        x = block(x, p, i, cfg, mode, step)
    x = gpt.layer_norm(x, p, "lnf")
    if not mode.loss_parallel:                     # every rank computes all the logits
        return gpt.loss_of(x @ p["w_head"], targets)
    logits = _enter(x, mode) @ p["w_head"]         # [s, b, V/n]: this rank's columns, never gathered
    return vocab_parallel_cross_entropy(logits, targets, cfg.vocab_size)


def init_shards(cfg: gpt.GPTConfig, mode: Mode, device=None, dtype=torch.float32) -> dict:
    """This rank's weights: the full model from the one seed, each weight cut to the rank's slice."""
    check_sizes(cfg, tp_size(), mode)
    return {name: shard(name, full, mode, tp_rank(), tp_size()).to(dtype).clone().requires_grad_()
            for name, full in gpt.init_params(cfg, device).items()}


def backward(loss: torch.Tensor, params: dict, mode: Mode) -> None:
    """loss.backward(), then the sum over ranks of the gradients of the sequence-parallel weights."""
    loss.backward()
    all_reduce_grads(sequence_parallel_weights(params, mode))
