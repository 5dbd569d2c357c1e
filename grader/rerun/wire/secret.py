"""The data a part runs on: derived from the grader's secret key, known whole to the grader alone.

A rank's weight can only be judged by what the rank could not have produced without doing the
part's parallel work. So the batch a part trains on is not the handout's seeded one: the world's
leader derives its seeds after it has forked the ranks, serves each rank its own view when the part
starts (grader.rerun.supervise), and reports the seeds to the grader, which computes every expected
value from them in its own process (grader.verdict.compare, backward).

The seeds come from a data key: 32 random bytes the grader keeps. A batch's lives in OUT/.data-key,
readable by its owner alone, so regrades and later hand-ins into the same OUT run on the same data
and the same wrong code gives the same wrong weight (grading.json's weight_digest); a student's
`check`, a Gradescope run and any executor given no key make a fresh one in memory. Each seed is
HMAC-SHA256(key, "<check>|<part>|<what>") (`derive`): <check> is the world's size and its check's
configuration, <what> names the shared seed, a rank's block or a rank's noise. So a part's data is
the same for every hand-in of a batch at one check, and no rank can know it: nothing public decides
it without the key. The key reaches a world's leader as a frame of its own after the job
(grader.rerun.executor), read only once the ranks are forked, so no rank inherits it; where none
comes, the leader draws the seeds with os.urandom instead, fresh for the world.

The seeds, not the key, go back in the world's report, and the grader judges from them: the leader
is the grader's own code, and the rest of the grader (compare, diagnose, backward) needs no key.

What a rank of p sees, per layout (B x I inputs X, B x O targets Y; W0 the initial weight). A part
names the layout of each kind of check it runs (grader.parts: `layouts`):

    WHOLE     the real X and Y, the same on every rank (Parts 1 and 2)
    ROWS      real rows only in its own slice [r*B/p, (r+1)*B/p) of X and Y, its own noise in every
              other row: the whole batch on one rank, or an all-reduce of nothing, gives a wrong
              weight (Part 3)
    COLUMNS   the real X; real targets only in its own columns [r*O/p, (r+1)*O/p) of Y, its own
              noise elsewhere: the gradient of rank r's columns of W needs only those, so the
              column-parallel step is right, and the full weight needs every rank's updated
              columns (Part 4's step)
    WEIGHT    the real X; the layer is handed a W0 whose own columns are real and whose other
              columns are its own noise: the gathered output and the all-reduced gradient of X are
              right only if the ranks communicate (Part 4's layer alone)
    SHARDS    the real X and Y [B, d], and a seed of its own as the part's `seed`:
              init_mlp_weights(seed) draws a full W1 [d, h], W2 [h, d] whose rank-r shards (W1's
              columns, W2's rows [r*h/p, (r+1)*h/p)) are the real ones, the rest another draw. The
              block's output needs every rank's real shards (g), the full weights every rank's
              update (the gather): the step taken whole on one rank, from its own full W1 and W2,
              is wrong. (Megatron-LM seeds each tensor-parallel rank apart too.) (Part 5's step)
    BLOCK     the real X, and W1, W2 real only in its own shards: `block`, below (Part 5's block alone)
    VOCAB     the real tokens and targets [B] (int64), an embedding E [V, I] real only in its own rows
              and a head W [I, V] real only in its own columns [r*V/p, (r+1)*V/p), its own noise
              elsewhere, widened to float64 (logits near 1e4 keep their differences): `vocab`, below.
              A loss taken whole on one rank from its own E and W is wrong; the embedding needs the
              all-reduce of every rank's lookups, the loss every rank's sums (the vocabulary split)
    LAYER     the real X [B, S, d], and a transformer block's W_qkv, W_o, W1, W2 real only in its own
              shards (its heads' columns of W_q, W_k and W_v, their rows of W_o, its MLP's shards):
              `layer`, below (the transformer block alone)
    MODEL     the real tokens and targets [B, S], a tiny transformer's weights real only in its own
              shards: grader.rerun.wire.model_data (the transformer's step)

Each part has seeds of its own (at each check), so nothing one part saw helps in another. The
initial weight of a step stays `torch.manual_seed(seed); torch.randn(I, O)`, as the handout writes it.
Every value is drawn in float32 on the CPU, as utils.create_batch draws; the grader widens to float64.
"""

import hashlib
import hmac
import json
import os
import types
from dataclasses import dataclass

import torch

from grader.parts import BY_ID, kind_of
from grader.parts.common import BLOCK, LAYER, MODEL, ROWS, SHARDS, VOCAB, WEIGHT, WHOLE
from grader.rerun.wire import model_data
from grader.rerun.wire.protocol import PartSecret


def layout(part: str, kind: str) -> str:
    """How `part`'s data is split over the ranks at a check of `kind`: WHOLE, ROWS, COLUMNS (of Y),
    WEIGHT (columns of W0), SHARDS (a seed per rank for an MLP's weights), BLOCK (an MLP's shards)."""
    return BY_ID[part].layouts[kind]


def _seed() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 1   # a torch.Generator takes up to 2**63


KEY_BYTES = 32


def new_key() -> bytes:
    """A fresh data key (one per batch, or per student `check`)."""
    return os.urandom(KEY_BYTES)


def draw(part: str, world_size: int, kind: str) -> PartSecret:
    """Fresh seeds for one part of one world at a check of `kind` (call only after the ranks are forked)."""
    split = layout(part, kind) != WHOLE
    return PartSecret(seed=_seed(), blocks=[_seed() for _ in range(world_size)] if split else [],
                      noise=[_seed() for _ in range(world_size)] if split else [])


def derive(key: bytes, check: dict, part: str, world_size: int) -> PartSecret:
    """The seeds of `part` at a check (its configuration `check`, a WorldJob's, at `world_size`
    ranks) under data key `key`: the same for every world of the key, unknowable without it."""
    label = json.dumps({"check": check, "world_size": world_size}, sort_keys=True, separators=(",", ":"))

    def seed(what: str) -> int:
        digest = hmac.new(key, f"{label}|{part}|{what}".encode(), hashlib.sha256).digest()
        return int.from_bytes(digest[:8], "little") >> 1   # a torch.Generator takes up to 2**63
    split = layout(part, kind_of(check)) != WHOLE
    return PartSecret(seed=seed("seed"), blocks=[seed(f"block|{r}") for r in range(world_size)] if split else [],
                      noise=[seed(f"noise|{r}") for r in range(world_size)] if split else [])


def view(secret: PartSecret, rank: int) -> PartSecret:
    """What rank `rank` is sent: the shared seed, its own block and its own noise; None elsewhere."""
    return PartSecret(seed=secret.seed, blocks=[b if k == rank else None for k, b in enumerate(secret.blocks)],
                      noise=[n if k == rank else None for k, n in enumerate(secret.noise)])


def _randn(seed: int, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@dataclass
class PartData:
    """One rank's (or, for the grader, the real) tensors of a part: float32, on the CPU."""
    x: torch.Tensor = None           # [B, I]
    y: torch.Tensor = None           # [B, O] (a step)
    w0: torch.Tensor = None          # [I, O] (WEIGHT: the W0 the layer is handed)
    w1: torch.Tensor = None          # [d, h] (BLOCK: the W1 the block is handed)
    w2: torch.Tensor = None          # [h, d] (BLOCK: its W2)
    tokens: torch.Tensor = None      # [B] int64 (VOCAB: the token ids looked up)
    targets: torch.Tensor = None     # [B] int64 (VOCAB: the ids the loss predicts, IGNORE_INDEX for padding)
    embedding: torch.Tensor = None   # [V, I] float64 (VOCAB: the embedding table E)
    head: torch.Tensor = None        # [I, V] float64 (VOCAB: the LM head W)
    weights: tuple = ()              # (LAYER: the W_qkv [d, 3d], W_o [d, d], W1 [d, h], W2 [h, d] it is handed)


def tensors(secret: PartSecret, layout_: str, batch: int, input_dim: int, output_dim: int,
            rank=None) -> PartData:
    """The real data (`rank` None: every block, no noise) or rank `rank`'s view of it."""
    p = max(1, len(secret.blocks))
    mine = (lambda k: True) if rank is None else (lambda k: k == rank)
    if layout_ == WHOLE:
        g = torch.Generator().manual_seed(secret.seed)
        x = torch.randn(batch, input_dim, generator=g)
        return PartData(x=x, y=torch.randn(batch, output_dim, generator=g))
    if layout_ == ROWS:
        local = batch // p
        x, y = (torch.empty(batch, input_dim), torch.empty(batch, output_dim)) if rank is None else \
            _noise(secret.noise[rank], (batch, input_dim), (batch, output_dim))
        for k in range(p):
            if mine(k):
                g = torch.Generator().manual_seed(secret.blocks[k])
                x[k * local:(k + 1) * local] = torch.randn(local, input_dim, generator=g)
                y[k * local:(k + 1) * local] = torch.randn(local, output_dim, generator=g)
        return PartData(x=x, y=y)
    cols = output_dim // p
    shape = (input_dim, output_dim) if layout_ == WEIGHT else (batch, output_dim)
    split = torch.empty(*shape) if rank is None else _noise(secret.noise[rank], shape)[0]
    for k in range(p):
        if mine(k):
            split[:, k * cols:(k + 1) * cols] = _randn(secret.blocks[k], shape[0], cols)
    x = _randn(secret.seed, batch, input_dim)
    return PartData(x=x, w0=split) if layout_ == WEIGHT else PartData(x=x, y=split)


def block(secret: PartSecret, batch: int, d: int, h: int, rank=None) -> tuple:
    """Part 5's block at a backward check: (X [B, d], W1 [d, h], W2 [h, d]), the real ones (`rank`
    None) or rank `rank`'s view: the real X, and real values only in its own columns of W1 and its
    own rows of W2 ([r*h/p, (r+1)*h/p)), its own noise elsewhere, so the block's output (g) and the
    gradient of X (f) are right only if the ranks all-reduce. Scaled by 1/sqrt(fan_in), as
    init_mlp_weights scales."""
    p = max(1, len(secret.blocks))
    share = h // p
    w1, w2 = (torch.empty(d, h), torch.empty(h, d)) if rank is None else _noise(secret.noise[rank], (d, h), (h, d))
    for k in range(p):
        if rank is None or k == rank:
            g = torch.Generator().manual_seed(secret.blocks[k])
            w1[:, k * share:(k + 1) * share] = torch.randn(d, share, generator=g)
            w2[k * share:(k + 1) * share] = torch.randn(share, d, generator=g)
    return _randn(secret.seed, batch, d), w1 / d ** 0.5, w2 / h ** 0.5


def layer(secret: PartSecret, check: dict, rank=None) -> PartData:
    """The transformer block run alone: X [B, S, d] (d = num_heads * head_dim) and its weights
    (W_qkv [d, 3d] = [W_q | W_k | W_v], W_o [d, d], W1 [d, h], W2 [h, d]), the real ones (`rank`
    None) or rank `rank`'s view: real values only in its own heads' columns [r*d/p, (r+1)*d/p) of
    W_q, W_k and W_v, the same rows of W_o, and its own shards of W1 and W2, its own noise
    elsewhere. Scaled by 1/sqrt(fan_in), as init_block_weights scales."""
    p = max(1, len(secret.blocks))
    b, s, h = check["global_batch_size"], check["seq_len"], check["hidden_dim"]
    d = check["num_heads"] * check["head_dim"]
    cols, share = d // p, h // p
    shapes = ((d, 3 * d), (d, d), (d, h), (h, d))
    qkv, wo, w1, w2 = [torch.empty(*shape) for shape in shapes] if rank is None else _noise(secret.noise[rank], *shapes)
    for k in range(p):
        if rank is None or k == rank:
            g = torch.Generator().manual_seed(secret.blocks[k])
            for j in range(3):   # W_q, W_k, W_v: rank k's heads' columns of each
                qkv[:, j * d + k * cols:j * d + (k + 1) * cols] = torch.randn(d, cols, generator=g)
            wo[k * cols:(k + 1) * cols] = torch.randn(cols, d, generator=g)
            w1[:, k * share:(k + 1) * share] = torch.randn(d, share, generator=g)
            w2[k * share:(k + 1) * share] = torch.randn(share, d, generator=g)
    weights = tuple(w / shape[0] ** 0.5 for w, shape in zip((qkv, wo, w1, w2), shapes))
    return PartData(x=_randn(secret.seed, b, s, d), weights=weights)


def mlp_weights(seed: int, d: int, h: int) -> tuple:
    """(W1 [d, h], W2 [h, d]) as the handout's init_mlp_weights(seed) draws them after
    torch.manual_seed(seed): scaled by 1/sqrt(fan_in)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(d, h, generator=g) / d ** 0.5, torch.randn(h, d, generator=g) / h ** 0.5


def mlp_step(secret: PartSecret, batch: int, d: int, h: int) -> tuple:
    """Part 5's step data, the real one: (X [B, d], Y [B, d], W1 [d, h], W2 [h, d]), rank r's shards
    of W1 and W2 from the weights its own seed draws (SHARDS)."""
    p = max(1, len(secret.blocks))
    share = h // p
    w1, w2 = torch.empty(d, h), torch.empty(h, d)
    for k in range(p):
        mine1, mine2 = mlp_weights(secret.blocks[k], d, h)
        w1[:, k * share:(k + 1) * share] = mine1[:, k * share:(k + 1) * share]
        w2[k * share:(k + 1) * share] = mine2[k * share:(k + 1) * share]
    whole = tensors(secret, WHOLE, batch, d, d)
    return whole.x, whole.y, w1, w2


IGNORE_INDEX = -100   # a padding target: torch's cross_entropy's default ignore_index


def vocab(secret: PartSecret, check: dict, rank=None) -> PartData:
    """The vocabulary-split data of a check (VOCAB): the real one (`rank` None) or rank `rank`'s view.
    B tokens and targets in [0, V) (with vocab_one_slice, every target in the last rank's V/p ids;
    the last vocab_padding targets IGNORE_INDEX), E [V, I] ~ N(0, 1) and W [I, V] ~ N(0, 1/I), each
    rank's rows of E and columns of W drawn from its own block's seed."""
    b, d, v = check["global_batch_size"], check["input_dim"], check["vocab_size"]
    p = max(1, len(secret.blocks))
    share = v // p
    g = torch.Generator().manual_seed(secret.seed)
    tokens = torch.randint(0, v, (b,), generator=g)
    targets = torch.randint(v - share if check.get("vocab_one_slice") else 0, v, (b,), generator=g)
    padding = min(int(check.get("vocab_padding") or 0), b - 1)   # one real target at least: a mean
    if padding:
        targets[b - padding:] = IGNORE_INDEX
    e, w = (torch.empty(v, d), torch.empty(d, v)) if rank is None else _noise(secret.noise[rank], (v, d), (d, v))
    for k in range(p):
        if rank is None or k == rank:
            g = torch.Generator().manual_seed(secret.blocks[k])
            e[k * share:(k + 1) * share] = torch.randn(share, d, generator=g)
            w[:, k * share:(k + 1) * share] = torch.randn(d, share, generator=g)
    return PartData(tokens=tokens, targets=targets, embedding=e.double(), head=w.double() / d ** 0.5)


def _noise(seed: int, *shapes) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for shape in shapes]


# ---- inside the rank ----------------------------------------------------------------------------

def serve_batches(served: dict) -> None:
    """Replace utils.create_batch (before the hand-in imports it) with one that returns the part's
    data (served["data"], a Served) when asked for its sizes, and the seeded batch otherwise. The
    seeded batch is drawn either way, so the global RNG stands where the handout's create_batch
    leaves it. utils.expected_weight keeps drawing the seeded batch."""
    import utils  # the trusted copy, next to the hand-in's assignment4.py
    original = utils.create_batch

    def create_batch(batch_size, input_dim, output_dim, seed=42, device=None):
        inputs, targets = original(batch_size, input_dim, output_dim, seed=seed, device=device)
        view = served.get("data")
        data, sizes = (view.batch, view.sizes) if view is not None else (None, ())
        if data is None or data.y is None or (batch_size, input_dim, output_dim) != sizes:
            return inputs, targets
        return data.x.clone().to(inputs.device), data.y.clone().to(targets.device)
    create_batch.__doc__ = original.__doc__
    utils.create_batch = create_batch
    # The closed form stays the handout's (on the seeded batch): it is the script's check, and
    # matches none of the data a part is served.
    closed_form = utils.expected_weight
    utils.expected_weight = types.FunctionType(closed_form.__code__, dict(vars(utils), create_batch=original),
                                               closed_form.__name__, closed_form.__defaults__)
    utils.expected_weight.__doc__ = closed_form.__doc__   # and no __wrapped__ leading back to the data


@dataclass
class Served:
    """What rank `rank` is handed of the part a protocol.Run starts (its data is the rank's view)."""
    batch: PartData = None    # what utils.create_batch returns when asked for `sizes` (None: the seeded batch)
    sizes: tuple = ()         # (batch_size, input_dim, output_dim) the part asks create_batch for
    seed: int = 0             # the part's `seed` argument (and the module's `seed`)
    data: PartData = None     # what a layer or block run alone is handed (WEIGHT, BLOCK; MODEL: a ModelData)


def rank_view(run, check: dict, rank: int) -> Served:
    """Rank `rank`'s view of the part a protocol.Run starts, by the layout of its kind of check (see
    the module docstring)."""
    b, d, o = check["global_batch_size"], check["input_dim"], check["output_dim"]
    layout_ = layout(run.part, kind_of(check))
    if layout_ == VOCAB:
        return Served(seed=check["seed"], data=vocab(run.data, check, rank))
    if layout_ == BLOCK:
        x, w1, w2 = block(run.data, b, d, check["hidden_dim"], rank)
        return Served(seed=check["seed"], data=PartData(x=x, w1=w1, w2=w2))
    if layout_ == LAYER:
        return Served(seed=check["seed"], data=layer(run.data, check, rank))
    if layout_ == MODEL:
        return Served(seed=check["seed"], data=model_data.model(run.data, check, rank))
    if layout_ == SHARDS:
        return Served(batch=tensors(run.data, WHOLE, b, d, d), sizes=(b, d, d), seed=run.data.blocks[rank])
    data = tensors(run.data, layout_, b, d, o, rank)
    return Served(batch=data if data.y is not None else None, sizes=(b, d, o), seed=check["seed"], data=data)
