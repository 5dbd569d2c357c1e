"""Part 6 (optional), the vocabulary split over the ranks: the verdict's math against torch's
cross_entropy on the full logits and against the reference's own code at 1, 2 and 4 ranks, and a
batch graded with the part turned on (the reference, the skeleton, a mutant per usual mistake),
and the course's rubric with it left off."""

import json

import pytest
import torch
import torch.nn.functional as F
import yaml

from grader.batch.run import grade_batch
from grader.rerun.wire import secret
from grader.rerun.check import prepare_code, run_check
from grader.rerun.executor import WarmExecutor
from grader.rerun.wire.protocol import PartSecret
from grader.rubric import Check, RubricError, load_rubric, rubric_from_dict
from grader.verdict import comm, vocab
from tests.corpus import (MUTANTS, PART6, REFERENCE, ROOT, Files, fast_rubric, mutate, refingerprint, skeleton,
                          with_part6, without_optional, write_zip)
from tests.worlds import load_module, run_world

VOCAB_MUTANTS = sorted(n for n, m in MUTANTS.items() if m.part == "vocab_parallel")
# The hidden checks' cases, each a check's own keys: an ordinary one, logits near 1e4, every target
# in one rank's slice, padding targets, a vocabulary of another size.
CASES = {"ordinary": {}, "logits near 1e4": {"vocab_logit_shift": 1.0e4},
         "one slice": {"vocab_one_slice": True}, "padding": {"vocab_padding": 5}, "vocabulary 52": {"vocab_size": 52}}


def _data(world_size: int, seed: int = 5, **keys) -> tuple:
    """(check, the real data, PartSecret) of a check of `world_size` ranks with the case's `keys`."""
    check = Check(world_size=world_size, seed=seed, global_batch_size=12, input_dim=6, **keys)
    data = PartSecret(seed=seed, blocks=[seed * 10 + r for r in range(world_size)],
                      noise=[seed * 100 + r for r in range(world_size)])
    return check, vocab.served(check, data), data


def _torch(d: vocab.Data) -> tuple:
    """(loss, dL/dz [B, V], dL/dE [V, d]) by torch's cross_entropy on the full logits."""
    e = d.embedding.clone().requires_grad_(True)
    z = e[d.tokens] @ d.head + d.shift
    z.retain_grad()
    loss = F.cross_entropy(z, d.targets, ignore_index=secret.IGNORE_INDEX)
    loss.backward()
    return loss.detach(), z.grad, e.grad


@pytest.mark.stock_rubric
def test_the_stock_course_leaves_part_6_off():
    stock = load_rubric()
    assert "vocab_parallel" not in stock.parts and all("vocab_parallel" not in stock.parts_at(c) for c in stock.checks)


def test_a_rubric_turns_part_6_on_as_a_bonus_and_refuses_a_vocabulary_the_ranks_cannot_split():
    data = without_optional(yaml.safe_load((ROOT / "grader" / "rubric.yaml").read_text()))
    off = rubric_from_dict(data)
    on = rubric_from_dict(with_part6(data))
    assert on.part_ids[-1] == "vocab_parallel" and on.max_score == off.max_score   # a bonus: on top
    assert [c.name for c in on.checks if "vocab_parallel" in on.parts_at(c)] == \
        [c.name for c in on.checks if c.kind == "backward"]
    assert off.digest() != on.digest()
    data = with_part6(data)   # Part 6 runs at backward checks: their sizes are the ones refused
    backward = [c for c in data["checks"] if c.get("kind") == "backward" and c.get("world_size", 4) > 1]
    backward[0]["vocab_size"] = 66   # default-backward, at 4 ranks
    backward[-1]["vocab_size"] = 50
    with pytest.raises(RubricError) as info:
        rubric_from_dict(data, "r.yaml")
    said = str(info.value)
    assert "vocab_size (66) is not divisible by world_size (4)" in said and "vocab_size (50) is not divisible" in said
    assert "the vocabulary over the ranks" in said


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_the_graders_math_is_torchs_cross_entropy_on_the_full_logits(world_size, case):
    _, d, _ = _data(world_size, **CASES[case])
    loss, dz, de = _torch(d)
    assert torch.isfinite(loss)
    k = d.embedding.shape[0] // world_size
    for r, got in enumerate(vocab.simulate(d, world_size)):
        assert torch.allclose(got["loss"], loss.reshape(1), rtol=1e-10, atol=1e-10)
        assert torch.allclose(got["logits_grad"], dz[:, r * k:(r + 1) * k], atol=1e-12)
        assert torch.allclose(got["embedding_grad"], de[r * k:(r + 1) * k], atol=1e-12)


def _reference_ranks(rank, world_size, keys):
    """The reference's vocab_parallel_loss on rank `rank`'s view of the data, in a real gloo world."""
    module = load_module(REFERENCE)
    check, _, data = _data(world_size, **keys)
    view = secret.vocab(data, vars(check), rank)
    loss, dz, de = module.vocab_parallel_loss(view.tokens, view.targets, view.embedding, view.head, world_size,
                                              rank, logit_shift=check.vocab_logit_shift)
    return loss.reshape(1).tolist(), dz.tolist(), de.tolist()   # plain lists: no tensor outlives its rank


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_the_references_ranks_give_what_the_grader_computes(world_size):
    for case, keys in CASES.items():
        _, d, _ = _data(world_size, **keys)
        want = vocab.simulate(d, world_size)
        ranks = run_world(world_size, _reference_ranks, keys)
        for r, (loss, dz, de) in enumerate(ranks):
            got = {"loss": loss, "logits_grad": dz, "embedding_grad": de}
            for name, value in got.items():
                assert torch.allclose(torch.tensor(value, dtype=torch.float64), want[r][name], atol=1e-10), \
                    (case, r, name)


def test_each_mistake_computes_something_else_than_the_loss():
    """At 4 ranks, on the case each is about: every usual mistake gives other values than the right ones."""
    about = {vocab.Mistake.NO_MAX: "logits near 1e4", vocab.Mistake.PADDING_COUNTED: "padding"}
    for mistake in vocab.MISTAKES:
        _, d, _ = _data(4, **CASES[about.get(mistake, "ordinary")])
        right, wrong = vocab.simulate(d, 4), vocab.simulate(d, 4, mistake)
        assert any(not torch.allclose(wrong[r][n], right[r][n]) for r in range(4) for n in right[r]), mistake
    _, d, _ = _data(4, **CASES["logits near 1e4"])
    assert not torch.isfinite(vocab.simulate(d, 4, vocab.Mistake.NO_MAX)[0]["loss"]).all()


def test_the_reference_moves_exactly_what_part_6_says_at_every_check_of_several_ranks(tmp_path):
    """Part 6's `moves` are the reference's real calls (the two [B, d] all-reduces of f and g, the two
    [B] sums of the loss; the max is no sum): per rank, the values its summing all-reduces move equal
    them at every backward check; a one-rank check asks for none."""
    data = without_optional(yaml.safe_load((ROOT / "grader" / "rubric.yaml").read_text()))
    rubric = load_rubric(fast_rubric(tmp_path, **{k: v for k, v in with_part6(data).items() if k in ("parts", "checks")}))
    executor = WarmExecutor("best")
    executor.start()
    try:
        for check in (c for c in rubric.checks if "vocab_parallel" in rubric.parts_at(c)):
            run = run_check(executor, prepare_code(REFERENCE), check, rubric, tmp_path, ["vocab_parallel"])["vocab_parallel"]
            assert run.status == "passed", (check.name, run.detail)
            needs = comm.needed("vocab_parallel", check)
            assert bool(needs) == (check.world_size > 1), check.name
            for rank, r in run.ranks.items():
                assert {c: comm.moved(r.comm, c, check.world_size)[1] for c in needs} == needs, (check.name, rank)
    finally:
        executor.close()


@pytest.fixture(scope="module")
def graded_on(reference_run, tmp_path_factory):
    """A batch graded with Part 6 on: {student: grading.json} and the rubric."""
    tmp = tmp_path_factory.mktemp("part6")
    data = without_optional(yaml.safe_load((ROOT / "grader" / "rubric.yaml").read_text()))
    rubric_path = fast_rubric(tmp, **{k: v for k, v in with_part6(data).items() if k in ("parts", "checks")})
    log, err = reference_run
    inbox = tmp / "inbox"
    inbox.mkdir()
    handins = {"reference": REFERENCE.read_text(), "skeleton": skeleton(),
               **{name: mutate(name) for name in VOCAB_MUTANTS}}
    for name, code in handins.items():
        write_zip(inbox / f"{name}.zip", Files(code=code, log=refingerprint(log, code), err=err))
    out = tmp / "out"
    grade_batch([inbox], out, jobs=2, rubric_path=rubric_path, progress=False)
    results = {p.parent.name: json.loads(p.read_text()) for p in (out / "students").glob("*/grading.json")}
    return results, load_rubric(rubric_path), out


@pytest.mark.timeout(900)
@pytest.mark.optional   # the part graded in a batch: make test-optional
def test_the_reference_passes_part_6_at_every_backward_check_with_its_log_and_bonus(graded_on):
    results, rubric, out = graded_on
    r = results["reference"]
    part = r["parts"]["vocab_parallel"]
    assert part["status"] == "passed", part["message"]
    assert [o["check"] for o in part["checks"]] == [c.name for c in rubric.checks if c.kind == "backward"]
    bonus = PART6["vocab_parallel"]["log"] + PART6["vocab_parallel"]["rerun"]
    assert part["log"]["passed"] and part["score"] == bonus
    assert r["max_score"] == rubric.max_score and r["score"] == rubric.max_score + bonus
    assert "vocab_parallel" in (out / "grades.csv").read_text().splitlines()[0]


@pytest.mark.optional   # the part graded in a batch: make test-optional
def test_the_skeleton_scores_nothing_in_part_6(graded_on):
    part = graded_on[0]["skeleton"]["parts"]["vocab_parallel"]
    assert part["status"] == "not_implemented" and "TODO in" in part["message"], part["message"]
    assert part["score"] == 0


@pytest.mark.parametrize("name", VOCAB_MUTANTS)
@pytest.mark.optional   # the part graded in a batch: make test-optional
def test_each_part_6_mistake_fails_part_6_with_its_diagnosis_and_costs_nothing_else(graded_on, name):
    results, rubric, _ = graded_on
    mutant, r = MUTANTS[name], results[name]
    part = r["parts"]["vocab_parallel"]
    assert part["status"] == "failed" and mutant.diagnosis in part["message"], part["message"]
    public = [o for o in part["checks"] if not o["hidden"]]
    assert all(o["status"] == "passed" for o in public) == mutant.hidden_only, part["message"]
    for other, p in r["parts"].items():
        if other != "vocab_parallel":
            assert p["status"] == "passed" and p["score"] == rubric.parts[other].log + rubric.parts[other].rerun, \
                (other, p["message"])


@pytest.mark.optional   # the part graded in a batch: make test-optional
def test_a_part_6_mistake_that_passes_only_at_one_rank_earns_nothing(graded_on):
    """The one-hot on every rank is right at one rank, where every target is the rank's: that check
    earns nothing while no check of more ranks passes (a parallel part: grader.worth)."""
    part = graded_on[0]["vocab_one_hot_every_rank"]["parts"]["vocab_parallel"]
    one_rank = [o for o in part["checks"] if o["world_size"] == 1]
    assert one_rank and all(o["status"] == "passed" and o["points"] == 0 for o in one_rank), one_rank
    assert part["rerun_points"] == 0

