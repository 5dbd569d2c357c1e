"""What a world no longer pays for each time (docs/scale.md's per-world profile).

A hand-in's code, and the trusted utils.py beside it, are compiled once per executor, not once per
world (grader.rerun.compiled): the first world's leader compiles them and returns them, and each
later world of the same files loads them.
What a world shows of the code (its tracebacks' files and lines, the lines skipped) is the same
either way, and text that is not the hand-in's own compile is never run in its place. Seeding
in a rank seeds the CPU alone: no stack is captured for an accelerator a rank never sets up. And
the zygote keeps its memory in huge pages, so that a fork copies few page-table entries, while the
worlds forked from it give the same answers."""

import base64
import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grader.rerun import compiled
from grader.rerun.check import prepare_code, run_check
from grader.rerun.executor import WarmExecutor
from grader.rerun.rank import worker
from grader.rerun.rank.source import compile_assignment, compile_source, compiled_blob, from_blob
from grader.rerun.wire.protocol import WorldJob, WorldReport
from grader.rubric import load_rubric
from tests.corpus import REFERENCE, ROOT

RAISE = ('    """One SGD step where each rank computes the gradient of its own slice of the batch.\n',
         '    raise ValueError("boom")\n    """One SGD step where each rank computes the gradient of its own slice of the batch.\n')


def _job(code: dict, **kwargs) -> WorldJob:
    return WorldJob(work_dir="/nonexistent", code=code, store="", world_size=1, parts=[], check={}, pg_timeout=1.0,
                    limits={}, **kwargs)


@pytest.mark.timeout(300)
def test_a_later_world_loads_the_code_the_first_compiled_and_its_traceback_names_the_same_lines(tmp_path):
    source = REFERENCE.read_text()
    assert source.count(RAISE[0]) == 1
    path = tmp_path / "assignment4.py"
    path.write_text(source.replace(*RAISE) + "\nprint('the script runs')\n")
    code = prepare_code(path)
    rubric = load_rubric()
    executor = WarmExecutor("auto", rubric.limits)
    sent, returned = [], []
    real = executor._run_world

    def run_world(job):
        sent.append(job.compiled)
        report = real(job)
        returned.append(report.compiled)
        return report

    executor._run_world = run_world

    checks = []

    def check() -> dict:
        for _ in range(2):   # a world the machine failed (gloo's join) runs again once, as grading does
            checks.append(run_check(executor, code, rubric.default_check, rubric, tmp_path,
                                    parts=["data_parallel", "baseline"]))
            if checks[-1]["baseline"].status.value != "infra_error":
                return checks[-1]
        return checks[-1]

    try:
        runs = [check() for _ in range(2)]
    finally:
        executor.close()
    said = [(part, run[part].status.value, run[part].detail) for run in runs for part in run]
    assert [run[part].status.value for run in runs for part in ("data_parallel", "baseline")] == \
        ["crashed", "passed"] * 2, said
    # The first world that loaded the code compiled it and returned it; every later one was sent it
    # and returned nothing. A part that raises ends no world: one world a check.
    first = next(i for i, blob in enumerate(returned) if blob)
    assert not any(sent[:first + 1]) and all(blob == returned[first] for blob in sent[first + 1:]), said
    assert not any(returned[first + 1:]) and len(sent) == len(checks), said
    tracebacks = [run["data_parallel"].ranks[0].traceback for run in runs]
    line = source.replace(*RAISE).splitlines().index('    raise ValueError("boom")') + 1
    assert tracebacks[0] == tracebacks[1] and f'File "assignment4.py", line {line}, in data_parallel_single_step' \
        in tracebacks[1], tracebacks


def _files(code) -> list:
    """The file name of `code` and of every code object inside it."""
    return [code.co_filename] + [name for const in code.co_consts if hasattr(const, "co_filename")
                                 for name in _files(const)]


def test_the_loaded_code_is_the_compiled_code_under_this_worlds_file_name(tmp_path):
    first, later = tmp_path / "one" / "assignment4.py", tmp_path / "two" / "assignment4.py"
    for path in (first, later):
        path.parent.mkdir()
        path.write_text(REFERENCE.read_text() + "\nprint('the script runs')\n")
        (path.parent / "utils.py").write_text((ROOT / "assignment_4" / "utils.py").read_text())
    code, skipped = compile_assignment(str(first))
    utils = compile_source(str(first.parent / "utils.py"))
    loaded, loaded_skipped, loaded_utils = from_blob(compiled_blob(code, skipped, utils), str(later),
                                                     str(later.parent / "utils.py"))
    assert loaded_skipped == skipped and skipped
    assert len(_files(loaded)) > 20 and set(_files(loaded)) == {str(later)}
    assert len(_files(loaded_utils)) > 5 and set(_files(loaded_utils)) == {str(later.parent / "utils.py")}
    assert loaded.co_code == code.co_code and loaded_utils.co_code == utils.co_code


def test_text_that_is_not_compiled_code_is_never_run_and_the_code_is_compiled_again(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "utils", sys.modules.get("utils"))   # prepare loads one: this test's own
    (tmp_path / "assignment4.py").write_text("def baseline():\n    return 1\nprint('script')\n")
    (tmp_path / "utils.py").write_text("def create_batch():\n    return 2\n")
    x = compile("x = 1", "a", "exec")
    for blob in ("not base64!", base64.b64encode(b"\x00garbage").decode(),
                 base64.b64encode(marshal.dumps(("print('not the code')", [], x))).decode(),
                 base64.b64encode(marshal.dumps((x, ["a"], x))).decode(),
                 base64.b64encode(marshal.dumps((x, 5, x))).decode(),
                 base64.b64encode(marshal.dumps((x, [], "print('not utils')"))).decode(),
                 base64.b64encode(marshal.dumps((x, []))).decode(),
                 base64.b64encode(marshal.dumps(7)).decode()):
        with pytest.raises(ValueError):
            from_blob(blob, "assignment4.py", "utils.py")
        prepared = worker.prepare(_job({}, code_dir=str(tmp_path), compiled=blob))
        assert prepared["skipped"] == [3] and "baseline" in prepared["code"].co_names
        assert "create_batch" in prepared["utils"].co_names and sys.modules["utils"].create_batch() == 2
    assert worker.prepare(_job({}, code_dir=str(tmp_path)))["skipped"] == [3]


def test_another_hand_ins_files_never_get_this_ones_compiled_code():
    kept = compiled.Compiled()
    mine, theirs = {"assignment4.py": "x = 1\n", "utils.py": "u"}, {"assignment4.py": "x = 2\n", "utils.py": "u"}
    job, key = kept.with_compiled(_job(mine))
    assert job.compiled == ""
    report = kept.keep(key, WorldReport(compiled="MINE"))
    assert report.compiled == ""   # the grader hands on a report without it
    assert kept.with_compiled(_job(mine))[0].compiled == "MINE"
    assert kept.with_compiled(_job(theirs))[0].compiled == ""
    assert kept.with_compiled(_job({**mine, "utils.py": "v"}))[0].compiled == ""   # any file differs: compiled again
    for i in range(compiled.KEPT):   # the oldest is let go
        kept.keep(kept.with_compiled(_job({"assignment4.py": str(i)}))[1], WorldReport(compiled=str(i)))
    assert kept.with_compiled(_job(mine))[0].compiled == ""


def test_seeding_in_a_rank_seeds_the_cpu_and_queues_nothing_for_an_accelerator():
    """torch.manual_seed queues the seed for each accelerator not set up, capturing the stack as text
    each time; in a rank (which never sets one up) the CPU generator is seeded and nothing is queued."""
    script = ("import torch\n"
              "from grader.rerun.rank.hooks import disarm_cuda_calls\n"
              "disarm_cuda_calls()\n"
              "torch.manual_seed(7); a = torch.randn(3)\n"
              "torch.manual_seed(7); b = torch.randn(3)\n"
              "torch.cuda.manual_seed_all(7); torch.cuda.manual_seed(7)\n"
              "import torch.cuda as c\n"
              "queued = c._lazy_seed_tracker.get_calls() if hasattr(c, '_lazy_seed_tracker') else c._queued_calls\n"
              "print(torch.equal(a, b), torch.initial_seed(), len([q for q in queued if q]))\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.split() == ["True", "7", "0"], out.stderr


def _read(path: str) -> bytes:
    """What a /proc file says (b"" once its process is gone)."""
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""


def _below(pid: int) -> list:
    """The processes below `pid`, from /proc."""
    parent_of = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                parent_of[int(name)] = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    found, todo = [], [pid]
    while todo:
        below = todo.pop()
        children = [p for p, parent in parent_of.items() if parent == below]
        found += children
        todo += children
    return found


def _anonymous_kb(pid: int) -> tuple:
    """(anonymous, of it in huge pages) of `pid`, in kB, from its smaps_rollup."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return int(fields["Anonymous"].split()[0]), int(fields["AnonHugePages"].split()[0])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["auto", "off"])
def test_the_zygote_keeps_its_memory_in_huge_pages_and_its_worlds_answer_the_same(mode):
    """Where the kernel folds memory (environment.huge_pages_refused says '' on Linux 6.1 and later,
    transparent huge pages not off), most of the zygote's memory is in 2 MB pages, with the sandbox
    and without; where it does not, none is, and nothing else changes. Either way, the reference
    passes every part of the default check, world after world."""
    from grader.rerun.sandbox import environment
    from grader.rerun.sandbox.namespaces import scratch_dir
    rubric = load_rubric()
    executor = WarmExecutor(mode, rubric.limits)
    executor.start()
    try:
        scratch = Path(scratch_dir("a4-huge-"))
        for world in range(3):
            runs = run_check(executor, prepare_code(REFERENCE), rubric.default_check, rubric, scratch,
                             rubric.parts_at(rubric.default_check))
            assert {part: run.status.value for part, run in runs.items()} == \
                dict.fromkeys(rubric.parts_at(rubric.default_check), "passed")
            if world == 0:   # the zygote is up (start returns before it is): measure it
                # This executor's zygote (another, launched ahead for a later batch, may be there too).
                mine = [executor._proc.pid] + _below(executor._proc.pid)
                named = [p for p in mine if _read(f"/proc/{p}/comm").startswith(b"python")
                         and b"grader.rerun.zygote" in _read(f"/proc/{p}/cmdline")]
                # The topmost: the last world's leader, its fork, may still be on its way out below it.
                zygotes = [p for p in named if all(p not in _below(q) for q in named if q != p)]
                assert len(zygotes) == 1, f"not one zygote below the executor: {zygotes} of {named}"
                anonymous, huge = _anonymous_kb(zygotes[0])
                if environment.huge_pages_refused():
                    assert huge == 0, (environment.huge_pages_refused(), anonymous, huge)
                else:
                    assert huge >= anonymous // 2, f"{huge} kB of the zygote's {anonymous} kB in huge pages"
    finally:
        executor.close()


# Each rank of the part starts a thread that reads whatever comes down the rank's data pipe (fd 4):
# any order after the part would be taken from the worker.
STEALS_ORDERS = ('def full_column_parallel_single_step(seed=42, device=None):\n',
                 'def full_column_parallel_single_step(seed=42, device=None):\n'
                 '    import os as _os, threading as _threading\n'
                 '    _threading.Thread(target=lambda: [_os.read(4, 1 << 16) for _ in iter(int, 1)], daemon=True).start()\n')


@pytest.mark.timeout(300)
def test_a_world_ends_when_its_last_part_is_settled_whatever_its_ranks_then_do(tmp_path):
    """Nothing is asked of a rank after its last result: its world ends, every rank at once, the
    moment every part is settled, so ranks that would never take another order (here a thread steals
    them) cost it no clock and its report no abort."""
    source = REFERENCE.read_text()
    assert source.count(STEALS_ORDERS[0]) == 1
    path = tmp_path / "assignment4.py"
    path.write_text(source.replace(*STEALS_ORDERS))
    rubric = load_rubric()
    executor = WarmExecutor("auto", rubric.limits)
    reports = []
    real = executor._run_world
    executor._run_world = lambda job: reports.append(real(job)) or reports[-1]
    try:
        runs = run_check(executor, prepare_code(path), rubric.default_check, rubric, tmp_path,
                         parts=["baseline", "tensor_parallel"])
    finally:
        executor.close()
    assert {part: run.status.value for part, run in runs.items()} == {"baseline": "passed", "tensor_parallel": "passed"}
    assert [(r.abort, r.completed) for r in reports] == [(None, ["baseline", "tensor_parallel"])]
    assert "done" in reports[0].timeline and reports[0].timeline["ended"] >= reports[0].timeline["done"]


@pytest.mark.timeout(300)
def test_a_world_of_no_parts_loads_the_code_and_then_ends(tmp_path):
    """Settled as soon as every rank loaded the code: code that loads ends its world whole, code
    that raises as it loads ends it at loading."""
    from grader.rerun.check import _world_job
    from grader.rerun.wire.protocol import StopReason
    rubric = load_rubric()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "assignment4.py").write_text("import a4_no_such_module\n" + REFERENCE.read_text())
    executor = WarmExecutor("auto", rubric.limits)
    try:
        reports = [executor.run_world(_world_job(prepare_code(path), tmp_path / f"world{i}", rubric.default_check,
                                                 rubric, []))
                   for i, path in enumerate((REFERENCE, broken / "assignment4.py"))]
    finally:
        executor.close()
    loaded, raised = reports
    assert loaded.abort is None and loaded.completed == [] and "ready" in loaded.timeline, loaded.abort
    assert raised.abort is not None and raised.abort.reason == StopReason.LOAD_FAILED, raised.abort
