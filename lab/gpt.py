"""A tiny GPT on one process: the losses and gradients the tensor-parallel transformer must reproduce.

    python lab/gpt.py          # 5 SGD steps on one batch: the loss of each

The model, in Megatron's layout (sequence first): s tokens, b sequences, h = hidden, H heads of
d = h/H, f = the MLP's width, V = the vocabulary, L blocks.

    x = wte[tokens] + wpe[:s]                          [s, b, h]      tokens [s, b]
    for each block:
        a = attention(LayerNorm_1(x)) @ W_o + b_o      [s, b, h]      q, k, v = LN(x) @ W_q + b_q, ... [s, b, h]
        x = x + dropout(a)                                            H causal heads of d columns each
        m = gelu(LayerNorm_2(x) @ W_fc1 + b_fc1) @ W_fc2 + b_fc2      [s, b, f] in between
        x = x + dropout(m)
    logits = LayerNorm_f(x) @ W_head                   [s, b, V]
    loss = cross-entropy(logits, targets), mean over the targets that are not padding (IGNORE)

Every weight comes from one seeded generator on the CPU, in the order of `param_shapes`, and the
batch from the seed after it: every rank draws the same full model and batch and keeps its slice
of them. Dropout, where it is on, draws its mask for the whole [s, b, h] from a seed of its own
(`dropout`), so a rank that holds rows of the sequence can take exactly those rows of it.
"""

import math
import sys
from dataclasses import dataclass
from pathlib import Path

_KIT = str(Path(__file__).resolve().parents[1])
if _KIT not in sys.path:        # run as a script only lab/ is on the path; `lab` lives one above
    sys.path.insert(0, _KIT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lab.common import log  # noqa: E402
from utils import divide, get_device  # noqa: E402

IGNORE = -100     # the target of a padding position: no loss, no gradient (cross_entropy's ignore_index)
PAD = 0           # the token a padding position holds


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 64    # V: split by rows (embedding) and columns (LM head) in loss parallel
    seq_len: int = 16       # s: split into rows in sequence parallel
    hidden: int = 32        # h
    n_heads: int = 4        # H: split over the ranks in tensor parallel
    ffn: int = 64           # f: the MLP's width, split over the ranks
    n_layers: int = 2       # L
    batch_size: int = 2     # b
    n_padding: int = 3      # sequence i ends in (i+1)*n_padding padding positions
    dropout: float = 0.0    # off: the runs compare losses; a seeded mask makes it comparable too
    lr: float = 0.5         # SGD's step size
    iters: int = 5          # training steps
    seed: int = 0           # one seed for the whole model and batch

    def __post_init__(self):
        divide(self.hidden, self.n_heads, "hidden", "n_heads")      # every head d = h/H columns


def param_shapes(cfg: GPTConfig) -> dict:
    """{name: shape} of every parameter, in the order they are drawn."""
    h, f, V = cfg.hidden, cfg.ffn, cfg.vocab_size
    shapes = {"wte": (V, h), "wpe": (cfg.seq_len, h)}
    for i in range(cfg.n_layers):
        block = {"ln1_w": (h,), "ln1_b": (h,), "w_q": (h, h), "b_q": (h,), "w_k": (h, h), "b_k": (h,),
                 "w_v": (h, h), "b_v": (h,), "w_o": (h, h), "b_o": (h,), "ln2_w": (h,), "ln2_b": (h,),
                 "w_fc1": (h, f), "b_fc1": (f,), "w_fc2": (f, h), "b_fc2": (h,)}
        shapes.update({f"h{i}.{k}": v for k, v in block.items()})
    shapes.update({"lnf_w": (h,), "lnf_b": (h,), "w_head": (h, V)})
    return shapes


def init_params(cfg: GPTConfig, device=None) -> dict:
    """Every parameter, full size, from the one seed: matrices ~ N(0, 1/fan_in), embeddings ~ N(0, 1),
    LayerNorm weights 1 + N(0, 0.1^2), biases N(0, 0.1^2): nothing uniform, so a transposed or
    misplaced slice shows."""
    device = get_device() if device is None else device
    g = torch.Generator().manual_seed(cfg.seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        x = torch.randn(shape, generator=g)
        base = name.split(".")[-1]
        if base in ("wte", "wpe"):
            pass
        elif base.startswith("ln") and base.endswith("_w"):
            x = 1 + 0.1 * x
        elif len(shape) == 1:
            x = 0.1 * x
        else:
            x = x / math.sqrt(shape[0])
        params[name] = x.to(device)
    return params


def make_batch(cfg: GPTConfig, device=None) -> tuple:
    """(inputs, targets), each [s, b]: random tokens and the next token of each, from the seed + 1.
    Sequence i ends in (i+1)*n_padding padding positions: input PAD, target IGNORE."""
    device = get_device() if device is None else device
    g = torch.Generator().manual_seed(cfg.seed + 1)
    tokens = torch.randint(1, cfg.vocab_size, (cfg.seq_len + 1, cfg.batch_size), generator=g)
    inputs, targets = tokens[:-1].clone(), tokens[1:].clone()
    for i in range(cfg.batch_size):
        pad = min((i + 1) * cfg.n_padding, cfg.seq_len - 1)
        if pad:
            inputs[-pad:, i], targets[-pad:, i] = PAD, IGNORE
    return inputs.to(device), targets.to(device)


def dropout(x: torch.Tensor, p: float, key: int, start: int = 0, total: int | None = None) -> torch.Tensor:
    """x * mask / (1 - p), the mask drawn for all `total` rows of the sequence from seed `key` and cut
    to rows start .. start + len(x) - 1: a rank holding rows of the sequence drops what one process would."""
    if p == 0.0:
        return x
    total = x.shape[0] if total is None else total
    g = torch.Generator().manual_seed(key)
    keep = torch.rand((total, *x.shape[1:]), generator=g)[start:start + x.shape[0]] >= p
    return x * keep.to(x.device, x.dtype) / (1 - p)


def dropout_key(cfg: GPTConfig, step: int, layer: int, site: int) -> int:
    """The seed of one dropout mask: one per step, block and site (0: attention, 1: MLP)."""
    return cfg.seed * 1_000_003 + step * 1009 + layer * 2 + site


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_heads: int) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal mask) v, per head. q, k, v [s, b, n_heads*d] -> [s, b, n_heads*d]."""
    s, b, width = q.shape
    d = width // n_heads
    heads = lambda t: t.reshape(s, b, n_heads, d).permute(1, 2, 0, 3)       # noqa: E731  [b, H, s, d]
    scores = heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(d)           # [b, H, s, s]
    future = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return (probs @ heads(v)).permute(2, 0, 1, 3).reshape(s, b, width)


def layer_norm(x: torch.Tensor, p: dict, name: str) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], p[f"{name}_w"], p[f"{name}_b"])


def forward(p: dict, inputs: torch.Tensor, cfg: GPTConfig, step: int = 0) -> torch.Tensor:
    """The logits [s, b, V] of inputs [s, b]."""
    x = p["wte"][inputs] + p["wpe"][:inputs.shape[0], None, :]
    for i in range(cfg.n_layers):
        w = lambda n: p[f"h{i}.{n}"]                                        # noqa: E731
        h = layer_norm(x, p, f"h{i}.ln1")
        ctx = causal_attention(h @ w("w_q") + w("b_q"), h @ w("w_k") + w("b_k"), h @ w("w_v") + w("b_v"), cfg.n_heads)
        x = x + dropout(ctx @ w("w_o") + w("b_o"), cfg.dropout, dropout_key(cfg, step, i, 0))
        h = F.gelu(layer_norm(x, p, f"h{i}.ln2") @ w("w_fc1") + w("b_fc1"))
        x = x + dropout(h @ w("w_fc2") + w("b_fc2"), cfg.dropout, dropout_key(cfg, step, i, 1))
    return layer_norm(x, p, "lnf") @ p["w_head"]


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy, mean over the positions whose target is not IGNORE."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


def sgd(params: dict, lr: float) -> None:
    """p <- p - lr * dL/dp for every parameter; the gradients are then cleared."""
    with torch.no_grad():
        for p in params.values():
            p -= lr * p.grad
            p.grad = None


def train(cfg: GPTConfig, device=None, dtype=torch.float32) -> list:
    """The loss of each of cfg.iters SGD steps on the one batch."""
    params = {k: v.to(dtype).requires_grad_() for k, v in init_params(cfg, device).items()}
    inputs, targets = make_batch(cfg, device)
    losses = []
    for step in range(cfg.iters):
        loss = loss_of(forward(params, inputs, cfg, step), targets)
        loss.backward()
        sgd(params, cfg.lr)
        losses.append(loss.item())
    return losses


def main():
    cfg = GPTConfig()
    inputs, targets = make_batch(cfg)
    log(f"[lab:gpt] V={cfg.vocab_size} s={cfg.seq_len} b={cfg.batch_size} h={cfg.hidden} H={cfg.n_heads} "
        f"f={cfg.ffn} L={cfg.n_layers} seed={cfg.seed} on {get_device()}: {int((targets == IGNORE).sum())} "
        f"padding positions of {targets.numel()}")
    for i, loss in enumerate(train(cfg), 1):
        log(f"[lab:gpt] iter {i}: loss {loss:.6f}")


if __name__ == "__main__":
    main()
