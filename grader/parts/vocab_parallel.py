"""Part 6 (optional), the vocabulary split over the ranks: an embedding table split by vocabulary rows
and a cross-entropy on logits split by vocabulary columns, neither ever gathered.

A course turns it on by giving it points in its rubric. It runs at the backward checks only: its
function vocab_parallel_loss(tokens, targets, embedding, head, world_size, rank, logit_shift) takes
the loss and its backward and returns (loss, the gradient of the rank's logits [B, V/p], the
gradient of its embedding rows [V/p, d]) (`loss_and_gradients`). Every rank is handed the real
tokens and targets, and an embedding E [V, input_dim] and a head W [input_dim, V] real only in its
own vocabulary ids (VOCAB, grader.rerun.wire.secret.vocab): the right loss needs every rank's lookups
(g) and every rank's sums, so a loss taken whole on one rank is wrong. Its checks read sizes no
other part reads (`own_sizes`): the vocabulary, and what the hidden checks vary: a shift of every
logit (near 1e4, exp overflows without the max), every target in one rank's slice, padding targets.

Its usual mistakes, each named by grader.verdict.vocab: the max not all-reduced, the target's mask
off by one slice, the embedding's rows of other ranks' tokens not zeroed, the embedding's output
not all-reduced, padding counted in the mean, the one-hot subtracted on every rank, no f before
the head, and no max at all (the loss overflows at logits near 1e4).
"""

from grader.parts import BACKWARD, B, Moves, Part
from grader.parts.common import VOCAB, dims

FUNCTION = "vocab_parallel_loss"
VOCAB_SIZE = 64   # the rubric's default vocabulary: a check mapping without one
RETURNS = "(loss, logits_grad, embedding_grad)"


def _returned(value) -> tuple:
    """(loss, logits_grad, embedding_grad) from what the function returned: three tensors, the
    loss floating-point; a gradient may be None (the verdict says it did not come back)."""
    import torch
    if not isinstance(value, (tuple, list)) or len(value) != 3 or \
            not all(v is None or isinstance(v, torch.Tensor) for v in value) or value[0] is None:
        raise TypeError(f"{FUNCTION} returned {type(value).__name__}, not the three tensors {RETURNS}")
    if not all(v is None or v.is_floating_point() for v in value):
        raise TypeError(f"{FUNCTION} returned tensors that are not floating-point")
    return value


def loss_and_gradients(module, call, check: dict, data) -> dict:
    """The hand-in's function on every rank, on `data` (a grader.rerun.wire.secret.PartData: tokens,
    targets, and E, W real in the rank's own vocabulary ids), with the check's logit shift:

        loss            the mean cross-entropy, [1], the same on every rank
        logits_grad     the gradient of the rank's logits, [B, V / p]
        embedding_grad  the gradient of the rank's rows of E, [V / p, input_dim]"""
    import torch.distributed as dist
    function = getattr(module, FUNCTION, None)
    if not callable(function):
        raise TypeError(f"assignment4.py has no function {FUNCTION}()")
    loss, logits_grad, embedding_grad = _returned(function(
        data.tokens, data.targets, data.embedding, data.head, dist.get_world_size(), dist.get_rank(),
        logit_shift=float(check.get("vocab_logit_shift") or 0.0)))
    tensors = {"loss": loss.detach().reshape(-1).clone()}
    for name, grad in (("logits_grad", logits_grad), ("embedding_grad", embedding_grad)):
        if grad is not None:
            tensors[name] = grad.detach().clone()
    return tensors


def room(check: dict, kind: str) -> int:
    """The most values one of its tensors holds: the full logits [B, V] or the full table [V, d]."""
    d_in, _, _, b = dims(check)
    v = int(check.get("vocab_size") or VOCAB_SIZE)
    return max(b * v, v * d_in)


def should(check: dict, kind: str, hidden: bool) -> str:
    """What it should return, said in a refusal (no size at a hidden check)."""
    return ("the loss and the gradients of the rank's logits and embedding rows"
            + ("" if hidden else f", at most {room(check, kind)} values each"))


IGNORE_INDEX = -100   # a padding target: the function's ignore_index (grader.rerun.wire.secret's)


def loss_forms(z: list, targets, rank: int) -> tuple:
    """What rank `rank` all-reduces for the loss, from every rank's logits z (each [N, V / p], float64)
    and the targets [N]: (its sums of exponentials, its target logits), each a tuple of right forms.
    A sum of exponentials shifted by each token's maximum over every rank's columns (the max
    all-reduced), or not shifted (or by one number for every token: a factor); the target's logit
    less that maximum, or less one number for every token, or as it is (with the logit shift); or
    the target's exponential, its softmax's numerator, shifted either way (log S less its log is
    the loss alike). What a padding target's row holds is the
    hand-in's to choose (left in, zeroed, the logit of whatever id the target was clamped to): with
    padding, each form is said on the longest run of rows of real targets alone."""
    import torch
    zr, k = z[rank], z[rank].shape[1]
    m = torch.cat(z, dim=1).max(dim=-1).values
    owned = (targets >= rank * k) & (targets < (rank + 1) * k)
    at = zr.gather(-1, torch.where(owned, targets - rank * k, 0).unsqueeze(-1)).squeeze(-1)
    rows = _real_rows(targets != IGNORE_INDEX)
    sums = (torch.exp(zr - m.unsqueeze(-1)).sum(-1), torch.exp(zr - m.max()).sum(-1))
    picked = (torch.where(owned, at - m, 0.0), torch.where(owned, at, 0.0), torch.where(owned, at - m.max(), 0.0),
              torch.where(owned, torch.exp(at - m), 0.0), torch.where(owned, torch.exp(at - m.max()), 0.0))
    return tuple(t[rows] for t in sums), tuple(t[rows] for t in picked)


def _real_rows(valid) -> slice:
    """The longest run of rows whose targets are real (not padding): all of them without padding."""
    best, start = (0, 0), None
    for i, real in enumerate([*valid.tolist(), False]):
        if real and start is None:
            start = i
        elif not real and start is not None:
            best, start = max(best, (i - start, start)), None
    return slice(best[1], best[1] + best[0])


def lookups(tokens, embedding, p: int) -> list:
    """Every rank's masked lookup, g's input: E_r[t - r V / p] where rank r holds token t, else 0."""
    import torch
    k = embedding.shape[0] // p
    out = []
    for r in range(p):
        owned = (tokens >= r * k) & (tokens < (r + 1) * k)
        out.append(embedding[r * k:(r + 1) * k][torch.where(owned, tokens - r * k, 0)] * owned.unsqueeze(-1))
    return out


def carried(exp, check, rank: int) -> list:
    """What rank `rank`'s all-reduces carry (exp: grader.verdict.vocab's Data): its masked lookup (g),
    its columns' share dz_r W_r^T of the gradient of the embedding's output (f), and loss_forms'."""
    import torch
    p = check.world_size
    k = exp.embedding.shape[0] // p
    cols = [exp.head[:, r * k:(r + 1) * k] for r in range(p)]
    mine = lookups(exp.tokens, exp.embedding, p)
    x = sum(mine)
    z = [x @ w + exp.shift for w in cols]
    valid = exp.targets != IGNORE_INDEX
    dz = torch.softmax(torch.cat(z, dim=1), dim=-1)[:, rank * k:(rank + 1) * k]
    owned = valid & (exp.targets >= rank * k) & (exp.targets < (rank + 1) * k)
    dz[owned, exp.targets[owned] - rank * k] -= 1.0
    dz = dz * valid.unsqueeze(-1) / valid.sum().clamp(min=1)
    return [mine[rank], dz @ cols[rank].T, *loss_forms(z, exp.targets, rank)]


PART = Part(
    "vocab_parallel", "Part 6 (optional): a vocab-parallel embedding and loss", "VocabParallel", FUNCTION,
    ("vocab_slice", "VocabReduce", "VocabParallelEmbedding", "all_reduce_vocab", "VocabParallelCrossEntropy",
     "vocab_parallel_cross_entropy", FUNCTION),
    layouts={BACKWARD: VOCAB}, runs={BACKWARD: loss_and_gradients},
    judging={BACKWARD: "grader.verdict.vocab:JUDGING"},
    room=room, should=should, kinds=(BACKWARD,), optional=True,
    splits=(("vocab_size", "world_size", "the vocabulary over the ranks"),), parallel=True,
    layer="VocabParallelEmbedding with vocab_parallel_cross_entropy",
    own_sizes=("vocab_size", "vocab_logit_shift", "vocab_one_slice", "vocab_padding"),
    moves=(Moves(BACKWARD, "all_reduce", "the embedding's partial lookups in g's forward", (B, "input_dim")),
           Moves(BACKWARD, "all_reduce", "the gradient of the embedding's output in f's backward", (B, "input_dim")),
           Moves(BACKWARD, "all_reduce", "each token's sum of exponentials", (B,)),
           Moves(BACKWARD, "all_reduce", "each token's target logit, from the rank that holds it", (B,))),
    carried={BACKWARD: carried}, aliases=("vocab",),
    lab={"lab/vocab_parallel.py": "the embedding split by vocabulary rows (a masked lookup, then g) and the "
                                  "cross-entropy on logits split by vocabulary columns (max, sum of "
                                  "exponentials and the target's logit all-reduced; the backward on each "
                                  "rank's own columns)",
         "lab/mappings.py": "f and g as autograd Functions"})
