"""Hand-ins that want the points without the work, one per class of forgery, graded for real.

Each is the reference (or the skeleton with some parts filled in) with one trick: results computed
on one rank with collectives of nothing for show, the closed form reached through a wrapper's
closure, the worker's own function replaced from a class body, results written on the grader's
pipe for parts never started, an infrastructure error claimed after loading, a stall after the last
part or between two parts, a data-parallel step on the whole batch with an all-reduce of nothing.
No rank's word is believed: every forged part must earn nothing at a check where the part's
parallel work decides the weight (world size above 1), the forger's honest parts keep their points,
and nothing becomes the machine's failure.
"""

import json
import textwrap

import pytest

from grader.batch.run import grade_batch
from grader.names import result_files
from grader.parts import CORE_PART_IDS
from grader.rerun.check import prepare_code
from grader.rerun.executor import WarmExecutor
from grader.results import Status
from grader.rubric import load_rubric
from tests.corpus import REFERENCE, Files, fast_rubric, skeleton, write_zip

pytestmark = pytest.mark.hostile   # make test-hostile runs these; make test leaves them out

RUBRIC = load_rubric()
PARALLEL = ("data_parallel", "tensor_parallel")

# A closed-form step on whatever create_batch hands this rank: the work of one device.
CLOSED_FORM = '''
def _one_device_step(seed):
    torch.manual_seed(seed)
    w0 = torch.randn(input_dim, output_dim)
    x, y = create_batch(global_batch_size, input_dim, output_dim, seed=seed, device="cpu")
    grad = 2.0 / (global_batch_size * output_dim) * x.T @ (x @ w0 - y)
    return w0 - learning_rate * grad
'''


def _replace(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def _function(text: str, name: str, body: str) -> str:
    """`text` with the body of top-level function `name` replaced by `body`."""
    start = text.index(f"\ndef {name}(") + 1
    end = text.index("\n\n\n", start)
    header = text[start:text.index(":\n", start) + 2]
    return text[:start] + header + textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + text[end:]


def forged_counts() -> str:
    """Every part the closed form on one rank, with all_reduce / all_gather of zeros of the sizes
    a real step would send, so a spy counting collectives would see the right names and sizes."""
    code = REFERENCE.read_text() + CLOSED_FORM
    code = _function(code, "data_parallel_single_step", """
        w1 = _one_device_step(seed)
        dist.all_reduce(torch.zeros(input_dim, output_dim), op=dist.ReduceOp.SUM)
        return w1
    """)
    return _function(code, "full_column_parallel_single_step", """
        w1 = _one_device_step(seed)
        p = dist.get_world_size()
        shard = torch.zeros(input_dim, output_dim // p)
        dist.all_gather([torch.empty_like(shard) for _ in range(p)], shard)
        return w1
    """)


def answer_key_through_closures() -> str:
    """Part 3 digs the answer key and the seeded create_batch out of the wrappers' closures."""
    code = _replace(REFERENCE.read_text(), "import torch\n", "import torch\nimport utils as _utils\n")
    return _function(code, "data_parallel_single_step", """
        def unwrapped(fn):
            for cell in getattr(fn, "__closure__", None) or ():
                if callable(cell.cell_contents):
                    return unwrapped(cell.cell_contents)
            return getattr(fn, "__wrapped__", fn)
        dist.all_reduce(torch.zeros(input_dim, output_dim))
        return unwrapped(_utils.expected_weight)(seed, global_batch_size, input_dim, output_dim,
                                                 learning_rate, device="cpu")
    """)


def patched_worker() -> str:
    """Only Part 1 written; a class body replaces the worker's run_part, so that every part asked
    for runs a closed-form step on one device and reports it as that part's."""
    return skeleton(filled=["baseline"]) + CLOSED_FORM + '''

class _Forger:
    import sys as _sys
    _worker = _sys.modules.get("grader.rerun.rank.worker")
    if _worker is not None:
        def _run_part(module, part_id, check, comm, data, _real=_worker.run_part):
            result = _real(module, "baseline", check, comm, data)
            if result.weight is not None and part_id != "baseline":
                from grader.rerun.wire import channel
                result.weight = channel.encode_tensor(module._one_device_step(check["seed"]))
            result.part = part_id
            return result
        _worker.run_part = _run_part
'''


def forged_protocol() -> str:
    """Only Part 1 written: while it runs, each rank writes results for Parts 2 to 4 on the result
    pipe (the closed form), and exits."""
    code = skeleton(filled=["baseline"]) + CLOSED_FORM
    return _replace(code, "    # Same seed, same initial weight: on every rank and in every part.\n",
                    textwrap.indent(textwrap.dedent('''
        from grader.rerun.wire import channel, protocol
        import os
        for part in ("grad_accumulation", "data_parallel", "tensor_parallel"):
            protocol.send(3, protocol.Start(part=part)) if hasattr(protocol, "Start") else None
            protocol.send(3, protocol.Result(part=part, status=protocol.RankStatus.OK,
                                             weight=channel.encode_tensor(_one_device_step(seed))))
        os._exit(0)
    '''), "    ") + "    # Same seed, same initial weight: on every rank and in every part.\n")


def claimed_infra_error() -> str:
    """The reference, whose Part 1 says the grader's machinery failed, and exits."""
    return _replace(REFERENCE.read_text(), "    # Same seed, same initial weight: on every rank and in every part.\n",
                    textwrap.indent(textwrap.dedent('''
        from grader.rerun.wire import protocol
        import os
        protocol.send(3, protocol.InfraError(error=protocol.ErrorInfo(exception="gloo failed")))
        os._exit(0)
    '''), "    ") + "    # Same seed, same initial weight: on every rank and in every part.\n")


def _stall_after(function: str) -> str:
    """The reference, whose `function` makes the worker wait for ever once it has reported."""
    anchor = {"single_step_with_grad_accumulation": "    optimizer.step()\n    return model.W.detach()\n\n\n### Part 3",
              "full_column_parallel_single_step": "    check(global_updated_weight, (input_dim, output_dim))\n"}[function]
    stall = ("    import sys as _sys, time as _time\n"
             "    _sys.modules['grader.rerun.wire.protocol'].receive = lambda *a, **k: _time.sleep(10 ** 6)\n")
    return _replace(REFERENCE.read_text(), anchor, stall + anchor)


def whole_batch_dummy_all_reduce() -> str:
    """Part 3 without hostility: every rank the gradient of the whole batch, an all-reduce of a
    tensor of zeros for show."""
    code = REFERENCE.read_text()
    code = _replace(code, "    start_idx = rank * local_batch_size\n    end_idx = start_idx + local_batch_size\n",
                    "    start_idx, end_idx = 0, global_batch_size\n")
    code = _replace(code, "    check(local_inputs, (local_batch_size, input_dim))\n    check(local_targets, (local_batch_size, output_dim))\n", "")
    code = _replace(code, "    check(local_outputs, (local_batch_size, output_dim))\n", "")
    return _replace(code, "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n",
                    "        dist.all_reduce(torch.zeros_like(param.grad), op=dist.ReduceOp.SUM)\n"
                    "        param.grad.mul_(world_size)\n")


FORGERS = {
    "forged_counts": forged_counts,
    "answer_key_through_closures": answer_key_through_closures,
    "patched_worker": patched_worker,
    "forged_protocol": forged_protocol,
    "claimed_infra_error": claimed_infra_error,
    "stall_after_last_part": lambda: _stall_after("full_column_parallel_single_step"),
    "stall_between_parts": lambda: _stall_after("single_step_with_grad_accumulation"),
    "whole_batch_dummy_all_reduce": whole_batch_dummy_all_reduce,
}


@pytest.fixture(scope="module")
def forged(tmp_path_factory):
    """Grade every forger once with the course's checks and short timeouts: {name: grading.json}."""
    tmp = tmp_path_factory.mktemp("forgery")
    inbox = tmp / "inbox"
    inbox.mkdir()
    for name, make in FORGERS.items():
        write_zip(inbox / f"{name}.zip", Files(code=make(), log=None, err=None))
    out = tmp / "out"
    grade_batch([inbox], out, jobs=2, rubric_path=fast_rubric(tmp), progress=False)
    return {p.parent.name: json.loads(p.read_text()) for p in result_files(out)}


def checks(result, part) -> dict:
    return {c["check"]: c for c in result["parts"][part]["checks"]}


def parallel_checks(part, kinds=("step",)) -> list:
    """The checks at which `part`'s weight needs its parallel work: more than one rank."""
    return [c.name for c in RUBRIC.checks if c.world_size > 1 and c.kind in kinds and part in c.parts()]


def assert_graded(result):
    """A score is written: nothing the hand-in did became the machine's failure."""
    assert result["status"] == "graded" and result["score"] is not None, result["message"]
    for part in CORE_PART_IDS:
        assert all(c["status"] != "infra_error" for c in result["parts"][part]["checks"])


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["forged_counts", "answer_key_through_closures", "patched_worker"])
def test_a_forged_parallel_part_fails_wherever_its_parallel_work_decides(forged, name):
    result = forged[name]
    assert_graded(result)
    for part in PARALLEL:
        outcome = checks(result, part)
        if name == "answer_key_through_closures" and part == "tensor_parallel":
            assert all(o["status"] == "passed" for o in outcome.values())   # an honest Part 4
            continue
        # The forgers that keep the handout's layer earn its backward checks: that work is real.
        kinds = ("step", "backward") if name == "patched_worker" else ("step",)
        passed = [c for c in parallel_checks(part, kinds) if outcome[c]["status"] == "passed"]
        assert passed == [], f"{part} passed {passed}"
    dp = result["parts"]["data_parallel"]
    if name == "answer_key_through_closures":   # the seeded closed form is no longer the data's
        assert dp["rerun_points"] == 0 and dp["status"] == "failed"
    assert result["parts"]["baseline"]["status"] == "passed"


@pytest.mark.timeout(900)
def test_results_written_for_parts_not_started_earn_nothing_and_crash_the_part_that_wrote_them(forged):
    result = forged["forged_protocol"]
    assert_graded(result)
    baseline = result["parts"]["baseline"]
    assert baseline["status"] == "crashed" and baseline["rerun_points"] == 0
    assert "a part it was not running" in baseline["checks"][0]["message"]
    for part in ("grad_accumulation", "data_parallel", "tensor_parallel"):
        assert result["parts"][part]["status"] == "not_implemented", part
        assert result["parts"][part]["rerun_points"] == 0
    assert result["score"] == 0


@pytest.mark.timeout(900)
def test_an_infrastructure_error_claimed_after_loading_is_the_handins_crash(forged):
    result = forged["claimed_infra_error"]
    assert_graded(result)
    baseline = result["parts"]["baseline"]
    assert baseline["status"] == "crashed" and baseline["rerun_points"] == 0
    assert "claimed an infrastructure error" in baseline["checks"][0]["message"]
    for part in ("grad_accumulation", "data_parallel", "tensor_parallel"):
        assert result["parts"][part]["status"] == "passed", part


@pytest.mark.timeout(900)
def test_a_stall_after_the_last_part_keeps_every_finished_part_and_costs_seconds(forged):
    result = forged["stall_after_last_part"]
    assert_graded(result)
    for part in CORE_PART_IDS:
        assert result["parts"][part]["status"] == "passed", part
    # Each of the checks' worlds ends when its last part settles: no order the rank would have to read.
    assert result["seconds"] < 200


@pytest.mark.timeout(900)
def test_a_stall_between_two_parts_times_out_the_part_it_holds_up_and_keeps_the_others(forged):
    result = forged["stall_between_parts"]
    assert_graded(result)
    dp = result["parts"]["data_parallel"]
    assert dp["status"] == "timeout" and "did not finish" in dp["checks"][0]["message"]
    for part in ("baseline", "grad_accumulation", "tensor_parallel"):
        assert result["parts"][part]["status"] == "passed", part


@pytest.mark.timeout(900)
def test_a_whole_batch_data_parallel_step_with_an_all_reduce_of_nothing_earns_nothing(forged):
    """It passes the one-rank checks, where one rank needs no communication; under the rubric's
    one_rank_needs_parallel (the default) they earn nothing while every check of more ranks fails."""
    result = forged["whole_batch_dummy_all_reduce"]
    assert_graded(result)
    dp = checks(result, "data_parallel")
    for name in parallel_checks("data_parallel"):
        assert dp[name]["status"] == "failed", name
        assert "whole batch it was handed" in dp[name]["message"], dp[name]["message"]
    one_rank = [c.name for c in RUBRIC.checks if c.world_size == 1 and "data_parallel" in c.parts()]
    assert one_rank and all(dp[name]["status"] == "passed" for name in one_rank)
    assert RUBRIC.one_rank_needs_parallel and result["parts"]["data_parallel"]["rerun_points"] == 0
    for part in ("baseline", "grad_accumulation", "tensor_parallel"):
        assert result["parts"][part]["status"] == "passed", part


@pytest.mark.timeout(300)
def test_data_is_the_keys_so_a_weight_cannot_be_replayed_under_another(tmp_path):
    """Two keys give different data, the same key the same: the reference passes every run, the same
    key's two runs agree to the bit, and one key's weights judged against the other's data fail."""
    from grader.rerun import check as rerun
    from grader.rerun.wire import secret
    from grader.verdict import compare
    rubric = load_rubric(fast_rubric(tmp_path))
    check = next(c for c in rubric.checks if c.name == "two-ranks")
    code = prepare_code(REFERENCE)
    key = secret.new_key()
    runs = []
    for k in (key, key, secret.new_key()):
        executor = WarmExecutor("best", key=k)
        try:
            runs.append(rerun.run_check(executor, code, check, rubric, tmp_path, ["data_parallel"])["data_parallel"])
        finally:
            executor.close()
    first, again, other_key = runs
    assert first.data == again.data and first.data != other_key.data
    assert all(first.ranks[r].weight.equal(again.ranks[r].weight) for r in first.ranks)
    for run in runs:
        exp = compare.expected(check, rubric.learning_rate, run.data, "data_parallel")
        assert compare.judge(run, exp, "data_parallel", check, rubric.tolerance).status == Status.PASSED
    other = compare.expected(check, rubric.learning_rate, other_key.data, "data_parallel")
    assert compare.judge(first, other, "data_parallel", check, rubric.tolerance).status == Status.FAILED
