"""What Parts 6 to 8's collectives carry (grader.parts: `carried`, grader.verdict.carried).

In real gloo worlds of one warm executor, with Parts 5 to 8 on: the reference's collectives carry
what each part says they carry from each rank, at a step and at backward checks of 2 and 4 ranks
(the hidden checks' logit shift of 1e4, every target in one rank's slice, padding targets among
them); ranks that move the weights as they were handed (Part 6 all-reducing its rows and columns,
zeros elsewhere; Parts 7 and 8 all-gathering their shards), compute the whole loss or block alone
and call the part's collectives on zeros of the right sizes fail on what those collectives carried.
"""

import dataclasses

import pytest
import torch
import yaml

from grader.parts import sent_budget
from grader.pipeline.grade import judge_check
from grader.rerun.check import prepare_code, run_check
from grader.rerun.executor import WarmExecutor
from grader.results import Status
from grader.rubric import load_rubric
from grader.verdict import carried
from grader.verdict.judging import judging
from grader.verdict.say import Say
from tests.corpus import REFERENCE, ROOT, fast_rubric, with_part8, without_optional

PARTS = ("vocab_parallel", "transformer_block", "sequence_parallel")


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    """The executor, the rubric with Parts 5 to 8 on, its checks by name (small ones of its own
    beside the hidden backward ones, so that each part's moves are recorded), a folder."""
    tmp = tmp_path_factory.mktemp("carried")
    data = with_part8(without_optional(yaml.safe_load((ROOT / "grader" / "rubric.yaml").read_text())))
    rubric = load_rubric(fast_rubric(tmp, **{k: v for k, v in data.items() if k in ("parts", "checks")}))
    by = {c.name: c for c in rubric.checks}
    step, backward = by["default"], by["default-backward"]
    checks = {"step-2": dataclasses.replace(step, name="step-2", world_size=2, global_batch_size=4),
              "step-4": dataclasses.replace(step, name="step-4", world_size=4, global_batch_size=4),
              "backward-2": dataclasses.replace(backward, name="backward-2", world_size=2, global_batch_size=4),
              "backward-4": dataclasses.replace(backward, name="backward-4", world_size=4, global_batch_size=8),
              **{name: by[name] for name in ("layer-backward-2", "layer-backward-4")}}
    executor = WarmExecutor("best", rubric.limits)
    executor.start()
    yield executor, rubric, checks, tmp
    executor.close()


def test_a_move_found_in_any_of_its_forms_and_in_each_of_its_calls():
    lookup, sums = torch.zeros(40, dtype=torch.float64), torch.tensor([3.0, 2.5, 4.0, 1.5], dtype=torch.float64)
    lookup[8:12] = torch.tensor([1.0, -2.0, 0.5, 0.25])
    sent = [lookup, 2 * sums]   # a run of zeros before the sums scores nothing, not the most
    assert carried.holds(sent, sums) and carried.holds(sent, (sums.flip(0), sums))
    assert not carried.holds(sent, (sums.flip(0), sums + 1))
    assert carried.holds(sent, [sums, lookup[8:12]]) and not carried.holds(sent, [sums, sums.flip(0)])
    picked = torch.tensor([0.5, -1.0, 2.0, 0.75], dtype=torch.float64)
    fused = [lookup, torch.stack((3 * sums, 3 * picked), dim=-1).reshape(-1)]   # two moves, one call, value by value
    assert carried.holds(fused, [sums, picked]) and not carried.holds(fused, sums.flip(0))


@pytest.mark.parametrize("name", ["step-2", "step-4", "backward-2", "backward-4", "layer-backward-2",
                                  "layer-backward-4"])
def test_the_references_collectives_carry_what_parts_6_to_8_say(worlds, name):
    executor, rubric, checks, tmp = worlds
    check = checks[name]
    parts = [p for p in PARTS if p in rubric.parts_at(check)]
    assert parts == (["transformer_block"] if check.kind == "step" else list(PARTS)), name
    runs = run_check(executor, prepare_code(REFERENCE), check, rubric, tmp, parts)
    for part, run in runs.items():
        assert run.status == Status.PASSED, (name, part, run.detail)
        assert sent_budget(part, dataclasses.asdict(check), check.world_size), (name, part)   # recorded, so judged
        exp = judging(part, check.kind).expected(check, rubric.learning_rate, run.data, part)
        assert carried.uncarried(part, check, run, exp) == [], (name, part)


@pytest.mark.parametrize("name", ["step-2", "backward-4", "layer-backward-2"])
def test_the_references_parts_6_to_8_are_shown_to_get_their_values_from_what_their_moves_carried(worlds, name):
    """Judged as a hand-in is, with its scaled world: where a part's all-reduced moves were placed in
    its calls, only those values are changed there (grader.verdict.carried.targets), and the
    reference's values still come out wrong: every part passes, shown to need its collectives."""
    executor, rubric, checks, tmp = worlds
    check, matter = checks[name], {}
    parts = [p for p in ("megatron_mlp", *PARTS) if p in rubric.parts_at(check)]
    judged = judge_check(executor, prepare_code(REFERENCE), check, rubric, tmp, parts, matter=matter)
    assert {p: o.status for p, o in judged.items()} == {p: Status.PASSED for p in parts}, \
        {p: o.message for p, o in judged.items()}
    assert matter == {(p, check.kind): "" for p in parts}, matter


# Part 6 in other right forms: no max subtracted (the sums of exponentials and the target's logit
# as they are) and the padding targets clamped to id 0 (rank 0 picks its column 0 there, masked
# out of the loss after).
OTHER_FORMS = (
    ("        shifted = logits - all_reduce_vocab(logits.max(dim=-1).values, dist.ReduceOp.MAX).unsqueeze(-1)",
     "        shifted = logits.clone()\n        targets = targets.clamp(min=0)"),
    ("        valid = targets != ignore_index", "        valid = ctx.valid"),
    ("    def forward(ctx, logits, targets, world_size, rank, ignore_index):",
     "    def forward(ctx, logits, targets, world_size, rank, ignore_index):\n        ctx.valid = targets != ignore_index"))


# Part 6 shifted by one maximum for the whole batch (not each token's), all-reducing the target's
# softmax numerator (its exponential) in place of its logit: the same loss, the same calls.
NUMERATOR = (
    ("        shifted = logits - all_reduce_vocab(logits.max(dim=-1).values, dist.ReduceOp.MAX).unsqueeze(-1)",
     "        shifted = logits - all_reduce_vocab(logits.max(), dist.ReduceOp.MAX)"),
    ("        picked = all_reduce_vocab(torch.where(owned, picked, torch.zeros_like(picked)), dist.ReduceOp.SUM)",
     "        picked = all_reduce_vocab(torch.where(owned, picked.exp(), torch.zeros_like(picked)), dist.ReduceOp.SUM).log()"))


@pytest.mark.parametrize("forms, checks", [(OTHER_FORMS, ("backward-2", "layer-backward-2")),   # finite without the max
                                           (NUMERATOR, ("backward-2", "layer-backward-4"))],
                         ids=["unshifted", "numerator"])
def test_a_vocab_parallel_loss_in_other_right_forms_carries_what_it_must(worlds, forms, checks):
    executor, rubric, all_checks, tmp = worlds
    text = REFERENCE.read_text()
    for old, new in forms:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp / f"forms-{len(forms)}.py"
    path.write_text(text)
    for name in checks:
        outcome = judge_check(executor, prepare_code(path), all_checks[name], rubric, tmp, ["vocab_parallel"],
                              matter={})["vocab_parallel"]
        assert outcome.status == Status.PASSED, (name, outcome.message)


# Part 6 fusing its two all-reduces of the loss into one, value by value (the sums of exponentials
# and the target logits stacked on the last dimension).
FUSED = (
    "        picked = all_reduce_vocab(torch.where(owned, picked, torch.zeros_like(picked)), dist.ReduceOp.SUM)\n"
    "        exp = shifted.exp()\n"
    "        sum_exp = all_reduce_vocab(exp.sum(dim=-1), dist.ReduceOp.SUM)\n",
    "        exp = shifted.exp()\n"
    "        both = torch.stack((exp.sum(dim=-1), torch.where(owned, picked, torch.zeros_like(picked))), dim=-1)\n"
    "        sum_exp, picked = all_reduce_vocab(both, dist.ReduceOp.SUM).unbind(-1)\n")


def test_a_vocab_parallel_loss_that_fuses_its_sums_and_target_logits_in_one_call_passes(worlds):
    executor, rubric, checks, tmp = worlds
    text = REFERENCE.read_text()
    assert text.count(FUSED[0]) == 1
    path = tmp / "fused.py"
    path.write_text(text.replace(*FUSED))
    for name in ("backward-2", "backward-4", "layer-backward-4"):
        outcome = judge_check(executor, prepare_code(path), checks[name], rubric, tmp, ["vocab_parallel"],
                              matter={})["vocab_parallel"]
        assert outcome.status == Status.PASSED, (name, outcome.message)


# Part 6 all-reducing its rows of E and columns of W (zeros elsewhere, padded to the moves' volume)
# and taking the loss whole; Parts 7 and 8 all-gathering their shards and computing the whole block
# (the whole model at the step) alone, their g, f, reduce-scatters and the LayerNorms' all-reduce made
# on zeros, for show.
FORGED = '''

def _own_cols(w, r, p):
    c = w.shape[1] // p
    z = torch.zeros_like(w); z[:, r * c:(r + 1) * c] = w[:, r * c:(r + 1) * c]; return z


def _own_rows(w, r, p):
    c = w.shape[0] // p
    z = torch.zeros_like(w); z[r * c:(r + 1) * c] = w[r * c:(r + 1) * c]; return z


def vocab_parallel_loss(tokens, targets, embedding, head, world_size, rank, logit_shift=0.0, ignore_index=-100):
    start, end = vocab_slice(embedding.shape[0], world_size, rank)
    b = tokens.shape[0]
    pieces = [_own_rows(embedding, rank, world_size), _own_cols(head, rank, world_size)]
    flat = torch.cat([p.reshape(-1) for p in pieces] + [torch.zeros(2 * b * embedding.shape[1] + 2 * b,
                                                                    dtype=embedding.dtype)])
    dist.all_reduce(flat)
    E, W = flat[:embedding.numel()].view_as(embedding), flat[embedding.numel():embedding.numel() + head.numel()].view_as(head)
    loss, logits_grad, emb_grad = vocab_single_loss(tokens, targets, E, W, logit_shift, ignore_index)
    return loss, logits_grad[:, start:end], emb_grad[start:end]


def _gather_flat(vec, pad=0):
    vec = torch.cat([vec.detach().reshape(-1), torch.zeros(pad, dtype=vec.dtype)])
    out = [torch.empty_like(vec) for _ in range(dist.get_world_size())]
    dist.all_gather(out, vec.contiguous())
    return out


def _shards_of(w_qkv, w_o, w1, w2, p, r):
    d, h = w_o.shape[0], w1.shape[1]
    c, s = d // p, h // p
    qkv = torch.cat([w_qkv[:, j * d + r * c:j * d + (r + 1) * c] for j in range(3)], 1)
    return [qkv, w_o[r * c:(r + 1) * c], w1[:, r * s:(r + 1) * s], w2[r * s:(r + 1) * s]]


def _full_from(by_rank):
    c = by_rank[0][0].shape[1] // 3
    qkv = torch.cat([torch.cat([sh[0][:, j * c:(j + 1) * c] for sh in by_rank], 1) for j in range(3)], 1)
    return (qkv, torch.cat([sh[1] for sh in by_rank], 0), torch.cat([sh[2] for sh in by_rank], 1),
            torch.cat([sh[3] for sh in by_rank], 0))


def _unflat(flat, like):
    out, at = [], 0
    for t in like:
        out.append(flat[at:at + t.numel()].view_as(t)); at += t.numel()
    return out


def _block_math(X, ln1, qkv, wo, ln2, w1, w2):
    b, s, d = X.shape
    q, k, v = (ln1(X) @ qkv).reshape(b, s, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)
    future = torch.ones(s, s, dtype=torch.bool).triu(1)
    w = (q @ k.transpose(-2, -1) / head_dim ** 0.5).masked_fill(future, float("-inf")).softmax(dim=-1)
    H = X + (w @ v).transpose(1, 2).reshape(b, s, d) @ wo
    return H + nn.functional.gelu(ln2(H) @ w1) @ w2


class _P(nn.Module):
    def __init__(self, t):
        super().__init__()
        self.W = nn.Parameter(t.clone())


class ParallelTransformerBlock(nn.Module):
    def __init__(self, w_qkv, w_o, w1, w2, world_size, rank):
        super().__init__()
        self.p, self.r = world_size, rank
        qkv, wo, a, b = _shards_of(w_qkv, w_o, w1, w2, world_size, rank)
        self.ln1 = nn.LayerNorm(w_o.shape[0])
        self.qkv, self.proj = _P(qkv), _P(wo)
        self.ln2 = nn.LayerNorm(w_o.shape[0])
        self.w1, self.w2 = _P(a), _P(b)

    def weights(self, pad=0):
        mine = [self.qkv.W, self.proj.W, self.w1.W, self.w2.W]
        flats = _gather_flat(torch.cat([t.reshape(-1) for t in mine]), pad)
        return _full_from([mine if k == self.r else _unflat(f, mine) for k, f in enumerate(flats)])

    def forward(self, X):
        qkv, wo, w1, w2 = self.weights()
        dist.all_reduce(torch.zeros(4 * X.numel()))
        return _block_math(X, self.ln1, qkv, wo, self.ln2, w1, w2)


def transformer_single_step(tokens, targets, embedding, blocks, head, world_size, rank):
    p, r = world_size, rank
    v = embedding.shape[0] // p
    mine = [embedding[r * v:(r + 1) * v], head[:, r * v:(r + 1) * v]]
    for wq, wo, w1, w2 in blocks:
        mine += _shards_of(wq, wo, w1, w2, p, r)
    flat = torch.cat([t.reshape(-1) for t in mine])
    rows = torch.zeros(p, flat.numel())
    rows[r] = flat
    dist.all_reduce(rows)
    by_rank = [_unflat(f, mine) for f in rows]
    by_rank[r] = mine
    E = nn.Parameter(torch.cat([t[0] for t in by_rank], 0))
    W = nn.Parameter(torch.cat([t[1] for t in by_rank], 1))
    d = E.shape[1]
    layers = []
    for i in range(len(blocks)):
        ws = [nn.Parameter(w) for w in _full_from([t[2 + 4 * i:6 + 4 * i] for t in by_rank])]
        layers.append((nn.LayerNorm(d), ws, nn.LayerNorm(d)))
    norm = nn.LayerNorm(d)
    bsz, seq = tokens.shape
    dist.all_reduce(torch.zeros((2 + 4 * len(blocks)) * bsz * seq * d + 2 * bsz * seq))
    params = [E, W, norm.weight, norm.bias] + [q for ln1, ws, ln2 in layers
                                               for q in [*ln1.parameters(), *ws, *ln2.parameters()]]
    opt = optim.SGD(params, lr=learning_rate)
    x = E[tokens]
    for ln1, (qkv, wo, w1, w2), ln2 in layers:
        x = _block_math(x, ln1, qkv, wo, ln2, w1, w2)
    loss = nn.functional.cross_entropy(norm(x).reshape(bsz * seq, d) @ W, targets.reshape(-1))
    opt.zero_grad(); loss.backward(); opt.step()
    out = [E.detach()[r * v:(r + 1) * v]]
    for ln1, (qkv, wo, w1, w2), ln2 in layers:
        a, o, m1, m2 = _shards_of(qkv.detach(), wo.detach(), w1.detach(), w2.detach(), p, r)
        out += [ln1.weight, ln1.bias, a, o, ln2.weight, ln2.bias, m1, m2]
    out += [norm.weight, norm.bias, W.detach()[:, r * v:(r + 1) * v]]
    return loss.detach(), [t.detach().clone() for t in out]


class _AllSlices(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.n, ctx.r = x.shape[1], dist.get_rank()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, 1)

    @staticmethod
    def backward(ctx, g):
        return g[:, ctx.r * ctx.n:(ctx.r + 1) * ctx.n]


class _MySlice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n, r):
        return x[:, r * n:(r + 1) * n].clone()

    @staticmethod
    def backward(ctx, g):
        return _AllSlices.apply(g), None, None


class SequenceParallelBlock(ParallelTransformerBlock):
    def forward(self, X):
        b, n, d = X.shape
        qkv, wo, w1, w2 = self.weights(pad=2 * b * n * d)
        full = _AllSlices.apply(X)
        s = torch.zeros(4 * b * n * d)
        dist.reduce_scatter_tensor(s, torch.zeros(self.p * s.numel()))
        dist.all_reduce(torch.zeros(4 * d))
        out = _block_math(full, self.ln1, qkv, wo, self.ln2, w1, w2)
        return _MySlice.apply(out, n, self.r)
'''


@pytest.mark.parametrize("name", ["step-2", "backward-2", "layer-backward-4"])
def test_ranks_that_move_the_weights_as_handed_and_compute_alone_fail_on_what_their_collectives_carried(
        worlds, name):
    executor, rubric, checks, tmp = worlds
    check = checks[name]
    path = tmp / "forged.py"
    path.write_text(REFERENCE.read_text() + FORGED)
    judged = judge_check(executor, prepare_code(path), check, rubric, tmp, list(rubric.parts_at(check)), matter={})
    parts = [p for p in PARTS if p in judged]
    assert parts == (["transformer_block"] if check.kind == "step" else list(PARTS)), name
    for part in parts:
        outcome = judged[part]
        assert outcome.status == Status.FAILED and not outcome.comm_ok, (name, part, outcome.message)
        assert "other values than" in outcome.comm_message, (name, part, outcome.comm_message)


def test_a_scaled_world_leaves_every_parallel_parts_reference_wrong(worlds):
    """Every parallel part's reference, Parts 5 to 8 among them, in a world that scales what its
    collectives return: its values come out wrong, as values its collectives carried must."""
    from grader.parts import PARALLEL_PART_IDS
    executor, rubric, checks, tmp = worlds
    path = tmp / "reference.py"
    path.write_text(REFERENCE.read_text())
    for name in ("step-2", "backward-2"):
        check = checks[name]
        parts = [p for p in PARALLEL_PART_IDS if p in rubric.parts_at(check)]
        runs = run_check(executor, prepare_code(path), check, rubric, tmp, parts, scaled=True)
        for part, run in runs.items():
            assert run.status == Status.PASSED, (name, part, run.detail)
            way = judging(part, check.kind)
            judged = way.judge(run, way.expected(check, rubric.learning_rate, run.data, part), part, check,
                               rubric.tolerance, Say(check), ())
            assert judged.status == Status.FAILED, (name, part, judged.message)
