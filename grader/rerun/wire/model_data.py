"""The data of the tiny transformer's step (MODEL, grader.parts.common): tokens, targets, and every
weight of the model, real only in each rank's own shards.

What rank r of p sees (V the vocabulary, d = num_heads * head_dim, h Part 5's hidden width, L the
check's num_layers):

    tokens, targets   [B, S] int64 in [0, V), the real ones on every rank
    embedding E       [V, d], real only in its own rows [r V/p, (r+1) V/p)
    blocks            L tuples (W_qkv [d, 3d], W_o [d, d], W1 [d, h], W2 [h, d]), each real only in
                      its own heads' columns of W_q, W_k, W_v, the same rows of W_o, its columns of
                      W1 and rows of W2 (as grader.rerun.wire.secret.layer lays out one block)
    head W            [d, V], real only in its own columns [r V/p, (r+1) V/p)

and its own noise everywhere else, so the step is right only if the ranks communicate: the
embedding's lookups (g), every block's g and f, the head's f and the loss's sums. Each rank's real
shards come from its own block seed, drawn in the order above; the grader draws them all
(`rank` None). The weights are scaled by 1/sqrt(fan_in) (E by none: LayerNorm follows it).
"""

from dataclasses import dataclass

import torch

from grader.rerun.wire.protocol import PartSecret


@dataclass
class ModelData:
    """One rank's (or, for the grader, the real) data of the step: float32 weights, on the CPU."""
    tokens: torch.Tensor      # [B, S] int64
    targets: torch.Tensor     # [B, S] int64
    embedding: torch.Tensor   # E [V, d]
    blocks: tuple             # num_layers tuples (W_qkv [d, 3d], W_o [d, d], W1 [d, h], W2 [h, d])
    head: torch.Tensor        # W [d, V]


def shapes(check: dict) -> list:
    """The model's full weights' shapes, in the order they are drawn: E, each block's four, W."""
    v, h, layers = check["vocab_size"], check["hidden_dim"], check["num_layers"]
    d = check["num_heads"] * check["head_dim"]
    return [(v, d)] + [(d, 3 * d), (d, d), (d, h), (h, d)] * layers + [(d, v)]


def _own(tensors: list, g: torch.Generator, k: int, p: int, check: dict) -> None:
    """Rank k's real shards written into the full `tensors` (E, the blocks' weights, W)."""
    d = check["num_heads"] * check["head_dim"]
    cols, share, vocab = d // p, check["hidden_dim"] // p, check["vocab_size"] // p
    tensors[0][k * vocab:(k + 1) * vocab] = torch.randn(vocab, d, generator=g)
    for qkv, wo, w1, w2 in zip(*[iter(tensors[1:-1])] * 4):
        for j in range(3):   # W_q, W_k, W_v: rank k's heads' columns of each
            qkv[:, j * d + k * cols:j * d + (k + 1) * cols] = torch.randn(d, cols, generator=g)
        wo[k * cols:(k + 1) * cols] = torch.randn(cols, d, generator=g)
        w1[:, k * share:(k + 1) * share] = torch.randn(d, share, generator=g)
        w2[k * share:(k + 1) * share] = torch.randn(share, d, generator=g)
    tensors[-1][:, k * vocab:(k + 1) * vocab] = torch.randn(d, vocab, generator=g)


def model(secret: PartSecret, check: dict, rank=None) -> ModelData:
    """The step's data at a check (its job's check mapping): the real one (`rank` None) or rank
    `rank`'s view (its own noise drawn first, in the order of `shapes`)."""
    p = max(1, len(secret.blocks))
    b, s, v = check["global_batch_size"], check["seq_len"], check["vocab_size"]
    g = torch.Generator().manual_seed(secret.seed)
    tokens = torch.randint(0, v, (b, s), generator=g)
    targets = torch.randint(0, v, (b, s), generator=g)
    sizes = shapes(check)
    noise = None if rank is None else torch.Generator().manual_seed(secret.noise[rank])
    tensors = [torch.empty(*shape) if rank is None else torch.randn(*shape, generator=noise) for shape in sizes]
    for k in range(p):
        if rank is None or k == rank:
            _own(tensors, torch.Generator().manual_seed(secret.blocks[k]), k, p, check)
    scaled = [tensors[0]] + [t / shape[0] ** 0.5 for t, shape in zip(tensors[1:], sizes[1:])]
    blocks = tuple(tuple(scaled[1 + 4 * i:5 + 4 * i]) for i in range(check["num_layers"]))
    return ModelData(tokens, targets, scaled[0], blocks, scaled[-1])
