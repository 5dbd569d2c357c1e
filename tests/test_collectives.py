"""A parallel part is judged on its communication as well as its values (grader.verdict.comm).

The collectives each part's algorithm calls are stated once, in grader.parts (`moves`); the
reference's own recorded calls move exactly those volumes at every check of several ranks. A
hand-in whose ranks swap the data they were served through files and each compute the whole
step, layer or block alone scores 0 for Parts 3-5 (Part 5 on), with feedback naming the missing
collective, whether or not the ranks can see each other's files; so does one that calls the
collectives on tensors too small to carry the data, and one that calls them on zeros large enough
for show (a world that scales what they return leaves its values right). Correct hand-ins that
communicate otherwise than the reference (a flattened gradient reduced in pieces,
all_gather_into_tensor, a barrier, an asynchronous all-reduce, the ranks counted by another) keep
full marks, graded in the same batch, as root and as an ordinary user.
"""

import json
import re
import subprocess
import sys

import pytest
import yaml

from grader.names import student_dir
from grader.parts import BY_ID, PARALLEL_PART_IDS
from grader.rerun.check import RankRun, prepare_code, run_check
from grader.rerun.executor import WarmExecutor
from grader.rubric import load_rubric, rubric_from_dict
from grader.verdict import comm
from grader.results import CheckOutcome, Status
from grader.verdict.say import Say
from tests import tas
from tests.corpus import REFERENCE, ROOT, Files, fast_rubric, refingerprint, with_part5, without_optional, write_zip
from tests.hostile import file_swap
from tests.test_feedback import leaked, student_facing
from tests.test_sandbox import _ta_or_skip

pytestmark = pytest.mark.hostile   # make test-hostile runs these; make test leaves them out

STOCK = without_optional(yaml.safe_load((ROOT / "grader" / "rubric.yaml").read_text()))
ON = {k: v for k, v in with_part5(STOCK).items() if k in ("parts", "checks")}   # the course with Part 5 on (alone)
FULL_ON = sum(p.log + p.rerun for p in rubric_from_dict(with_part5(STOCK)).parts.values())
# Where TAs grade: as root (`make test-hostile`), and as an ordinary user (marker configs, `make test-configs`).
CONFIGS = ["root", pytest.param("user", marks=pytest.mark.configs)]
NAMED = {"data_parallel": "all-reduce", "tensor_parallel": "all-gather", "megatron_mlp": "all-reduce"}


def _replace(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def communicates_otherwise() -> str:
    """The reference with Part 3's gradient flattened and all-reduced in two pieces after a barrier,
    and Part 4's shards gathered by all_gather_into_tensor: right, and with every volume moved."""
    code = _replace(REFERENCE.read_text(), "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n",
                    "        dist.barrier()\n"
                    "        flat = param.grad.reshape(-1).clone()\n"
                    "        half = flat.numel() // 2\n"
                    "        dist.all_reduce(flat[:half])\n"
                    "        dist.all_reduce(flat[half:], op=dist.ReduceOp.SUM)\n"
                    "        param.grad.copy_(flat.view_as(param.grad))\n")
    return _replace(code, "    dist.all_gather(weight_shards, local_updated_weight)\n",
                    "    gathered = torch.empty(world_size * local_updated_weight.numel())\n"
                    "    dist.all_gather_into_tensor(gathered, local_updated_weight.reshape(-1))\n"
                    "    weight_shards = list(gathered.view(world_size, input_dim, local_output_dim))\n")


def test_the_reference_moves_exactly_what_each_part_says_at_every_check_of_several_ranks(tmp_path):
    """The parts' `moves` are the reference's real calls: per rank and per collective, the values
    its calls move equal the sum of the part's moves at that check (so a smaller total is short of
    the algorithm); a one-rank check asks for none."""
    rubric = load_rubric(fast_rubric(tmp_path, **ON))
    code = prepare_code(REFERENCE)
    executor = WarmExecutor("best")
    executor.start()
    try:
        for check in rubric.checks:
            parts = [p for p in PARALLEL_PART_IDS if p in rubric.parts_at(check)]
            runs = run_check(executor, code, check, rubric, tmp_path, parts)
            for part, run in runs.items():
                assert run.status == "passed", (check.name, part, run.detail)
                needs = comm.needed(part, check)
                assert bool(needs) == (check.world_size > 1), (check.name, part)
                for rank, r in run.ranks.items():
                    moved = {c: comm.moved(r.comm, c, check.world_size)[1] for c in needs}
                    assert moved == needs, (check.name, part, rank, r.comm)
                assert not comm.shortfalls(part, check, run.ranks)
    finally:
        executor.close()


def test_each_part_states_its_collectives_once_for_every_kind_it_runs():
    for part in PARALLEL_PART_IDS:
        info = BY_ID[part]
        assert {m.kind for m in info.moves} == set(info.kinds), part
        assert {m.collective for m in info.moves} <= set(comm.SAID)


def _held(calls_of: dict, check) -> CheckOutcome:
    """A passed Part 3 outcome at `check`, held against ranks that recorded `calls_of` (rank -> calls)."""
    ranks = {r: RankRun(rank=r, status="ok", comm=calls) for r, calls in calls_of.items()}
    run = type("PartRun", (), {"ranks": ranks})()
    outcome = CheckOutcome(check=check.name, hidden=check.hidden, world_size=check.world_size,
                           status=Status.PASSED, message="matches the reference")
    return comm.hold(outcome, run, "data_parallel", check, Say(check))


def test_one_rank_short_of_its_all_reduce_is_named_and_a_hidden_checks_sizes_by_name():
    rubric = load_rubric()
    public = next(c for c in rubric.checks if c.name == "default")
    hidden = next(c for c in rubric.checks if c.hidden and c.world_size == 4 and c.kind == "step")
    for check in (public, hidden):
        volume = check.input_dim * check.output_dim
        right = {"op": "all_reduce", "numel": volume, "reduce_op": "SUM"}
        halves = [dict(right, numel=volume // 2), dict(right, numel=volume - volume // 2, reduce_op=None)]
        assert _held({0: [right], 1: halves, 2: [dict(right, reduce_op="AVG")], 3: [right]}, check).status == "passed"
        maximum = dict(right, reduce_op="MAX")   # not a sum: none of the gradient's all-reduce
        outcome = _held({0: [right], 1: [right], 2: [maximum, {"op": "barrier", "numel": 0, "reduce_op": None}],
                         3: [right]}, check)
        assert outcome.status == "failed" and not outcome.comm_ok and outcome.failing_ranks == [2]
        if check.hidden:
            assert outcome.comm_message.startswith("one rank called no all-reduce: Part 3 must all-reduce the "
                                                   "weight's gradient (input_dim x output_dim values per rank)")
            assert str(volume) not in outcome.message and str(check.input_dim) not in outcome.message
        else:
            assert outcome.comm_message.startswith(f"rank 2 called no all-reduce: Part 3 must all-reduce the weight's "
                                                   f"gradient (64 x 32 = {volume} values per rank)")
        short = _held({r: [dict(right, numel=volume - 1)] for r in range(4)}, check)
        said = "too few values" if check.hidden else f"only {volume - 1} values in all"
        assert short.status == "failed" and f"every rank all-reduced {said}" in short.comm_message
    one = next(c for c in rubric.checks if c.world_size == 1)
    assert _held({0: []}, one).status == "passed"   # one rank has no one to talk to


def test_what_a_rank_moved_too_few_is_matched_to_the_moves_it_equals():
    """Part 6's all-reduces short by as much as one of its per-token moves: the feedback names the
    moves that many values make (both, where two are alike); short by an amount none makes, none."""
    import math
    from grader.parts import BY_ID
    check = next(c for c in load_rubric().checks if c.name == "default-backward")
    moves = [m for m in BY_ID["vocab_parallel"].moves if m.kind == check.kind and m.collective == "all_reduce"]
    volumes = {m.what: math.prod(comm.size(check, n) for n in m.sizes) for m in moves}
    whole = sum(volumes.values())
    token = next(m.what for m in moves if "sum of exponentials" in m.what)
    for left, named in ((volumes[token], True), (1, False)):
        ranks = {r: RankRun(rank=r, status="ok", comm=[{"op": "all_reduce", "numel": whole - left, "reduce_op": "SUM"}])
                 for r in range(4)}
        said = comm.explain("vocab_parallel", check, comm.shortfalls("vocab_parallel", check, ranks), 4, Say(check))
        assert f"every rank all-reduced only {whole - left} values in all" in said
        assert ("what is missing is as much as " + token in said) == named, said
        alike = [w for w, v in volumes.items() if v == volumes[token] and w != token]
        assert all((", or as " + w in said) == named for w in alike), said


def test_a_broadcast_beside_wrong_values_is_said_where_each_rank_holds_its_own_shards():
    """Part 5's ranks are each handed their own shards: a rank's copy broadcast to the others makes
    their values wrong, and the feedback says so; Part 3's weight is every rank's alike (its own
    diagnoses name a batch broadcast), and right values are never touched."""
    check = next(c for c in load_rubric().checks if c.name == "default")
    sent = [{"op": "broadcast", "numel": 4096, "reduce_op": None}]
    run = type("PartRun", (), {"ranks": {r: RankRun(rank=r, status="ok", comm=sent) for r in range(4)}})()

    def outcome(status):
        return CheckOutcome(check=check.name, hidden=False, world_size=4, status=status, message="wrong weights")
    for part, told in (("megatron_mlp", True), ("data_parallel", False)):
        said = comm.handed_out(outcome(Status.FAILED), run, part, check, Say(check)).message
        assert ("its ranks broadcast (or scattered) tensors in the part" in said) == told, (part, said)
    assert comm.handed_out(outcome(Status.PASSED), run, "megatron_mlp", check, Say(check)).message == "wrong weights"


def waits_and_counts() -> str:
    """The reference with Part 3's all-reduce asynchronous (its handle waited for) and the gradient
    divided by the ranks counted by a second all-reduce: right, and its values come from both (a
    scaled world must not scale the two alike: the ratio would undo it)."""
    return _replace(REFERENCE.read_text(),
                    "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n",
                    "        handle = dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, async_op=True)\n"
                    "        handle.wait()\n"
                    "        counted = torch.ones(1)\n"
                    "        dist.all_reduce(counted)\n"
                    "        param.grad.mul_(world_size / counted)\n")


HANDINS = {"reference": REFERENCE.read_text, "communicates_otherwise": communicates_otherwise,
           "waits_and_counts": waits_and_counts,
           "file_swap": file_swap, "file_swap_dummies": lambda: file_swap(dummies=True),
           "store_swap": lambda: file_swap(via="store"),
           "store_swap_sized_dummies": lambda: file_swap(dummies="sized", via="store")}
SWAPS = ("file_swap", "file_swap_dummies", "store_swap", "store_swap_sized_dummies")


@pytest.fixture(scope="module", params=CONFIGS)
def batch(request, reference_run, tmp_path_factory):
    """The swaps graded in one batch beside correct hand-ins, Part 5 on, by `grade` as root or as
    an ordinary user: {name: grading.json}, OUT, and the rubric."""
    ta = _ta_or_skip(request.param)
    try:
        tmp = ta.home / "work" if ta else tmp_path_factory.mktemp("collectives")
        inbox, out = tmp / "inbox", tmp / "out"
        inbox.mkdir(parents=True)
        rubric = fast_rubric(tmp, **ON)
        log, err = reference_run
        for name, make in HANDINS.items():
            code = make()
            write_zip(inbox / f"{name}.zip", Files(code=code, log=refingerprint(log, code), err=err))
        args = ["-m", "grader", "grade", str(inbox), "--out", str(out), "--jobs", "2", "--rubric", str(rubric), "--quiet"]
        if ta:
            subprocess.run(["chown", "-R", f"{ta.user}:{ta.user}", str(tmp)], check=True)
            proc = ta.run([str(ta.python), *args], timeout=1200)
        else:
            proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=1200)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        results = {p.parent.name: json.loads(p.read_text()) for p in (out / "students").glob("*/grading.json")}
        yield results, out, load_rubric(rubric)
    finally:
        if ta is not None:
            tas.remove(ta)


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("name", ["reference", "communicates_otherwise", "waits_and_counts"])
def test_correct_handins_beside_the_swaps_keep_full_marks(batch, name):
    results, _, rubric = batch
    r = results[name]
    assert r["status"] == "graded" and r["score"] == FULL_ON, \
        {p: v["message"] for p, v in r["parts"].items() if v["status"] != "passed"}
    assert all(o["comm_ok"] for p in r["parts"].values() for o in p["checks"])


@pytest.mark.parametrize("name", SWAPS)
def test_a_swap_without_the_parts_collectives_scores_0_for_parts_3_to_5_and_keeps_parts_1_and_2(batch, name):
    results, _, rubric = batch
    r = results[name]
    assert r["status"] == "graded", r["message"]
    for part in (p for p in PARALLEL_PART_IDS if p in rubric.parts):
        assert r["parts"][part]["score"] == 0 and r["parts"][part]["status"] == "failed", r["parts"][part]["message"]
    kept = sum(rubric.parts[p].log + rubric.parts[p].rerun for p in ("baseline", "grad_accumulation"))
    assert r["score"] == kept


@pytest.mark.parametrize("name", SWAPS)
def test_the_feedback_names_the_missing_collective_wherever_the_values_were_right(batch, name):
    """Through the store the values are always right; through files, wherever the ranks could read
    each other's files (a sandbox that gives each rank its own folders leaves them wrong instead)."""
    results, out, rubric = batch
    r, folder = results[name], student_dir(out, name)
    feedback, report = (folder / "feedback.md").read_text(), (folder / "results.json").read_text()
    right = 0
    for part in (p for p in PARALLEL_PART_IDS if p in rubric.parts):
        for o in r["parts"][part]["checks"]:
            if o["world_size"] == 1:
                continue
            assert o["status"] != "passed", (part, o)
            if o["comm_ok"]:   # the ranks could not read each other's files: wrong values, or a timeout
                assert "matches" not in o["message"], (part, o["message"])
                continue
            right += 1
            # Collectives of zeros as large as the moves: what they carried is not the algorithm's
            # (grader.verdict.carried), where the part says what that is, else the scaled world tells.
            said = ("no rank called",) if "dummies" not in name else \
                ("other values than", "did not get their values from those collectives") if "sized" in name else \
                ("too few values",) if o["hidden"] else ("only 1 value",)
            assert NAMED[part] in o["comm_message"] and any(s in o["comm_message"] for s in said), o["comm_message"]
            hidden = {c.name for c in rubric.checks if c.hidden}   # where it was shown names no hidden check
            assert not hidden & set(re.findall(r"check '([^']+)'", o["comm_message"])), o["comm_message"]
            assert o["comm_message"] in o["message"] and o["diagnosis"] == o["comm_message"]
            if not o["hidden"]:
                assert o["comm_message"] in feedback and o["comm_message"] in report
    if name.startswith("store_swap"):
        assert right == sum(o["world_size"] > 1 for p in PARALLEL_PART_IDS if p in rubric.parts
                            for o in r["parts"][p]["checks"])
    assert not leaked(student_facing(r)) and not leaked(feedback) and not leaked(report)
