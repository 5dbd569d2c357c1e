"""A parallel part's values must come from its collectives (grader.verdict.comm: `independent`).

The first time a parallel part passes a check of several ranks of a kind, it runs there once more
in a world whose ranks multiply what each of its moving collectives returns (grader.rerun.rank
.collectives: SCALES). Here, in real gloo worlds of one warm executor at a 2-rank step check and its
backward twin: the reference's parallel parts come out wrong in the scaled world (and so pass),
Parts 1 and 2, which call no collective, come out right there; ranks that swap their data through
the process group's store and call the collectives on zeros of the right sizes for show come out
right in it, and fail, at that check and at the next of its kind without another scaled world.
"""

import dataclasses

import pytest

from grader.parts import BY_ID
from grader.pipeline.grade import judge_check
from grader.rerun.check import prepare_code, run_check
from grader.rerun.executor import WarmExecutor
from grader.results import Status
from grader.rubric import load_rubric
from grader.verdict.judging import judging
from grader.verdict.say import Say
from tests.corpus import REFERENCE, fast_rubric
from tests.hostile import file_swap

PARTS = ["baseline", "grad_accumulation", "data_parallel", "tensor_parallel"]


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scaled")
    rubric = load_rubric(fast_rubric(tmp))
    step = dataclasses.replace(next(c for c in rubric.checks if c.name == "default"), world_size=2)
    backward = dataclasses.replace(next(c for c in rubric.checks if c.name == "default-backward"), world_size=2)
    executor = WarmExecutor("best", rubric.limits)
    executor.start()
    yield executor, rubric, step, backward, tmp
    executor.close()


def _code(tmp, name: str, text: str) -> dict:
    path = tmp / f"{name}.py"
    path.write_text(text)
    return prepare_code(path)


def test_a_scaled_world_leaves_the_references_parallel_parts_wrong_and_the_others_right(worlds):
    executor, rubric, step, _, tmp = worlds
    runs = run_check(executor, _code(tmp, "reference", REFERENCE.read_text()), step, rubric, tmp, PARTS, scaled=True)
    say = Say(step)
    for part, run in runs.items():
        assert run.status == Status.PASSED, (part, run.detail)   # it ran to the end on every rank...
        way = judging(part, step.kind)
        judged = way.judge(run, way.expected(step, rubric.learning_rate, run.data, part), part, step,
                           rubric.tolerance, say, ())
        # ...with values that came through its collectives wherever it calls any
        assert (judged.status == Status.PASSED) == (not BY_ID[part].moves), (part, judged.message)


def test_the_reference_passes_and_its_collectives_are_shown_to_make_its_values(worlds):
    executor, rubric, step, backward, tmp = worlds
    code, matter = _code(tmp, "reference", REFERENCE.read_text()), {}
    for check in (step, backward):
        judged = judge_check(executor, code, check, rubric, tmp, PARTS, matter=matter)
        assert {p: o.status for p, o in judged.items()} == {p: Status.PASSED for p in judged}, \
            {p: o.message for p, o in judged.items()}
    assert matter == {("data_parallel", "step"): "", ("tensor_parallel", "step"): "", ("tensor_parallel", "backward"): ""}


# The store swap, beside every collective the reference calls with what it carries (so that what
# they carry is right: grader.verdict.carried), their results dropped: only a scaled world tells.
SHOWN = '''

_honest = {name: globals()[name] for name in ("data_parallel_single_step", "full_column_parallel_single_step")}
_HonestLayer = FullColumnParallelLinear
''' + file_swap(via="store").split(REFERENCE.read_text(), 1)[1] + '''

def _shown(name):
    swapped = globals()[name]

    def run(seed=42, device=None):
        _honest[name](seed=seed, device=device)   # the algorithm's collectives, carrying what it carries
        return swapped(seed=seed, device=device)
    return run


data_parallel_single_step = _shown("data_parallel_single_step")
full_column_parallel_single_step = _shown("full_column_parallel_single_step")


class FullColumnParallelLinear(_HonestLayer):
    """The reference's layer run beside, on a copy of X: its gather and its f carry what they must;
    the output and every gradient that counts come from the others' columns read from the store."""

    def __init__(self, weight, world_size, rank):
        super().__init__(weight, world_size, rank)
        self.shards = [e["w"] for e in _swap("layer", {"w": self.W})]

    def forward(self, X):
        shown = super().forward(X.detach().requires_grad_(True))
        shards = list(self.shards)
        shards[self.rank] = self.W.detach()
        return X @ torch.cat(shards, dim=1) + (shown - shown.detach())
'''


def test_collectives_for_show_beside_a_swap_fail_where_shown_and_at_the_next_check_of_the_kind(worlds):
    executor, rubric, step, backward, tmp = worlds
    code, matter = _code(tmp, "shown", REFERENCE.read_text() + SHOWN), {}
    first = judge_check(executor, code, step, rubric, tmp, PARTS, matter=matter)
    worlds_before = executor.worlds
    again = judge_check(executor, code, dataclasses.replace(step, name="again", seed=7), rubric, tmp, PARTS,
                        matter=matter)
    assert executor.worlds == worlds_before + 1, "a kind already shown ran another scaled world"
    for judged, where in ((first, ""), (again, " at check 'default'")):
        assert judged["baseline"].status == Status.PASSED and judged["grad_accumulation"].status == Status.PASSED
        for part, collective in (("data_parallel", "all-reduces"), ("tensor_parallel", "all-gathers")):
            outcome = judged[part]
            assert outcome.status == Status.FAILED and not outcome.comm_ok, outcome.message
            assert f"values came out right{where} even when what its {collective}" in outcome.comm_message, \
                outcome.comm_message
            assert outcome.comm_message in outcome.message
    layer = judge_check(executor, code, backward, rubric, tmp, PARTS, matter=matter)["tensor_parallel"]
    assert layer.status == Status.FAILED and ("what its all-gathers returned for the layer's output columns in "
                                              "GatherParallel was changed") in layer.comm_message, layer.message
    assert matter == {("data_parallel", "step"): "check 'default'", ("tensor_parallel", "step"): "check 'default'",
                      ("tensor_parallel", "backward"): "check 'default-backward'"}


def test_collectives_that_carry_nothing_of_the_algorithm_fail_at_every_check(worlds):
    """The store swap with collectives of zeros as large as the parts' moves, and ranks that gather
    the batch or the targets with the collective the part calls and take the single-device step:
    right values, the volumes moved, their values come from the collectives, and what the
    collectives carried is not what the algorithm moves."""
    executor, rubric, step, backward, tmp = worlds
    for name, text in (("zeros", file_swap(dummies="sized", via="store")), ("batch", REFERENCE.read_text() + BATCH_MOVED)):
        code = _code(tmp, name, text)
        for check in (step, backward):
            judged = judge_check(executor, code, check, rubric, tmp, PARTS, matter={})
            for part in (p for p in ("data_parallel", "tensor_parallel") if p in judged):
                outcome = judged[part]
                assert outcome.status == Status.FAILED and not outcome.comm_ok, (name, check.name, outcome.message)
                assert "other values than" in outcome.comm_message, (name, check.name, outcome.comm_message)


# Part 3 all-reducing, in one call, the gradient of its own rows (what the part's move carries) and
# its slice of the batch (zeros elsewhere); the reduced gradient dropped, every rank steps alone on
# the gathered batch. A scaled world that multiplied the whole call would leave it wrong.
BESIDE = '''

def data_parallel_single_step(seed=42, device=None):
    rank, size = dist.get_rank(), dist.get_world_size()
    rows = slice(rank * (global_batch_size // size), (rank + 1) * (global_batch_size // size))
    x, y = create_batch(global_batch_size, input_dim, output_dim, seed=seed, device="cpu")
    torch.manual_seed(seed)
    w0 = torch.randn(input_dim, output_dim)
    own = CustomLinearLayer(w0.clone())
    nn.MSELoss()(own(x[rows]), y[rows]).backward()
    both = torch.zeros(global_batch_size, input_dim + output_dim)
    both[rows, :input_dim], both[rows, input_dim:] = x[rows], y[rows]
    fused = torch.cat([own.W.grad.reshape(-1), both.reshape(-1)])
    dist.all_reduce(fused)
    both = fused[w0.numel():].reshape(both.shape)
    x, y = both[:, :input_dim], both[:, input_dim:]
    return w0 - learning_rate * 2.0 / (x.shape[0] * y.shape[1]) * x.T @ (x @ w0 - y)
'''

# Right ways to all-reduce the gradient that put other values in its calls: the loss beside it in
# one call (for a log line), and the gradient all-reduced twice, the second copy used.
FUSED_RIGHT = (
    ("        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n",
     "        fused = torch.cat([param.grad.reshape(-1), local_loss.detach().reshape(1)])\n"
     "        dist.all_reduce(fused, op=dist.ReduceOp.SUM)\n"
     "        param.grad.copy_(fused[:-1].view_as(param.grad))\n"),
    ("        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n",
     "        first, second = param.grad.clone(), param.grad.clone()\n"
     "        dist.all_reduce(first, op=dist.ReduceOp.SUM)\n"
     "        dist.all_reduce(second, op=dist.ReduceOp.SUM)\n"
     "        param.grad.copy_(second)\n"))


def test_data_carried_beside_the_move_in_one_call_fails_and_other_values_beside_it_do_not(worlds):
    """The scaled world multiplies only where the part's moves lay in the calls of the run it passed
    (grader.verdict.carried.targets): ranks whose values came from the batch carried beside the
    gradient come out right there, and fail; right code whose calls carry the loss beside the
    gradient, or the gradient twice, comes out wrong there, and passes."""
    executor, rubric, step, _, tmp = worlds
    beside = judge_check(executor, _code(tmp, "beside", REFERENCE.read_text() + BESIDE), step, rubric, tmp,
                         ["data_parallel"], matter={})["data_parallel"]
    assert beside.status == Status.FAILED and "values came out right even when" in beside.comm_message, beside.message
    text = REFERENCE.read_text()
    for i, (old, new) in enumerate(FUSED_RIGHT):
        assert text.count(old) == 1, old
        matter = {}
        right = judge_check(executor, _code(tmp, f"right{i}", text.replace(old, new)), step, rubric, tmp,
                            ["data_parallel"], matter=matter)["data_parallel"]
        assert right.status == Status.PASSED and matter == {("data_parallel", "step"): ""}, (i, right.message)


# Part 3 all-reducing the batch (each rank its own rows, zeros elsewhere) and Part 4 all-gathering
# the targets' columns, then the layer's weights: every rank holds the whole and steps alone.
BATCH_MOVED = '''

def data_parallel_single_step(seed=42, device=None):
    rank, size = dist.get_rank(), dist.get_world_size()
    rows = slice(rank * (global_batch_size // size), (rank + 1) * (global_batch_size // size))
    x, y = create_batch(global_batch_size, input_dim, output_dim, seed=seed, device="cpu")
    both = torch.zeros(global_batch_size, input_dim + output_dim)
    both[rows, :input_dim], both[rows, input_dim:] = x[rows], y[rows]
    dist.all_reduce(both)
    torch.manual_seed(seed)
    w0 = torch.randn(input_dim, output_dim)
    x, y = both[:, :input_dim], both[:, input_dim:]
    return w0 - learning_rate * 2.0 / (x.shape[0] * y.shape[1]) * x.T @ (x @ w0 - y)


def full_column_parallel_single_step(seed=42, device=None):
    rank, size = dist.get_rank(), dist.get_world_size()
    cols = output_dim // size
    x, y = create_batch(global_batch_size, input_dim, output_dim, seed=seed, device="cpu")
    mine = torch.cat([y[:, rank * cols:(rank + 1) * cols], torch.zeros(input_dim, cols)]).contiguous()
    parts = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(parts, mine)
    y = torch.cat([p[:global_batch_size] for p in parts], dim=1)
    torch.manual_seed(seed)
    w0 = torch.randn(input_dim, output_dim)
    return w0 - learning_rate * 2.0 / (x.shape[0] * y.shape[1]) * x.T @ (x @ w0 - y)


class FullColumnParallelLinear(nn.Module):
    def __init__(self, weight, world_size, rank):
        super().__init__()
        self.rank, self.size, self.cols = rank, world_size, weight.shape[1] // world_size
        self.W = nn.Parameter(weight[:, rank * self.cols:(rank + 1) * self.cols].clone())

    def forward(self, X):
        rows = X.shape[0]
        mine = torch.cat([self.W.detach(), torch.zeros(rows, self.cols)]).contiguous()
        parts = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(parts, mine)
        shards = [p[:self.W.shape[0]] for p in parts]
        shards[self.rank] = self.W
        dist.all_reduce(torch.zeros(rows, self.W.shape[0]))
        return X @ torch.cat(shards, dim=1)
'''


# The reference with its Part 3 all-reducing through the process group's own method and its Part 4
# gathering the updated weight through the functional collectives (DTensor's): the same exchange.
BY_OTHER_WAYS = (
    ("        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)",
     "        dist.group.WORLD.allreduce([param.grad]).wait()"),
    ("    dist.all_gather(weight_shards, local_updated_weight)",
     "    import torch.distributed._functional_collectives as funcol\n"
     "    whole = funcol.all_gather_tensor(local_updated_weight.contiguous(), 0, dist.group.WORLD)\n"
     "    for k, shard in enumerate(whole.chunk(len(weight_shards))):\n"
     "        weight_shards[k].copy_(shard)"),
)


def test_collectives_reached_through_a_groups_methods_or_the_functional_ops_are_recorded_and_scaled(worlds):
    """What the spy records of a group method's or a functional op's call is what it records of the
    function's (the collective's name, its values, its reduce op), and the scaled world changes
    what they return: the parts pass, their collectives shown to make their values."""
    executor, rubric, step, _, tmp = worlds
    text = REFERENCE.read_text()
    for old, new in BY_OTHER_WAYS:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    recorded = {}
    for name, source in (("reference", REFERENCE.read_text()), ("other-ways", text)):
        runs = run_check(executor, _code(tmp, name, source), step, rubric, tmp, ["data_parallel", "tensor_parallel"])
        recorded[name] = {part: [[(c["op"], c["numel"], c["reduce_op"]) for c in rank.comm] for rank in run.ranks.values()]
                          for part, run in runs.items()}
    reduces = {name: [[c[:2] for c in rank] for rank in found["data_parallel"]] for name, found in recorded.items()}
    assert reduces["other-ways"] == reduces["reference"]   # the group's method was given no op: a sum, as the function's default
    assert {c[2] for rank in recorded["other-ways"]["data_parallel"] for c in rank} == {None}
    gathers = {name: [[c for c in rank if c[0].startswith("all_gather")] for rank in found["tensor_parallel"]]
               for name, found in recorded.items()}
    assert [[c[1:] for c in rank] for rank in gathers["other-ways"]] == [[c[1:] for c in rank] for rank in gathers["reference"]]
    # the layer's own gather in its forward, then the updated weight's through the functional op
    assert all([c[0] for c in rank] == ["all_gather", "all_gather_into_tensor"] for rank in gathers["other-ways"]), gathers
    matter = {}
    judged = judge_check(executor, _code(tmp, "other-ways", text), step, rubric, tmp, PARTS, matter=matter)
    assert {p: o.status for p, o in judged.items()} == {p: Status.PASSED for p in judged}, \
        {p: o.message for p, o in judged.items()}
    assert matter == {("data_parallel", "step"): "", ("tensor_parallel", "step"): ""}


# The reference with its Part 3 wrapped in DistributedDataParallel, whose reducer all-reduces the
# gradient from C++, and its Part 4 gathering the updated weight through a functional op's overload:
# collectives no Python wrapper sees, which the dispatcher hands the spy (grader.rerun.rank.collectives).
FROM_CPP = (
    ("    optimizer = optim.SGD(model.parameters(), lr=learning_rate)\n    loss_fn = nn.MSELoss(reduction=\"mean\")\n\n"
     "    # Every rank creates the full batch",
     "    model = nn.parallel.DistributedDataParallel(model)\n"
     "    optimizer = optim.SGD(model.parameters(), lr=learning_rate)\n    loss_fn = nn.MSELoss(reduction=\"mean\")\n\n"
     "    # Every rank creates the full batch"),
    ("        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n", "        pass   # DDP has averaged it\n"),
    ("        param.grad.div_(world_size)\n\n    # Every rank now has the same gradient, so every rank takes the same step.\n"
     "    optimizer.step()\n    return model.W.detach()",
     "    optimizer.step()\n    return model.module.W.detach()"),
    ("    dist.all_gather(weight_shards, local_updated_weight)",
     "    whole = torch.ops._c10d_functional.all_gather_into_tensor.default(\n"
     "        local_updated_weight.contiguous(), world_size, dist.group.WORLD.group_name)\n"
     "    whole = torch.ops._c10d_functional.wait_tensor.default(whole)\n"
     "    for k, shard in enumerate(whole.chunk(len(weight_shards))):\n"
     "        weight_shards[k].copy_(shard)"),
)


def test_collectives_called_from_cpp_are_recorded_and_scaled(worlds):
    """DDP's reducer all-reduces the gradient bucket (its constructor broadcasts the parameters and
    all-gathers their shapes) and a functional op's .default overload gathers the weight: each is
    recorded as the function's call would be, and scaled, and the parts pass, their collectives
    shown to make their values."""
    executor, rubric, step, _, tmp = worlds
    text = REFERENCE.read_text()
    for old, new in FROM_CPP:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    recorded = {}
    for name, source in (("reference", REFERENCE.read_text()), ("from-cpp", text)):
        runs = run_check(executor, _code(tmp, name, source), step, rubric, tmp, ["data_parallel", "tensor_parallel"])
        assert {p: r.status for p, r in runs.items()} == {p: Status.PASSED for p in runs}, {p: r.detail for p, r in runs.items()}
        recorded[name] = {part: [[(c["op"], c["numel"], c["reduce_op"]) for c in rank.comm] for rank in run.ranks.values()]
                          for part, run in runs.items()}
    reduces = {name: [[c for c in rank if c[0] == "all_reduce"] for rank in found["data_parallel"]]
               for name, found in recorded.items()}
    assert reduces["from-cpp"] == reduces["reference"]   # one bucket: the weight's gradient, summed
    assert all({c[0] for c in rank} == {"all_gather", "broadcast", "all_reduce"} for rank in recorded["from-cpp"]["data_parallel"])
    gathers = [[c[0] for c in rank if c[0].startswith("all_gather")] for rank in recorded["from-cpp"]["tensor_parallel"]]
    assert all(rank == ["all_gather", "all_gather_into_tensor"] for rank in gathers), gathers
    matter = {}
    judged = judge_check(executor, _code(tmp, "from-cpp", text), step, rubric, tmp, PARTS, matter=matter)
    assert {p: o.status for p, o in judged.items()} == {p: Status.PASSED for p in judged}, \
        {p: o.message for p, o in judged.items()}
    assert matter == {("data_parallel", "step"): "", ("tensor_parallel", "step"): ""}


def test_a_weight_gathered_as_objects_is_an_all_gather_recorded_and_scaled(worlds):
    """all_gather_object pickles what it gathers: its shards are the tensors the objects hold,
    recorded as all_gather's (p + 1 times a shard), and scaled where they land."""
    executor, rubric, step, _, tmp = worlds
    old = "    dist.all_gather(weight_shards, local_updated_weight)"
    new = ("    gathered = [None] * world_size\n"
           "    dist.all_gather_object(gathered, {'shard': local_updated_weight})\n"
           "    for k, got in enumerate(gathered):\n"
           "        weight_shards[k].copy_(got['shard'])")
    text = REFERENCE.read_text()
    assert text.count(old) == 1
    code = _code(tmp, "objects", text.replace(old, new))
    runs = run_check(executor, code, step, rubric, tmp, ["tensor_parallel"])
    reference = run_check(executor, _code(tmp, "reference", text), step, rubric, tmp, ["tensor_parallel"])
    gathers = {name: [[(c["op"], c["numel"]) for c in rank.comm] for rank in found["tensor_parallel"].ranks.values()]
               for name, found in (("objects", runs), ("reference", reference))}
    assert [[n for _, n in rank] for rank in gathers["objects"]] == [[n for _, n in rank] for rank in gathers["reference"]]
    assert all([op for op, _ in rank] == ["all_gather", "all_gather_object"] for rank in gathers["objects"]), gathers
    matter = {}
    judged = judge_check(executor, code, step, rubric, tmp, PARTS, matter=matter)
    assert judged["tensor_parallel"].status == Status.PASSED, judged["tensor_parallel"].message
    assert matter[("tensor_parallel", "step")] == ""


def test_a_gather_into_a_stacked_tensor_runs_on_gloo_as_on_nccl(worlds):
    """all_gather_into_tensor into [world_size, *shard] (torch's documented form, which NCCL takes and
    gloo refuses: "invalid tensor size") gathers here too, recorded and scaled as the flat form."""
    executor, rubric, step, _, tmp = worlds
    old = "    dist.all_gather(weight_shards, local_updated_weight)"
    new = ("    stacked = torch.empty(world_size, *local_updated_weight.shape)\n"
           "    dist.all_gather_into_tensor(stacked, local_updated_weight.contiguous())\n"
           "    weight_shards = list(stacked.unbind(0))")
    text = REFERENCE.read_text()
    assert text.count(old) == 1
    matter = {}
    judged = judge_check(executor, _code(tmp, "stacked", text.replace(old, new)), step, rubric, tmp, PARTS, matter=matter)
    assert judged["tensor_parallel"].status == Status.PASSED, judged["tensor_parallel"].message
    assert matter[("tensor_parallel", "step")] == ""


# Code that checks what an all-reduce of ones returns (world_size, but in a scaled world) before its
# parallel steps: the store swap with collectives for show would crash only where it is tested.
PROBED = '''

def _probed(step):
    def run(*args, **kwargs):
        got = [torch.empty(1) for _ in range(dist.get_world_size())]
        dist.all_gather(got, torch.ones(1))
        assert all(g.item() == 1 for g in got), "the collectives' results are not what was handed"
        return step(*args, **kwargs)
    return run


data_parallel_single_step = _probed(data_parallel_single_step)
full_column_parallel_single_step = _probed(full_column_parallel_single_step)
'''


def test_a_probe_of_known_values_beside_the_moves_is_left_as_it_was_in_a_scaled_world(worlds):
    """The store swap with collectives for show, and a probe of known values (an all-gather of
    ones) that fails where they come back changed. A scaled world changes only the calls that
    carried a part's moves (an all-reduce's values where they lay in it, an all-gather's whole):
    the probe carries none, comes back as it was, and the values come out right there."""
    executor, rubric, step, _, tmp = worlds
    code, matter = _code(tmp, "probed", REFERENCE.read_text() + SHOWN + PROBED), {}
    for check, where in ((step, ""), (dataclasses.replace(step, name="again", seed=7), " at check 'default'")):
        before = executor.worlds
        judged = judge_check(executor, code, check, rubric, tmp, PARTS, matter=matter)
        assert executor.worlds == before + (2 if not where else 1), "the check, then (at the first) its scaled world"
        assert judged["baseline"].status == Status.PASSED and judged["grad_accumulation"].status == Status.PASSED
        for part in ("data_parallel", "tensor_parallel"):
            outcome = judged[part]
            assert outcome.status == Status.FAILED and not outcome.comm_ok, outcome.message
            assert f"values came out right{where}" in outcome.comm_message, outcome.comm_message
        assert matter == {("data_parallel", "step"): "check 'default'", ("tensor_parallel", "step"): "check 'default'"}


# The reference, checking that its own columns come back from the gather as it handed them: true
# in every world but the scaled one, which it then crashes.
SELF_CHECKED = '''

_gather_forward = GatherParallel.forward


def _checked_forward(ctx, x):
    out = _gather_forward(ctx, x)
    cols, rank = x.shape[-1], dist.get_rank()
    assert torch.equal(out[..., rank * cols:(rank + 1) * cols], x), "my own columns came back changed"
    return out


GatherParallel.forward = staticmethod(_checked_forward)
'''


def test_a_scaled_world_the_code_crashes_in_shows_nothing_and_the_next_check_of_its_kind_scales_again(worlds):
    """Part 4 crashes where its output's gather comes back changed: that world shows nothing, the
    part fails there (its weight's gather, changed in a world of its own, did make its values), and
    the next check of the kind scales again."""
    executor, rubric, step, _, tmp = worlds
    code, matter = _code(tmp, "self_checked", REFERENCE.read_text() + SELF_CHECKED), {}
    for check in (step, dataclasses.replace(step, name="again", seed=7)):
        before = executor.worlds
        judged = judge_check(executor, code, check, rubric, tmp, ["tensor_parallel"], matter=matter)
        assert executor.worlds == before + 3, "the check, then a scaled world for each of its two moves"
        crashed = judged["tensor_parallel"].comm_message
        assert judged["tensor_parallel"].status == Status.FAILED, judged["tensor_parallel"].message
        assert "did not run to the end in a world that multiplied what its collectives returned" in crashed \
            and "my own columns came back changed" in crashed, crashed
        assert matter == {}, matter


# Part 4's layer with f for show: its output gathered and used, f all-reducing each rank's share of
# the gradient of X and dropping it, that gradient computed alone from the whole W, which went
# through an all-reduce of the padded columns (a call that carries no move).
F_DROPPED = '''
_forged_state = {}


class _ShowF(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, share):
        if dist.get_world_size() == 1:
            return share
        show = share.contiguous().clone()
        dist.all_reduce(show, op=dist.ReduceOp.SUM)          # f, for show: dropped
        return _forged_state["G"] @ _forged_state["W"].T     # the whole gradient of X, alone


class FullColumnParallelLinear(nn.Module):
    def __init__(self, weight, world_size, rank):
        super().__init__()
        self.in_dim, self.out_dim = weight.shape
        self.world_size, self.rank = world_size, rank
        self.local_out_dim = divide(self.out_dim, world_size, "out_dim", "world_size")
        start = rank * self.local_out_dim
        self.W = nn.Parameter(weight[:, start:start + self.local_out_dim].clone().contiguous())

    def forward(self, X):
        p, r, k = self.world_size, self.rank, self.local_out_dim
        if p == 1:
            return X @ self.W
        X = _ShowF.apply(X)
        local_out = torch.einsum("bi,ij->bj", X, self.W).contiguous()
        out = GatherParallel.apply(local_out)                 # the output's all-gather: used
        whole = torch.zeros(self.in_dim, self.out_dim)
        whole[:, r * k:(r + 1) * k] = self.W.detach()
        dist.all_reduce(whole, op=dist.ReduceOp.SUM)          # the whole W: not a move, never scaled
        _forged_state["W"] = whole
        if out.requires_grad:
            out.register_hook(lambda G: _forged_state.__setitem__("G", G.detach()))
        return out
'''


def test_one_move_whose_result_is_used_does_not_cover_for_another_dropped(worlds):
    """Each move is changed alone, in a world of its own: at the backward check the output's gather
    makes the output, but f's all-reduce reaches nothing, and the part fails naming it; the
    reference's every move reaches its values."""
    executor, rubric, _, backward, tmp = worlds
    forged = judge_check(executor, _code(tmp, "f_dropped", REFERENCE.read_text() + F_DROPPED), backward, rubric, tmp,
                         ["tensor_parallel"], matter={})["tensor_parallel"]
    assert forged.status == Status.FAILED and ("what its all-reduces returned for the gradient of X in "
                                               "BroadcastParallel's backward was changed") in forged.comm_message, \
        forged.message
    matter = {}
    honest = judge_check(executor, _code(tmp, "reference", REFERENCE.read_text()), backward, rubric, tmp,
                         ["tensor_parallel"], matter=matter)["tensor_parallel"]
    assert honest.status == Status.PASSED and matter == {("tensor_parallel", "backward"): ""}, honest.message


# Part 3's gradient all-reduced micro-batch by micro-batch (two), the results summed: right.
MICRO_BATCHES = '''
def data_parallel_single_step(seed=42, device=None):
    device = get_device() if device is None else device
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local = divide(global_batch_size, world_size, "global_batch_size", "world_size")
    torch.manual_seed(seed)
    model = CustomLinearLayer(torch.randn(input_dim, output_dim)).to(device)
    optimizer = optim.SGD(model.parameters(), lr=learning_rate)
    X, Y = create_batch(global_batch_size, input_dim, output_dim, seed=seed, device=device)
    Xr, Yr = X[rank * local:(rank + 1) * local], Y[rank * local:(rank + 1) * local]
    steps = 2 if local % 2 == 0 else 1
    mb = local // steps
    total = torch.zeros_like(model.W)
    for i in range(steps):
        optimizer.zero_grad()
        (nn.MSELoss()(model(Xr[i * mb:(i + 1) * mb]), Yr[i * mb:(i + 1) * mb]) / steps).backward()
        grad = model.W.grad.clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        total += grad
    model.W.grad = total / world_size
    optimizer.step()
    return model.W.detach()
'''

# Data posing as a summand of Part 3's move: the batch's head (padded slices) in a call of the
# gradient's size, the gradient less that head in another (dropped), the rest of the batch in a call
# of another size, and the single-device step taken on the batch so gathered.
SUMMAND_DATA = '''
def data_parallel_single_step(seed=42, device=None):
    device = get_device() if device is None else device
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local = global_batch_size // world_size
    torch.manual_seed(seed)
    initial_weight = torch.randn(input_dim, output_dim)
    X, Y = create_batch(global_batch_size, input_dim, output_dim, seed=seed, device=device)
    rows = slice(rank * local, (rank + 1) * local)
    own = CustomLinearLayer(initial_weight.clone())
    nn.MSELoss()(own(X[rows]), Y[rows]).backward()
    g = own.W.grad.detach().reshape(-1)
    n = g.numel()
    buf = torch.zeros(global_batch_size, input_dim + output_dim)
    buf[rows, :input_dim] = X[rows]
    buf[rows, input_dim:] = Y[rows]
    flat = buf.reshape(-1)
    head = torch.zeros(n)
    k = min(n, flat.numel())
    head[:k] = flat[:k]
    tail = flat[k:].clone()
    if tail.numel() == n or tail.numel() == 0:
        tail = torch.cat([tail, torch.zeros(1)])              # never of the gradient's size
    rest = (g - head).contiguous()
    dist.all_reduce(rest, op=dist.ReduceOp.SUM)              # "micro-batch 1": dropped
    dist.all_reduce(head, op=dist.ReduceOp.SUM)              # "micro-batch 2": the batch's first n values
    dist.all_reduce(tail, op=dist.ReduceOp.SUM)              # the rest of the batch (not of size n: never sought)
    outs = [head, tail]
    whole = torch.cat(outs)[:flat.numel()].view(buf.shape)
    Xa, Ya = whole[:, :input_dim], whole[:, input_dim:]
    model = CustomLinearLayer(initial_weight)
    optimizer = optim.SGD(model.parameters(), lr=learning_rate)
    loss = nn.MSELoss()(model(Xa), Ya)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return model.W.detach()
'''


def test_a_move_found_as_the_sum_of_calls_is_changed_one_call_at_a_time(worlds):
    """Where the gradient is the sum of several calls, each is changed alone, in a world of its own:
    micro-batches reduced one by one are each needed; data posing as one of them is left as it was
    where the other is changed, and its values come out right there."""
    executor, rubric, step, _, tmp = worlds
    many = MICRO_BATCHES.replace("steps = 2 if local % 2 == 0", "steps = 8 if local % 8 == 0")
    assert many != MICRO_BATCHES and step.global_batch_size // step.world_size % 8 == 0, step
    with_count = MICRO_BATCHES.replace(   # each micro-batch's gradient and a count in one call
        "        grad = model.W.grad.clone()\n        dist.all_reduce(grad, op=dist.ReduceOp.SUM)\n        total += grad\n",
        "        both = torch.cat([model.W.grad.reshape(-1), torch.ones(1)])\n"
        "        dist.all_reduce(both, op=dist.ReduceOp.SUM)\n        total += both[:-1].view_as(total)\n")
    assert with_count != MICRO_BATCHES
    for name, text, passes, worlds in (("micro_batches", MICRO_BATCHES, True, 2), ("eight", many, True, 8),
                                       ("with_count", with_count, True, 2), ("summand_data", SUMMAND_DATA, False, None)):
        before, matter = executor.worlds, {}
        outcome = judge_check(executor, _code(tmp, name, REFERENCE.read_text() + text), step, rubric, tmp,
                              ["data_parallel"], matter=matter)["data_parallel"]
        assert outcome.status == (Status.PASSED if passes else Status.FAILED), (name, outcome.message)
        if passes:   # a world for each call
            assert executor.worlds == before + 1 + worlds and matter == {("data_parallel", "step"): ""}, name
        else:
            assert "values came out right even when what its all-reduces returned for the weight's gradient" \
                in outcome.comm_message, outcome.message


# The reference at the public check's seed, the store swap with collectives for show at any other.
PUBLIC_ONLY = '''

_reference = {name: globals()[name] for name in ("data_parallel_single_step", "full_column_parallel_single_step")}
''' + SHOWN + '''

def _at_the_public_check(name):
    swapped = globals()[name]

    def run(seed=42, device=None):   # the reference whole at the public check (its layer too), else the swap
        global FullColumnParallelLinear
        if seed != 42:
            return swapped(seed=seed, device=device)
        forged, FullColumnParallelLinear = FullColumnParallelLinear, _HonestLayer
        try:
            return _reference[name](seed=seed, device=device)
        finally:
            FullColumnParallelLinear = forged
    return run


data_parallel_single_step = _at_the_public_check("data_parallel_single_step")
full_column_parallel_single_step = _at_the_public_check("full_column_parallel_single_step")
'''


def test_parallel_work_done_at_the_public_check_alone_fails_at_every_hidden_check(worlds):
    """Shown to come from the collectives at the public check, the values of a hidden check are
    scaled again: code that tells the public check apart by its seed does the work there alone."""
    executor, rubric, step, _, tmp = worlds
    code, matter = _code(tmp, "public_only", REFERENCE.read_text() + PUBLIC_ONLY), {}
    public = judge_check(executor, code, step, rubric, tmp, PARTS, matter=matter)
    assert all(o.status == Status.PASSED for o in public.values()), {p: o.message for p, o in public.items()}
    assert matter == {("data_parallel", "step"): "", ("tensor_parallel", "step"): ""}
    hidden = dataclasses.replace(step, name="hidden-step", seed=7, hidden=True)
    judged = judge_check(executor, code, hidden, rubric, tmp, PARTS, matter=matter)
    for part in ("data_parallel", "tensor_parallel"):
        assert judged[part].status == Status.FAILED and "values came out right even when" in judged[part].comm_message, \
            judged[part].message
    assert matter == {("data_parallel", "step"): "an earlier hidden check", ("tensor_parallel", "step"): "an earlier hidden check"}
