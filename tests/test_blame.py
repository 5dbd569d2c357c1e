"""A failure is named by its real cause, whatever the hand-in writes, and costs only the part it hit.

What a rank says of its own failure (an exception's text, what it prints) is the hand-in's to
write: a crash that says "timed out" is still a crash, unless the rank waited the process group's
timeout out; one that prints "MemoryError" is not out of memory; an exception whose text cannot
even be read is a crash; a frame nested past the parser's stack is the hand-in's malformed message,
never the machine's failure. And a rank that dies in one part costs that part alone: the parts the
other ranks were still running run again. Real gloo worlds of one warm executor, at a 2-rank step.
"""

import dataclasses

import pytest

from grader.rerun.check import prepare_code, run_check
from grader.rerun.executor import WarmExecutor
from grader.results import Status
from grader.rubric import load_rubric
from tests.corpus import REFERENCE, fast_rubric

PARTS = ["baseline", "grad_accumulation", "data_parallel"]


@pytest.fixture(scope="module")
def step_check(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("blame")
    rubric = load_rubric(fast_rubric(tmp))
    step = dataclasses.replace(next(c for c in rubric.checks if c.name == "default"), world_size=2)
    executor = WarmExecutor("best", rubric.limits)
    executor.start()
    yield executor, rubric, step, tmp
    executor.close()


def _runs(step_check, name: str, appended: str) -> dict:
    executor, rubric, check, tmp = step_check
    path = tmp / f"{name}.py"
    path.write_text(REFERENCE.read_text() + appended)
    return run_check(executor, prepare_code(path), check, rubric, tmp, PARTS)


# Part 3 replaced by `body` (its first statement), the reference's after it.
IN_PART_3 = '''

import os as _os, struct as _struct, sys as _sys
_data_parallel = data_parallel_single_step


def data_parallel_single_step(seed=42, device=None):
{body}
    return _data_parallel(seed=seed, device=device)
'''
SAYS = {
    "says_timed_out": ("    raise RuntimeError('[gloo/transport] Timed out waiting 30000ms for recv operation')",
                       Status.CRASHED, "Timed out waiting"),
    "unreadable_text": ("    class _Unreadable(RuntimeError):\n        def __str__(self):\n            raise ValueError('no')\n"
                        "    raise _Unreadable()", Status.CRASHED, "_Unreadable"),
    "prints_memory_error": ("    _sys.stderr.write('MemoryError: std::allocate memory\\n')\n    _sys.stderr.flush()\n"
                            "    _os._exit(1)", Status.CRASHED, "exited before it finished"),
    # A tensor of a billion values that holds one (expanded): the recorder reads no further into what
    # a rank hands than its budget (a copy of it whole would be 4 GB of the rank's memory), so what
    # the part meets is gloo's own failure on it (raised, or its rank aborted), never out of memory.
    "expanded_tensor": ("    dist.all_reduce(torch.zeros(1).expand(10 ** 9))", Status.CRASHED, ""),
    "deep_frame": ("    body = ('{\"type\":\"result\",\"x\":' + '[' * 200000 + ']' * 200000 + '}').encode()\n"
                   "    _os.write(3, _struct.pack('>I', len(body)) + body)", Status.CRASHED, "malformed"),
}


@pytest.mark.parametrize("name", sorted(SAYS))
def test_what_a_rank_says_of_its_failure_does_not_name_its_cause(step_check, name):
    body, status, words = SAYS[name]
    runs = _runs(step_check, name, IN_PART_3.format(body=body))
    assert runs["baseline"].status == Status.PASSED and runs["grad_accumulation"].status == Status.PASSED, \
        {p: r.detail for p, r in runs.items()}
    part = runs["data_parallel"]
    assert part.status == status and words in part.detail + part.output + str(
        [r.exception for r in part.ranks.values()]), (part.status, part.detail)


def test_a_rank_that_dies_ahead_of_the_others_costs_only_the_part_it_died_in(step_check):
    """Rank 1 is still in Part 2 (it slept) when rank 0 dies in Part 3: Part 2 is run again, and
    passes; Part 3 crashed."""
    behind = '''

import os as _os, time as _time
_grad_accumulation, _data_parallel = single_step_with_grad_accumulation, data_parallel_single_step


def single_step_with_grad_accumulation(seed=42, device=None, accumulation_steps=4):
    if dist.get_rank() == 1:
        _time.sleep(0.8)
    return _grad_accumulation(seed=seed, device=device, accumulation_steps=accumulation_steps)


def data_parallel_single_step(seed=42, device=None):
    if dist.get_rank() == 0:
        _os._exit(1)
    return _data_parallel(seed=seed, device=device)
'''
    runs = _runs(step_check, "behind", behind)
    assert runs["grad_accumulation"].status == Status.PASSED, runs["grad_accumulation"].detail
    assert runs["data_parallel"].status == Status.CRASHED and "rank 0 exited" in runs["data_parallel"].detail, \
        runs["data_parallel"].detail


def test_a_handin_that_sleeps_as_it_loads_in_every_world_stops_at_its_own_time(tmp_path):
    """Each world of it waits 5 s for its load: the hand-in's 6 s (timeouts.handin) end inside its
    first check, and no world of it starts or waits past them (a check of several worlds once ran on
    to its end, 47% past the hand-in's time; an array task is sized on that time)."""
    import time

    from grader.intake.handin import Handin
    from grader.pipeline.grade import grade_handin
    rubric = load_rubric(fast_rubric(tmp_path, timeouts={"handin": 6, "world_start": 30, "part": 20, "process_group": 10}))
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "assignment4.py").write_text(REFERENCE.read_text() + "\n__import__('time').sleep(5)\n")
    executor = WarmExecutor("best", rubric.limits)
    executor.start()
    try:
        started = time.monotonic()
        result = grade_handin(Handin(name="slow", student="slow", sha256="", folder=tmp_path / "files"), rubric,
                              executor, tmp_path)
        took = time.monotonic() - started
    finally:
        executor.close()
    said = [o.message for p in result.parts.values() for o in p.checks]
    assert any("6 s were used up" in m for m in said), said
    assert took < 6 + 3, took   # its 6 s, the world ended at them, and the grader's own work


def test_a_world_whose_leader_cannot_read_its_job_is_the_machinerys_failure(step_check):
    """A job the world's leader cannot decode (a check value of a type the protocol does not carry)
    is the grader's own failure: infra_error, run again, never a part charged to the hand-in."""
    from grader.rerun.check import _world_job
    from grader.rerun.wire.protocol import StopReason
    executor, rubric, check, tmp = step_check
    job = _world_job(prepare_code(REFERENCE), tmp, check, rubric, ["baseline"])
    job.check["targets"] = {"not": "a scalar"}
    report = executor.run_world(job)
    assert report.abort is not None and report.abort.reason == StopReason.INFRA_ERROR, report.abort
    assert "exited with status 1" in report.abort.detail, report.abort.detail
