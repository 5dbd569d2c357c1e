"""Judge a backward check: Part 4's layer, forward and backward, against the single-device layer.

The re-run (grader.parts.tensor_parallel.forward_and_backward) runs the hand-in's
`FullColumnParallelLinear(W0, p, rank)` on an X that requires a gradient and starts backward from
a fixed gradient G of the output. A column-parallel layer must give, on rank r of p, with
W = [W_0 | ... | W_{p-1}] and G = [G_0 | ... | G_{p-1}]:

    output       X @ W                       [B, output_dim], gathered on every rank
    input_grad   G @ W^T = sum_r G_r @ W_r^T [B, input_dim]: f (BroadcastParallel) all-reduces the
                                             ranks' shares in backward
    weight_grad  X^T @ G_r                   [input_dim, output_dim / p]: the gather's backward hands
                                             rank r its own columns of G (or its transpose: a layer
                                             that holds its weight as nn.Linear does)

computed here in float64 from the part's data (grader.rerun.wire.secret): X, and the real W0, of which
rank r's layer was handed only its own columns (the others were its own noise). So the output is
right only if the ranks gathered it, and the gradient of X only if they summed it: no collective
the rank reports passes it (grader.verdict.comm can only fail it where one is missing). A layer without f (`X = X`) gives each rank only
its own share G_r W_r^T of the input's gradient; a gather whose backward keeps another rank's
columns gives the wrong weight gradient.
"""

from dataclasses import dataclass

import torch

from grader.parts.common import WEIGHT, as_weight, close, output_gradient
from grader.rerun.wire import secret
from grader.results import CheckOutcome, Status
from grader.verdict.compare import collectives, unfinished
from grader.verdict.judging import Judging
from grader.verdict.say import Say

F_HINT = ("f (BroadcastParallel: identity forward, all-reduce backward) must sum the ranks' shares: "
          "does forward pass X through BroadcastParallel, and does its backward all-reduce?")


@dataclass
class ExpectedLayer:
    x: torch.Tensor    # [B, input_dim]
    w: torch.Tensor    # W0 [input_dim, output_dim]
    g: torch.Tensor    # G [B, output_dim]

    def shares(self, p: int) -> list:
        """Column blocks of W and G: [(W_r, G_r)] for r in 0..p-1."""
        cols = self.w.shape[1] // p
        return [(self.w[:, r * cols:(r + 1) * cols], self.g[:, r * cols:(r + 1) * cols]) for r in range(p)]


def expected_layer(check, data) -> ExpectedLayer:
    """The real W0 and X of `data` (the protocol.PartSecret the check ran on) and G, in float64."""
    real = secret.tensors(data, WEIGHT, check.global_batch_size, check.input_dim, check.output_dim)
    w, x = real.w0.double(), real.x.double()
    return ExpectedLayer(x=x, w=w, g=output_gradient(check.seed, check.global_batch_size, check.output_dim).double())


def _output_problem(r, rank: int, e: ExpectedLayer, p: int, tol, say: Say) -> str:
    out = r.weight
    if out.shape != (e.x.shape[0], e.w.shape[1]):
        if p > 1 and out.shape == (e.x.shape[0], e.w.shape[1] // p):
            return "the layer's output is one rank's columns only: gather the outputs in forward (GatherParallel)"
        return "the layer's output has the wrong shape" + ("" if say.hidden else f" {list(out.shape)}")
    if not close(out, e.x @ e.w, tol):
        return "the layer's output differs from X @ W (the single-device layer's)"
    return ""


def _weight_problem(r, rank: int, e: ExpectedLayer, p: int, tol, say: Say) -> str:
    weight_grad, shares = r.extra.get("weight_grad"), e.shares(p)
    if weight_grad is None:
        return ("no parameter of the layer that holds this rank's columns of W (as the layer was handed them) got a "
                "gradient: keep them as an nn.Parameter (the skeleton's self.W) and compute the output from it")
    if as_weight(weight_grad, e.x.T @ shares[rank][1], tol):
        return ""
    other = next((k for k, (_, g_k) in enumerate(shares) if as_weight(weight_grad, e.x.T @ g_k, tol)), None)
    if other is not None:
        whose = f"rank {other}'s" if not say.hidden else "the first rank's" if other == 0 else "another rank's"
        return (f"the weight gradient on {say.rank(rank, 'a rank')} is that of {whose} columns: the gather's "
                f"backward (GatherParallel) must hand each rank its own columns of the output's gradient")
    return ("the weight gradient differs from X^T G_r, X^T times this rank's columns of the output's gradient: "
            "check GatherParallel's backward")


def _input_problem(r, rank: int, e: ExpectedLayer, p: int, tol, say: Say) -> str:
    input_grad = r.extra.get("input_grad")
    if input_grad is None:
        return "X got no gradient: the layer cut X off the autograd graph (a detach() or a copy without grad?)"
    if close(input_grad, e.g @ e.w.T, tol):
        return ""
    w_r, g_r = e.shares(p)[rank]
    if p > 1 and close(input_grad, g_r @ w_r.T, tol):
        return f"each rank's gradient of X is only its own columns' share, G_r W_r^T: {F_HINT}"
    if p > 1 and close(input_grad, p * (e.g @ e.w.T), tol):
        return (f"the gradient of X is {say.eq(p, 'world_size')} times the single-device layer's: it was "
                f"summed over the ranks where each rank already held all of it")
    return f"the gradient of X differs from the single-device layer's, G W^T: {F_HINT}"


def judge(run, exp, part: str, check, tol, say: Say = None, passed=()) -> CheckOutcome:
    """The outcome of Part 4's layer at a backward check (`exp` is expected_layer's)."""
    say = say or Say(check)
    if run.status != Status.PASSED:
        return unfinished(run, check, say)
    outcome = CheckOutcome(check=check.name, hidden=check.hidden, world_size=check.world_size,
                           status=Status.PASSED, message="", collectives=collectives(run.ranks))
    p, ranks = check.world_size, sorted(run.ranks.items())
    found = {}   # rank -> its first problem; the diagnosis is the first of output, weight, input problems
    diagnosis = ""
    for find in (_output_problem, _weight_problem, _input_problem):
        for rank, r in ranks:
            if rank in found:
                continue
            text = find(r, rank, exp, p, tol, say)
            if text:
                found[rank] = text
                diagnosis = diagnosis or text
    failing = sorted(found)
    outcome.failing_ranks = failing
    if failing:
        outcome.status = Status.FAILED
        outcome.diagnosis = diagnosis
        outcome.message = f"the layer is wrong on {say.ranks(failing, len(run.ranks))}: {outcome.diagnosis}"
    else:
        outcome.message = "the layer's output and gradients match the single-device layer's on every rank"
    return outcome


# A layer run alone (grader.parts: a part's `judging` at the backward kind)
BACKWARD_JUDGING = Judging(expected=lambda check, lr, data, part: expected_layer(check, data), judge=judge)
