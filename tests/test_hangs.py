"""A hang costs about one clock, and a correct hand-in is never called hung, even on a loaded machine.

The part clock of a batch comes from the reference's time at each check (grader.limits.part_clock,
measured by the canary), never below PART_FLOOR_SECONDS; a part past its clock whose ranks had the
CPU hung and is not run again, there or at the later checks (grader.pipeline.grade); one whose
world was kept from the CPU runs again on the rubric's clock (grader.rerun.starved)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader.batch import progress
from grader.batch.progress import Progress, eta
from grader.batch.run import grade_batch
from grader.intake.handin import Handin
from grader.limits import PART_FACTOR, PART_FLOOR_SECONDS, part_clock
from grader.pipeline.grade import grade_handin
from grader.rerun.check import prepare_code
from grader.rerun.executor import WarmExecutor
from grader.results import Status, read_canary
from grader.rubric import load_rubric
from tests.corpus import REFERENCE, Files, write_zip

pytestmark = pytest.mark.scale   # make test-scale runs these; make test leaves them out

# Part 2's loop over micro-batches, made one that never ends (the issue's Canvas batch had one).
ACC_FOREVER = ("    for i in range(accumulation_steps):\n", "    for i in iter(int, 1):   # never ends\n")


def acc_forever() -> str:
    text = REFERENCE.read_text()
    assert text.count(ACC_FOREVER[0]) == 1
    return text.replace(*ACC_FOREVER)


def test_the_part_clock_is_a_multiple_of_the_reference_between_the_floor_and_the_rubric():
    assert part_clock(0.01, 20) == PART_FLOOR_SECONDS            # a fast machine: the floor
    assert part_clock(1.0, 20) == PART_FACTOR * 1.0              # a slow one: the factor
    assert part_clock(100.0, 20) == 20                           # never past the rubric's timeouts.part
    assert part_clock(0.01, 1) == 1                              # nor when the rubric's is below the floor


def busy_loops(per_core: int = 2, total: int = None) -> list:
    """`per_core` processes spinning on every core this process may use (or `total` of them): a machine
    whose cores are all busy. Each in a session of its own, as other users' programs are: where the
    kernel shares the CPU between sessions (autogroup), loops in one session would take no more than
    one session's share."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(total or per_core * len(os.sched_getaffinity(0)))]


@pytest.mark.timeout(600)
def test_a_correct_handin_is_never_called_hung_while_every_core_is_busy(tmp_path):
    """The reference at every check of the stock rubric, each part on the floor's clock (as if the
    canary had timed an idle machine), while two busy loops per core run beside it: every part passes."""
    rubric = load_rubric()
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "assignment4.py").write_text(REFERENCE.read_text())
    handin = Handin(name="ref", student="ref", sha256="", folder=tmp_path / "files")
    executor = WarmExecutor("auto", rubric.limits)
    executor.start()   # the zygote imports torch before the load starts: the load is the parts'
    spinning = busy_loops()
    try:
        result = grade_handin(handin, rubric, executor, tmp_path, clocks={c.name: PART_FLOOR_SECONDS
                                                                          for c in rubric.checks})
    finally:
        for p in spinning:
            p.kill()
            p.wait()
        executor.close()
    outcomes = [(p, o.check, o.status, o.flaky) for p, part in result.parts.items() for o in part.checks]
    assert len(outcomes) >= len(rubric.checks)
    assert [o for o in outcomes if o[2] != Status.PASSED or o[3]] == [], outcomes


# Part 1 made a correct part that needs CPU_S seconds of CPU on every rank before its step.
BURNS = ("    # Same seed, same initial weight: on every rank and in every part.\n",
         "    __import__('a4_burn')\n    # Same seed, same initial weight: on every rank and in every part.\n")
# Four ranks of it take a quarter of the floor's clock on this machine alone; beside LOOPS busy
# loops they take twice the clock or more. Where the kernel shares the CPU per session (autogroup),
# the world's session gets CORES / (LOOPS + 1) of the cores, and so 8 loops a group of 4 cores are
# enough; per task, its 4 ranks get 4 x CORES / (LOOPS + 4), and 32 are needed. More than enough
# starves the world's leader too, and a world that outlasts its executor's patience reads as the
# machine's failure.
AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")
CORES = len(os.sched_getaffinity(0))
CPU_S = PART_FLOOR_SECONDS * min(4, CORES) / 16
LOOPS = (8 if AUTOGROUP.exists() and AUTOGROUP.read_text().strip() == "1" else 32) * CORES // min(4, CORES)


@pytest.mark.timeout(600)
def test_a_correct_part_kept_from_the_cpu_past_its_clock_runs_again_and_passes(tmp_path):
    """Part 1 burning CPU_S of CPU per rank (it fits its clock on this machine alone), on the floor's
    clock while LOOPS busy loops run beside it: the first world runs past the clock, its ranks having
    waited for the CPU; the part runs again (the loops gone) on the rubric's clock and passes, not flaky."""
    from grader.pipeline.grade import judge_check
    rubric = load_rubric()
    text = REFERENCE.read_text()
    assert text.count(BURNS[0]) == 1
    (tmp_path / "assignment4.py").write_text(text.replace(*BURNS))
    code = prepare_code(tmp_path / "assignment4.py")
    code["a4_burn.py"] = f"import time\nt = time.process_time()\nwhile time.process_time() - t < {CPU_S}:\n    pass\n"
    executor = WarmExecutor("auto", rubric.limits)
    reports, spinning, real = [], [], executor._run_world

    def run_world(job):
        reports.append(real(job))
        for p in spinning:   # the loaded world is over: the part's second run finds the machine idle again
            p.kill()
            p.wait()
        spinning.clear()
        return reports[-1]

    executor._run_world = run_world
    try:
        alone = judge_check(executor, code, rubric.default_check, rubric, tmp_path, parts=["baseline"],
                            clock=PART_FLOOR_SECONDS)
        alone_worlds = len(reports)
        spinning += busy_loops(total=LOOPS)
        loaded = judge_check(executor, code, rubric.default_check, rubric, tmp_path, parts=["baseline"],
                             clock=PART_FLOOR_SECONDS)
    finally:
        for p in spinning:
            p.kill()
            p.wait()
        executor.close()
    assert alone["baseline"].status == Status.PASSED and alone_worlds == 1, alone
    first, again = reports[alone_worlds:]
    assert first.abort is not None and first.abort.reason.value == "timeout", first.abort
    assert first.abort.cpu is not None and first.abort.cpu.wait >= PART_FLOOR_SECONDS / 4, first.abort.cpu
    assert again.abort is None
    assert loaded["baseline"].status == Status.PASSED and not loaded["baseline"].flaky, loaded


@pytest.mark.timeout(600)
def test_a_hang_costs_one_clock_not_one_per_check(tmp_path):
    """A batch of the reference and a hand-in whose Part 2 loops forever, on the stock rubric: the
    canary's clocks lie between the floor and the rubric's; the loop times out at the first check,
    once (its ranks had the CPU), and is not run at the later ones; its other parts pass
    everywhere; and it costs the correct hand-in's time and about one clock, not one per check."""
    box = tmp_path / "inbox"
    box.mkdir()
    write_zip(box / "correct.zip", Files(code=REFERENCE.read_text()))
    write_zip(box / "loops.zip", Files(code=acc_forever()))
    rubric = load_rubric()
    started = time.monotonic()
    grade_batch([box], tmp_path / "out", jobs=1, progress=False)
    batch = time.monotonic() - started
    clocks = read_canary(tmp_path / "out").clocks
    assert set(clocks) == {c.name for c in rubric.checks}
    assert all(PART_FLOOR_SECONDS <= s <= rubric.timeouts.part for s in clocks.values()), clocks
    result = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "out").glob("students/*/grading.json")}
    correct, loops = result["correct"], result["loops"]
    acc = loops["parts"]["grad_accumulation"]["checks"]
    steps = [c for c in rubric.checks if "grad_accumulation" in rubric.parts_at(c)]
    assert [o["check"] for o in acc] == [c.name for c in steps] and all(o["status"] == "timeout" for o in acc)
    assert f"still running after {clocks[steps[0].name]:g} s" in acc[0]["error"] + acc[0]["message"], acc[0]
    if clocks[steps[0].name] < rubric.timeouts.part:   # a clock the canary measured says so
        assert f"the part's clock here was {clocks[steps[0].name]:g} s" in acc[0]["message"], acc[0]
    assert "its ranks ran" in acc[0]["error"] + acc[0]["message"], acc[0]   # what they had of the CPU
    assert all(o["message"].startswith("not run: this part hung at check") for o in acc[1:]), acc[1:]
    assert all(o["status"] == "passed" for p, part in loops["parts"].items() if p != "grad_accumulation"
               for o in part["checks"])
    assert all(part["status"] == "passed" for part in correct["parts"].values())
    # The first check's clock, once, and a world to start again for the parts after the hung one.
    assert loops["seconds"] < correct["seconds"] * 2 + 1.5 * clocks[steps[0].name] + 2, (loops["seconds"], correct)
    assert batch < 300


def test_the_eta_grows_while_a_handin_is_slow_and_the_line_names_it():
    assert eta([2, 2, 2], [], 10, 1) == 20 and eta([2, 2, 2], [], 10, 2) == 10
    assert eta([2, 2, 2], [1], 9, 1) == 1 + 9 * 2   # a hand-in half done: its other half, then the rest
    naive = eta([2, 2, 2], [], 10, 1)
    said = [eta([2, 2, 2], [e], 9, 1) for e in (5, 20, 40, 80)]
    assert said == sorted(said) and said[0] > naive and said[-1] > 80 / 4 * 10 / 2   # it grows with the slow one
    bar = Progress(total=5, enabled=False)
    now = time.monotonic()
    bar.done, bar.durations, bar.last = 2, [2.0, 2.0], "b: graded, 100/100"
    bar.running = {"ana": now - 40, "zed": now - 1}
    line = bar.line(now)
    assert "2/5" in line and "ana still grading, 40 s so far" in line and "zed" not in line, line


def test_the_line_is_written_again_while_a_handin_is_slow(monkeypatch, capsys):
    monkeypatch.setattr(progress, "TICK", {True: 0.05, False: 0.05})
    monkeypatch.setattr(progress, "SLOW_SECONDS", 0.1)
    bar = Progress(total=3, enabled=True)
    try:
        bar.begin("fast")
        bar.step("fast", "graded, 100/100")
        bar.begin("hangs")
        time.sleep(1.0)
    finally:
        bar.close()
    lines = [line for line in capsys.readouterr().err.splitlines() if "hangs still grading" in line]
    assert len(lines) >= 3, lines
    lefts = [float(line.split("about ")[1].split(" s left")[0]) for line in lines]
    assert lefts == sorted(lefts) and lefts[-1] > lefts[0], lines


DP_ALL_REDUCE = "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n"


def _worlds_of(code_text: str, tmp_path, clock: float) -> tuple:
    """Parts 3 and 4 of `code_text` run at the default check on a part clock of `clock` seconds:
    (part -> PartRun, the reports of the worlds it took)."""
    import dataclasses
    from grader.rerun.check import run_check
    rubric = load_rubric()
    rubric = dataclasses.replace(rubric, timeouts=dataclasses.replace(rubric.timeouts, part=clock))
    (tmp_path / "assignment4.py").write_text(code_text)
    executor = WarmExecutor("auto", rubric.limits)
    reports, real = [], executor.run_world
    executor.run_world = lambda job: reports.append(real(job)) or reports[-1]
    try:
        runs = run_check(executor, prepare_code(tmp_path / "assignment4.py"), rubric.default_check, rubric,
                         tmp_path, parts=["data_parallel", "tensor_parallel"])
    finally:
        executor.close()
    return runs, reports


@pytest.mark.timeout(300)
def test_a_crash_on_one_rank_ends_its_world_long_before_the_clock_and_reads_as_the_crash(tmp_path):
    """Rank 1 raises before Part 3's all-reduce; the others wait for it there. The world ends a tenth
    of the clock after rank 1 reported (not at the clock: the others could only have waited), and
    the part crashed, naming the rank and what it raised, never a hang."""
    from grader.rerun.wire.protocol import StopReason
    text = REFERENCE.read_text()
    assert text.count(DP_ALL_REDUCE) == 1
    code = text.replace(DP_ALL_REDUCE, "        if dist.get_rank() == 1:\n            raise RuntimeError('rank 1 "
                                       "lost its way')\n" + DP_ALL_REDUCE)
    runs, reports = _worlds_of(code, tmp_path, clock=30.0)
    assert reports[0].abort.reason == StopReason.RANK_FAILED and reports[0].abort.part == "data_parallel"
    assert reports[0].seconds < 15, reports[0].seconds   # 3 s after the crash, far from the 30 s clock
    assert runs["data_parallel"].status == Status.CRASHED
    assert runs["data_parallel"].detail.startswith("rank 1 raised RuntimeError: rank 1 lost its way"), runs
    assert runs["tensor_parallel"].status == Status.PASSED and len(reports) == 2


@pytest.mark.timeout(300)
def test_a_part_every_rank_raises_in_settles_as_crashed_and_the_world_goes_on(tmp_path):
    """Every rank raises where Part 3 all-reduces: they all report within the tenth of the clock,
    the part settles as crashed on every rank, and Part 4 runs in the same world."""
    text = REFERENCE.read_text()
    runs, reports = _worlds_of(text.replace(DP_ALL_REDUCE, "        raise RuntimeError('every rank')\n"),
                               tmp_path, clock=30.0)
    assert len(reports) == 1 and reports[0].abort is None, reports[0].abort
    assert runs["data_parallel"].status == Status.CRASHED and runs["data_parallel"].detail == ""
    assert {r.status for r in runs["data_parallel"].ranks.values()} == {"crashed"} and len(runs["data_parallel"].ranks) == 4
    assert runs["tensor_parallel"].status == Status.PASSED
