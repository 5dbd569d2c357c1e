"""The transformer block in tensor parallel (optional, on Part 5's layers): the verdict's math against
the reference's own code at several world sizes (the block alone, and the tiny transformer's step),
the rubric's refusals (Part 5 off, heads that do not divide), and a batch graded with the part turned
on (the reference, the skeleton, a mutant per usual mistake)."""

import json

import pytest
import torch
import yaml

from grader.batch.run import grade_batch
from grader.rerun.check import prepare_code, run_check
from grader.rerun.executor import WarmExecutor
from grader.rerun.wire import model_data
from grader.rerun.wire.secret import derive
from grader.rubric import Check, RubricError, load_rubric, rubric_from_dict
from grader.verdict import comm, transformer, transformer_step
from tests.corpus import (MUTANTS, PART5, PART7, REFERENCE, ROOT, Files, fast_rubric, mutate, refingerprint,
                          skeleton, with_part7, without_optional, write_zip)
from tests.worlds import load_module, run_world

PART = "transformer_block"
BLOCK_MUTANTS = sorted(n for n, m in MUTANTS.items() if m.part == PART)
CHECK = dict(seed=11, global_batch_size=3, hidden_dim=16, num_heads=4, head_dim=4, seq_len=5)
STEP_CHECK = dict(CHECK, vocab_size=16, num_layers=2, kind="step")
KEY = bytes(range(32))


def _reference_block(rank, world_size, config):
    """The reference's transformer_block_forward_backward and block_single_device at `config`, in one
    rank of a real gloo world, as plain lists."""
    module = load_module(REFERENCE)
    for key, value in config.items():
        setattr(module, key, value)
    parallel = module.transformer_block_forward_backward(seed=config["seed"], device="cpu")
    single = module.block_single_device(seed=config["seed"], device="cpu")
    return [t.tolist() for t in (*parallel, *single)]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_the_graders_block_is_the_references(world_size):
    check = Check(world_size=world_size, **CHECK)
    layer = transformer.seeded(check)
    want = transformer.ranks(layer, world_size)
    single = transformer.ranks(layer, 1)[0]
    for found in want:   # every rank: the single-device block's output and gradient of X
        assert torch.allclose(found["output"], single["output"]) and torch.allclose(found["input_grad"], single["input_grad"])
        for name in ("ln1_weight", "ln1_bias", "ln2_weight", "ln2_bias"):   # replicated: whole on every rank
            assert torch.allclose(found[f"{name}_grad"], single[f"{name}_grad"]), name
    for name, dim in (("w1", 1), ("w2", 0), ("proj", 0)):   # the shards' gradients: the single device's, cut
        assert torch.allclose(torch.cat([f[f"{name}_grad"] for f in want], dim=dim), single[f"{name}_grad"]), name
    config = {k: getattr(check, k) for k in CHECK}
    for out, grad_x, single_out, single_grad in run_world(world_size, _reference_block, config):
        assert torch.allclose(torch.tensor(out, dtype=torch.float64), want[0]["output"], atol=1e-5)
        assert torch.allclose(torch.tensor(grad_x, dtype=torch.float64), want[0]["input_grad"], atol=1e-5)
        assert torch.allclose(torch.tensor(single_out), torch.tensor(out), atol=1e-5)
        assert torch.allclose(torch.tensor(single_grad), torch.tensor(grad_x), atol=1e-5)


def _reference_step(rank, world_size, config):
    """The reference's transformer_single_step on rank `rank`'s view of the step's data (KEY's draw
    at `config`): [its loss, its updated parameters flattened]."""
    module = load_module(REFERENCE)
    for key in ("num_heads", "head_dim", "seq_len", "hidden_dim", "vocab_size"):
        setattr(module, key, config[key])
    data = model_data.model(derive(KEY, config, PART, world_size), config, rank)
    loss, params = module.transformer_single_step(data.tokens, data.targets, data.embedding, data.blocks,
                                                  data.head, world_size, rank)
    return [float(loss), torch.cat([p.reshape(-1) for p in params]).tolist()]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_the_graders_step_is_the_single_device_models_and_the_references(world_size):
    """The verdict's step at p ranks is the single-device model's cut into the ranks' shards, and the
    reference's ranks, each on its own view (noise outside its shards), give it."""
    check = Check(world_size=world_size, **STEP_CHECK)
    model = transformer_step.served(check, 0.5, derive(KEY, STEP_CHECK, PART, world_size))
    want, single = transformer_step.ranks(model, world_size), transformer_step.ranks(model, 1)[0]
    for found in want:   # replicated: the loss and the final LayerNorm whole on every rank
        assert torch.allclose(found["loss"], single["loss"])
        assert all(torch.allclose(a, b) for a, b in zip(found["params"][-3:-1], single["params"][-3:-1]))
    assert torch.allclose(torch.cat([f["params"][0] for f in want]), single["params"][0])        # E's rows
    assert torch.allclose(torch.cat([f["params"][-1] for f in want], dim=1), single["params"][-1])   # W's columns
    assert torch.allclose(torch.cat([f["params"][7] for f in want], dim=1), single["params"][7])     # W1's columns
    assert not torch.allclose(single["params"][0], model.embedding)   # the step moved E
    for rank, (loss, flat) in enumerate(run_world(world_size, _reference_step, STEP_CHECK)):
        assert abs(loss - float(want[rank]["loss"])) < 1e-5
        assert transformer_step.close(torch.tensor(flat, dtype=torch.float64),
                                      transformer_step._flat(want[rank]["params"]), load_rubric().tolerance)


def _step_as_nn_linear_holds_it(rank, world_size, config):
    """What the grader's rank takes of the reference's step (transformer_block.stepped), of the
    reference as it is and of one returning every weight transposed, as a block built on nn.Linear
    holds it ([out, in]), then of that one with a wrong square weight (W_o's shard at one rank)."""
    from grader.parts import transformer_block
    module = load_module(REFERENCE)
    for key in ("num_heads", "head_dim", "seq_len", "hidden_dim", "vocab_size"):
        setattr(module, key, config[key])
    data = model_data.model(derive(KEY, config, PART, world_size), config, rank)
    step = module.transformer_single_step
    taken = [transformer_block.stepped(module, None, config, data)["weight"].tolist()]
    for scale in (1.0, 2.0):
        def transposed(*args, scale=scale):
            loss, params = step(*args)
            params = [t.T.contiguous() if t.dim() == 2 else t for t in params]
            params[4] = params[4] * scale   # the first block's W_o rows: [d / p, d], square at one rank
            return loss, params
        module.transformer_single_step = transposed
        taken.append(transformer_block.stepped(module, None, config, data)["weight"].tolist())
    return taken


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_step_returning_its_weights_as_nn_linear_holds_them_is_taken_transposed(world_size):
    """A model built on nn.Linear returns its weights [out, in]: each is taken transposed, a square
    one (W_o's shard at one rank) the way nearer the shard it was handed; wrong values stay wrong."""
    for right, transposed, wrong in run_world(world_size, _step_as_nn_linear_holds_it, STEP_CHECK):
        assert transposed == right and wrong != right
    from grader.parts import transformer_block
    assert transformer_block._as_shards([torch.zeros(3, 5)], [(3, 4)], [None]) is None   # neither way round


def test_each_step_mistake_computes_something_else_than_the_step():
    check = Check(world_size=4, **STEP_CHECK)
    model = transformer_step.served(check, 0.5, derive(KEY, STEP_CHECK, PART, 4))
    right = transformer_step._flat(transformer_step.ranks(model, 4)[1]["params"])
    for mistake in transformer_step.ORDER:
        assert not torch.allclose(transformer_step._flat(transformer_step.ranks(model, 4, mistake)[1]["params"]),
                                  right), mistake


def test_gathered_logits_are_told_from_a_g_written_as_a_reduce_scatter_and_an_all_gather():
    """A rank that all-gathered its logits' columns gathered them; one whose g is a ring's all-reduce
    (each reduce-scatter then all-gather of the block's activations) gathered no logits, however
    many activations it moved."""
    from types import SimpleNamespace
    check = Check(world_size=4, **STEP_CHECK)
    share = check.global_batch_size * check.seq_len * check.vocab_size // 4
    logits = [{"op": "all_gather", "numel": 5 * share}]
    ring = [{"op": op, "numel": 5 * 4 * share} for _ in range(3) for op in ("reduce_scatter_tensor", "all_gather_into_tensor")]
    assert transformer_step._gathered(SimpleNamespace(comm=logits), check)
    assert transformer_step._gathered(SimpleNamespace(comm=ring + logits), check)
    assert not transformer_step._gathered(SimpleNamespace(comm=ring), check)


def test_the_qkv_shards_hold_each_ranks_heads():
    """Rank r's QKV gradient is the single device's W_q, W_k and W_v columns of its heads, side by side."""
    layer = transformer.seeded(Check(world_size=2, **CHECK))
    want, single = transformer.ranks(layer, 2), transformer.ranks(layer, 1)[0]["qkv_grad"]
    d = layer.x.shape[-1]
    for r in range(2):
        heads = torch.cat([single[:, j * d + r * d // 2:j * d + (r + 1) * d // 2] for j in range(3)], dim=1)
        assert torch.allclose(want[r]["qkv_grad"], heads)


def test_each_mistake_computes_something_else_than_the_block():
    layer = transformer.seeded(Check(world_size=4, **CHECK))
    right = transformer.ranks(layer, 4)
    for mistake in transformer.ORDER:
        found = transformer.ranks(layer, 4, mistake)
        differs = [n for n in right[1] if not torch.allclose(found[1][n], right[1][n])]
        assert differs, mistake
    no_f = transformer.ranks(layer, 4, transformer.Mistake.ATTN_NO_F)
    assert all(torch.allclose(no_f[r]["output"], right[r]["output"]) for r in range(4))   # backward only
    assert transformer.ranks(layer, 1, transformer.Mistake.ATTN_NO_G)[0]["output"].allclose(right[0]["output"])


def _rubric_data() -> dict:
    """The course's rubric, its optional parts off: each test turns on the parts it grades."""
    return without_optional(yaml.safe_load((ROOT / "grader" / "rubric.yaml").read_text()))


def test_the_block_needs_part_5_and_heads_the_world_sizes_divide_listed_at_once():
    data = with_part7(_rubric_data())
    on = rubric_from_dict(data)
    assert on.part_ids[-3:] == ("megatron_mlp", "vocab_parallel", PART) and on.max_score == load_rubric().max_score
    assert all(PART in on.parts_at(c) for c in on.checks)   # the step checks and the backward checks
    data["parts"]["megatron_mlp"] = None
    data["checks"][1]["num_heads"] = 6   # default-backward, at 4 ranks (and 1, 2)
    with pytest.raises(RubricError) as info:
        rubric_from_dict(data, "r.yaml")
    said = str(info.value)
    assert "2 problems" in said
    assert ("r.yaml.parts: Part 7 (optional): a transformer block in tensor parallel builds on the code of "
            "Part 5 (optional): Megatron's MLP block, which the rubric leaves off: turn megatron_mlp on too, "
            "or leave transformer_block off") in said
    assert ("splits the attention's heads over the ranks, but num_heads (6) is not divisible by world_size (4): "
            "set the check's num_heads to a multiple of 4 (e.g. 4 or 8)") in said


@pytest.mark.stock_rubric
def test_the_stock_course_leaves_the_block_off():
    stock = load_rubric()
    assert PART not in stock.parts and all(PART not in stock.parts_at(c) for c in stock.checks)
    data = _rubric_data()
    data["parts"] = {**data["parts"], **PART5}
    assert rubric_from_dict(data).digest() == rubric_from_dict({**data, "parts": {**data["parts"], PART: None}}).digest()


def test_the_reference_moves_exactly_what_the_part_says_and_passes_at_every_check(tmp_path):
    """The part's `moves` are the reference's real calls (four all-reduces of [B, S, d] per rank at a
    check of several ranks, none at one), and the verdict passes the reference's values."""
    rubric = load_rubric(fast_rubric(tmp_path, **{k: v for k, v in with_part7(_rubric_data()).items()
                                                  if k in ("parts", "checks")}))
    executor = WarmExecutor("best")
    executor.start()
    try:
        for check in (c for c in rubric.checks if PART in rubric.parts_at(c)):
            run = run_check(executor, prepare_code(REFERENCE), check, rubric, tmp_path, [PART])[PART]
            assert run.status == "passed", (check.name, run.detail)
            needs = comm.needed(PART, check)
            assert bool(needs) == (check.world_size > 1) and set(needs) <= {"all_reduce"}, check.name
            for rank, r in run.ranks.items():
                assert {c: comm.moved(r.comm, c, check.world_size)[1] for c in needs} == needs, (check.name, rank)
    finally:
        executor.close()


@pytest.fixture(scope="module")
def graded_on(reference_run, tmp_path_factory):
    """A batch graded with the block (and Part 5) on: {student: grading.json} and the rubric."""
    tmp = tmp_path_factory.mktemp("block")
    rubric_path = fast_rubric(tmp, **{k: v for k, v in with_part7(_rubric_data()).items() if k in ("parts", "checks")})
    log, err = reference_run
    inbox = tmp / "inbox"
    inbox.mkdir()
    handins = {"reference": REFERENCE.read_text(), "skeleton": skeleton(("baseline", "grad_accumulation",
                                                                         "data_parallel", "tensor_parallel",
                                                                         "megatron_mlp", "vocab_parallel")),
               **{name: mutate(name) for name in BLOCK_MUTANTS}}
    for name, code in handins.items():
        write_zip(inbox / f"{name}.zip", Files(code=code, log=refingerprint(log, code), err=err))
    out = tmp / "out"
    grade_batch([inbox], out, jobs=2, rubric_path=rubric_path, progress=False)
    results = {p.parent.name: json.loads(p.read_text()) for p in (out / "students").glob("*/grading.json")}
    return results, load_rubric(rubric_path)


@pytest.mark.timeout(900)
@pytest.mark.optional   # the part graded in a batch: make test-optional
def test_the_reference_passes_the_block_at_every_check_with_its_log_and_bonus(graded_on):
    results, rubric = graded_on
    r = results["reference"]
    part = r["parts"][PART]
    assert part["status"] == "passed", part["message"]
    assert [o["check"] for o in part["checks"]] == [c.name for c in rubric.checks]   # every kind
    assert part["log"]["passed"] and part["score"] == PART7[PART]["log"] + PART7[PART]["rerun"]
    assert r["max_score"] == rubric.max_score and r["score"] == rubric.max_score + 30   # three bonuses


@pytest.mark.optional   # the part graded in a batch: make test-optional
def test_the_skeleton_scores_nothing_in_the_block(graded_on):
    part = graded_on[0]["skeleton"]["parts"][PART]
    assert part["status"] == "not_implemented" and part["score"] == 0, part["message"]
    assert graded_on[0]["skeleton"]["parts"]["megatron_mlp"]["status"] == "passed"   # filled in: the block's own TODOs


@pytest.mark.parametrize("name", BLOCK_MUTANTS)
@pytest.mark.optional   # the part graded in a batch: make test-optional
def test_each_block_mistake_fails_the_block_with_its_diagnosis_and_costs_nothing_else(graded_on, name):
    results, rubric = graded_on
    mutant, r = MUTANTS[name], results[name]
    part = r["parts"][PART]
    assert part["status"] == "failed" or (mutant.or_crashes and part["status"] == "crashed"), part["message"]
    assert mutant.diagnosis in part["message"] and part["rerun_points"] < rubric.parts[PART].rerun, part["message"]
    for other, p in r["parts"].items():
        if other != PART:
            assert p["status"] == "passed", (other, p["message"])
