"""Loss parallel: the embedding table split by vocabulary rows and the cross-entropy computed on logits
split by vocabulary columns, never gathered; checked against torch's on the full logits.

    torchrun --standalone --nproc-per-node 4 lab/vocab_parallel.py
    python lab/vocab_parallel.py                                    # one rank: torch's own, twice

With n ranks, rank r holds the vocabulary ids [r*V/n, (r+1)*V/n) (`vocab_range`):

Embedding, E [V, h] split by rows, rank r holds E_r [V/n, h]:

    x_r[i] = E_r[t_i - r*V/n] where rank r holds token t_i, else 0      a masked lookup
    x = sum_r x_r                                                      all-reduce (g); sequence
                                                                       parallel: reduce-scatter

Cross-entropy of logits z [N, V] split by columns, rank r holding z_r [N, V/n], targets t [N]:

    m_i = max_j z_ij                    max over the local columns, then all-reduce(MAX): exp(z - m) <= 1,
                                        where exp(z) overflows for z near 1e4 (float64 at 710)
    S_i = sum_j exp(z_ij - m_i)         local sum, then all-reduce(SUM)
    y_i = z_i,t_i - m_i                 from the rank that holds t_i, 0 from the others: all-reduce(SUM)
    loss = mean over i with t_i != IGNORE of log(S_i) - y_i

Backward, on each rank's own columns only: dloss/dz_ij = (softmax_ij - [j = t_i]) / (number of
non-padding i), 0 on padding rows; the one-hot term only on the rank that holds t_i. The logits'
gradient is never gathered either. These are Megatron-LM's (mpu/cross_entropy.py, layers.py's
VocabParallelEmbedding).
"""

import sys
from dataclasses import dataclass
from pathlib import Path

_KIT = str(Path(__file__).resolve().parents[1])
if _KIT not in sys.path:        # run as a script only lab/ is on the path; `lab` lives one above
    sys.path.insert(0, _KIT)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lab.common import close, log, result_line, run_as_script  # noqa: E402
from lab.gpt import IGNORE  # noqa: E402
from lab.mappings import (CALLS, CopyToTensorParallelRegion, ReduceFromTensorParallelRegion, _reduce,  # noqa: E402
                          group, tp_rank, tp_size)
from utils import divide, get_device  # noqa: E402


def vocab_range(vocab_size: int) -> tuple:
    """(first, last + 1) of the vocabulary ids this rank holds."""
    k = divide(vocab_size, tp_size(), "vocab_size", "world_size")
    return tp_rank() * k, (tp_rank() + 1) * k


def _target_in_slice(targets: torch.Tensor, start: int, width: int) -> tuple:
    """(whether this rank holds each target, its column here, 0 where it does not hold it)."""
    owned = (targets >= start) & (targets < start + width)
    return owned, torch.where(owned, targets - start, torch.zeros_like(targets))


def _max_over_vocab(logits: torch.Tensor) -> torch.Tensor:
    """max over the whole vocabulary of each row: the local max [N], then all-reduce(MAX)."""
    m = logits.max(dim=-1).values.clone()
    if tp_size() > 1:
        CALLS.append(("all_reduce_max", tuple(m.shape)))
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group())
    return m


def vocab_parallel_embedding(tokens: torch.Tensor, shard: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """tokens [...] -> this rank's share [..., h]: rows of E_r for the tokens it holds, 0 elsewhere.
    The caller adds the shares up (all-reduce, or reduce-scatter in sequence parallel)."""
    start, end = vocab_range(vocab_size)
    owned, local = _target_in_slice(tokens, start, end - start)
    return F.embedding(local, shard) * owned.unsqueeze(-1).to(shard.dtype)


class VocabParallelCrossEntropy(torch.autograd.Function):
    """forward: the loss from logits split by columns (three all-reduces of [N] numbers, none of
    [N, V]); backward: (softmax - one-hot) / count on this rank's columns, no communication."""

    @staticmethod
    def forward(ctx, logits, targets, start):
        z = logits - _max_over_vocab(logits).unsqueeze(-1)               # [N, V/n], every exp(z) <= 1
        owned, local = _target_in_slice(targets, start, logits.shape[-1])
        mine = z.gather(-1, local.unsqueeze(-1)).squeeze(-1)
        picked = _reduce(torch.where(owned, mine, torch.zeros_like(mine)))  # the target's logit, from its owner
        exp = z.exp()
        sum_exp = _reduce(exp.sum(dim=-1))                                # [N]
        valid = targets != IGNORE
        count = valid.sum()
        losses = torch.where(valid, sum_exp.log() - picked, torch.zeros_like(picked))
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), owned, local, valid, count)
        return losses.sum() / count

    @staticmethod
    def backward(ctx, grad):
        softmax, owned, local, valid, count = ctx.saved_tensors
        g = softmax.clone()
        rows = torch.arange(g.shape[0], device=g.device)
        g[rows, local] -= owned.to(g.dtype)                               # the one-hot, where this rank holds it
        g *= valid.unsqueeze(-1).to(g.dtype) * (grad / count)
        return g, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Mean cross-entropy over non-padding targets. logits [..., V/n] (this rank's columns), targets [...]."""
    start, _ = vocab_range(vocab_size)
    return VocabParallelCrossEntropy.apply(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), start)


# --- the check: against torch's cross-entropy on the full logits ----------------------------------

@dataclass(frozen=True)
class Case:
    """Tokens t [N] embed through E [V, h], logits z = E[t] @ W + shift [N, V], loss against targets [N]."""
    name: str
    vocab_size: int = 64
    tokens: int = 24
    hidden: int = 8
    shift: float = 0.0          # added to every logit: 1e4 overflows exp without the max
    one_slice: bool = False     # every target in the last quarter of the vocabulary: one rank's at 2 and 4
    padding: int = 0            # the last `padding` targets are IGNORE
    seed: int = 0


CASES = (Case("ordinary"), Case("logits near 1e4", shift=1e4), Case("every target in one rank's slice", one_slice=True),
         Case("padding tokens", padding=7), Case("a vocabulary of 52", vocab_size=52))


def case_data(case: Case) -> tuple:
    """(tokens [N], targets [N], E [V, h], W [h, V]) in float64, from the case's seed."""
    g = torch.Generator().manual_seed(case.seed)
    V = case.vocab_size
    tokens = torch.randint(0, V, (case.tokens,), generator=g)
    low = V - V // 4 if case.one_slice else 0
    targets = torch.randint(low, V, (case.tokens,), generator=g)
    if case.padding:
        targets[-case.padding:] = IGNORE
    E = torch.randn(V, case.hidden, generator=g, dtype=torch.float64)
    W = torch.randn(case.hidden, V, generator=g, dtype=torch.float64)
    return tokens, targets, E, W


def reference(case: Case) -> tuple:
    """(loss, dloss/dz [N, V], dloss/dE [V, h]) by torch's cross-entropy on the full logits."""
    tokens, targets, E, W = case_data(case)
    E.requires_grad_()
    z = E[tokens] @ W + case.shift
    z.retain_grad()
    loss = F.cross_entropy(z, targets, ignore_index=IGNORE)
    loss.backward()
    return loss.item(), z.grad, E.grad


def run_case(case: Case, device="cpu") -> tuple:
    """(loss, dloss/dz_r [N, V/n], dloss/dE_r [V/n, h]) in loss parallel, on this rank's slices."""
    tokens, targets, E, W = case_data(case)
    start, end = vocab_range(case.vocab_size)
    shard = E[start:end].clone().to(device).requires_grad_()
    x = ReduceFromTensorParallelRegion.apply(vocab_parallel_embedding(tokens.to(device), shard, case.vocab_size))
    z = CopyToTensorParallelRegion.apply(x) @ W[:, start:end].to(device) + case.shift
    z.retain_grad()
    loss = vocab_parallel_cross_entropy(z, targets.to(device), case.vocab_size)
    loss.backward()
    return loss.item(), z.grad, shard.grad


def show(rank: int, world_size: int) -> bool:
    """Every case against torch's: one line each, then the result line."""
    failed = []
    for case in CASES:
        loss, dz, dE = run_case(case, device=get_device())
        want_loss, want_dz, want_dE = reference(case)
        start, end = vocab_range(case.vocab_size)
        checks = {"loss": close(torch.tensor(loss), torch.tensor(want_loss)),
                  "logits' gradient": close(dz, want_dz[:, start:end]), "embedding's gradient": close(dE, want_dE[start:end])}
        if not all(good for good, _ in checks.values()):
            failed.append(case.name)
        log(f"[lab:vocab_parallel][Rank {rank}] {case.name}: loss {loss:.6f} vs {want_loss:.6f} | "
            + ", ".join(f"{k} {'matches' if good else 'DIFFERS'} (max diff {d:.1e})" for k, (good, d) in checks.items())
            + f" | holds vocabulary {start}..{end - 1} of {case.vocab_size}")
    return result_line("vocab_parallel", rank, not failed,
                       f"{len(CASES) - len(failed)} of {len(CASES)} cases match torch's cross_entropy on the full "
                       f"logits (loss, logits' and embedding's gradients)"
                       + (f" | differ: {', '.join(failed)}" if failed else "")) and not failed


def main():
    run_as_script(show)


if __name__ == "__main__":
    main()
