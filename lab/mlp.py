"""The lecture's deep MLP on one process: the loss and gradients the parallel versions must reproduce.

    python lab/mlp.py          # the single-process loss and each layer's gradient norm

The model, with B examples of d features and L layers (W_i of shape [d, d]):

    x_0 = X                          [B, d]
    x_{i+1} = gelu(x_i @ W_i)        [B, d],   i = 0 .. L-1
    loss = mean(x_L ** 2)            over all B*d numbers (the lecture's "average squared magnitude")

Weights and data come from one seeded generator on the CPU, in a fixed order (W_0 .. W_{L-1},
then X), and are then moved to the device: every rank draws the same full model and batch, and
takes its own piece of them (rows of X, columns or whole layers of W). That is what makes the
parallel gradients comparable with these. (The lecture drew each rank's parameters on its own,
so its tensor-parallel shards were not slices of any one model.)
"""

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

_KIT = str(Path(__file__).resolve().parents[1])
if _KIT not in sys.path:        # run as a script only lab/ is on the path; `lab` lives one above
    sys.path.insert(0, _KIT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lab.common import ATOL_FRACTION, RTOL, close, log, result_line  # noqa: E402
from utils import get_device  # noqa: E402

BATCH_SIZE = 128        # B, the lecture's
DIM = 1024              # d, the lecture's; tensor parallelism needs it divisible by the world size
NUM_LAYERS = 4          # L, the lecture's; pipeline parallelism rounds it up to whole layers per stage
NUM_MICRO_BATCHES = 4   # pipeline parallelism: the batch goes through in this many pieces
SEED = 0                # one seed for the whole model and batch


@dataclass(frozen=True)
class MLPConfig:
    batch_size: int = BATCH_SIZE
    dim: int = DIM
    num_layers: int = NUM_LAYERS
    num_micro_batches: int = NUM_MICRO_BATCHES
    seed: int = SEED


@dataclass
class Result:
    """What one rank computed: the loss of the whole batch and the gradients of the weights it holds."""
    loss: float
    grads: list                                   # this rank's gradients, one per weight it holds
    local_loss: float | None = None               # data parallel: the loss of this rank's rows only
    notes: list = field(default_factory=list)     # anything worth a line in the log


def init_weights(cfg: MLPConfig, device=None) -> list:
    """W_0 .. W_{L-1}, each [d, d], scaled by 1/sqrt(d) so activations keep their size through the layers."""
    device = get_device() if device is None else device
    g = torch.Generator().manual_seed(cfg.seed)
    return [(torch.randn(cfg.dim, cfg.dim, generator=g) / math.sqrt(cfg.dim)).to(device)
            for _ in range(cfg.num_layers)]


def make_data(cfg: MLPConfig, device=None) -> torch.Tensor:
    """X [B, d], drawn after the weights from the same seed."""
    device = get_device() if device is None else device
    g = torch.Generator().manual_seed(cfg.seed)
    for _ in range(cfg.num_layers):       # skip past the weights' numbers
        torch.randn(cfg.dim, cfg.dim, generator=g)
    return torch.randn(cfg.batch_size, cfg.dim, generator=g).to(device)


def forward(x: torch.Tensor, weights: list) -> torch.Tensor:
    """x [b, d] through the layers: gelu(x @ W) for each W in order."""
    for w in weights:
        x = F.gelu(x @ w)
    return x


def loss_of(out: torch.Tensor) -> torch.Tensor:
    """mean(out ** 2): the lecture's loss, averaged over every number of `out`."""
    return out.square().mean()


def reference(cfg: MLPConfig, device=None) -> Result:
    """Loss and dL/dW_i of the whole batch on one process, in float64, returned as float32."""
    weights = [w.double().requires_grad_() for w in init_weights(cfg, device)]
    loss = loss_of(forward(make_data(cfg, device).double(), weights))
    loss.backward()
    return Result(loss.item(), [w.grad.float() for w in weights])


def report(part: str, rank: int, got: Result, expected_loss: float, expected_grads: list) -> bool:
    """Log whether `got` matches the single-process loss and the gradients this rank should hold."""
    loss_ok, loss_diff = close(torch.tensor(got.loss), torch.tensor(expected_loss))
    checks = [close(a, b) for a, b in zip(got.grads, expected_grads)]
    grads_ok = len(got.grads) == len(expected_grads) and all(ok for ok, _ in checks)
    worst = max((d for _, d in checks), default=0.0)
    for note in got.notes:
        log(f"[lab:{part}][Rank {rank}] {note}")
    result_line(part, rank, loss_ok and grads_ok,
                f"loss matches: {loss_ok} ({got.loss:.6f} vs {expected_loss:.6f}) | "
                f"gradients match: {grads_ok} ({len(got.grads)} tensor(s), max diff {worst:.3e}, "
                f"rtol {RTOL:g}, atol {ATOL_FRACTION:g} x max)")
    return loss_ok and grads_ok


def main():
    cfg = MLPConfig()
    ref = reference(cfg)
    log(f"[lab:mlp] B={cfg.batch_size} d={cfg.dim} L={cfg.num_layers} seed={cfg.seed} on {get_device()}: "
        f"loss {ref.loss:.6f}")
    for i, g in enumerate(ref.grads):
        log(f"[lab:mlp] |dL/dW_{i}| = {g.norm().item():.6e}")


if __name__ == "__main__":
    main()
