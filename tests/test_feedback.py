"""What feedback says at hidden checks, which checks grading runs, the device a rank picks and how a
hang is told: hand-ins built for each, graded by the real grader in real gloo worlds.

- a shape bug at hidden sizes (Part 3's slice reshaped to the default check's, the handout's 32 x 64)
  and a hand-in that prints and raises its configuration (decimal, hex, a tensor's shape, a class and a frame made at
  run time, an exit code) leave no hidden value in any file a student or a gradebook reads, while
  the public checks keep the full text;
- a device picked by the global rank (cuda:{rank}) fails the four-node check only, naming LOCAL_RANK;
- a rank that skips a collective, or computes on while the others wait, gets a hang description
  naming ranks, op and the collective's number (op and number only at a hidden check);
- grading runs the public checks students' check runs, and both say the same of each.
"""

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest

from grader.batch.run import grade_batch
from grader.intake.handin import Handin
from grader.names import result_files, student_dir
from grader.pipeline.grade import judge_check
from grader.rerun.check import prepare_code, run_check
from grader.rerun.executors import make_executor
from grader.results import Status
from grader.rubric import Check, load_rubric, public_rubric
from grader.student.check import check_handin
from grader.verdict.say import numbers
from tests.corpus import REFERENCE, Files, fast_rubric, refingerprint, write_zip, zip_bytes

RUBRIC = load_rubric()
HIDDEN = [c for c in RUBRIC.checks if c.hidden]
PUBLIC = [c for c in RUBRIC.checks if not c.hidden]
REF = REFERENCE.read_text()

SLICE = "    local_inputs = full_inputs[start_idx:end_idx]\n"
# Part 3's slice reshaped to the default check's own shape (the handout's 32 x 64 in the stock course):
# right there, wrong at every other size.
ROWS, COLS = RUBRIC.default_check.global_batch_size // RUBRIC.default_check.world_size, RUBRIC.default_check.input_dim
SHAPED = SLICE.replace("]\n", f"].reshape({ROWS}, {COLS})\n")
ALL_REDUCE = "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n"
START = "    start_idx = rank * local_batch_size\n"

# Every value a part can read at a check, said every way a hand-in might: decimal, hex, a shape, a
# class and a frame made at run time (named and numbered after the values), printed and raised.
LEAK = '''

def _leak(part):
    import sys
    import torch
    values = [global_batch_size, input_dim, output_dim, accumulation_steps, seed, world_size, local_batch_size]
    said = (f"{part} {values} {[hex(v) for v in values]} {torch.empty(local_batch_size, input_dim).shape} "
            f"{local_batch_size * input_dim} {local_batch_size}x{input_dim} {list(torch.zeros(global_batch_size, input_dim).shape)}")
    print(said)
    print(said, file=sys.stderr)
    if part == "baseline":
        raise type(f"Leak{global_batch_size}x{input_dim}", (Exception,), {})(said)
    namespace = {}
    # past the end of any hand-in's file (files.max_code_lines), whatever a course's sizes
    code = "\\n" * (100000 + local_batch_size * input_dim) + "def single_step():\\n    raise ValueError(said)\\n"
    exec(compile(code, __file__, "exec"), {"said": said}, namespace)
    namespace["single_step"]()
'''


def _handin(code: str, reference_run) -> Files:
    log, err = reference_run
    return Files(code=code, log=refingerprint(log, code), err=err)


def hostile() -> str:
    code = REF + LEAK
    for function in ("def single_step(", "def data_parallel_single_step("):
        head, tail = code.split(function, 1)
        body = tail.split("\n", 1)
        # Right after the signature line (and its docstring, if any): call _leak first thing.
        code = head + function + body[0] + "\n    _leak(" + repr(function[4:-1]) + ")\n" + body[1]
    code = code.replace("_leak('single_step')", "_leak('baseline')")
    return code


def secrets() -> set:
    """A hidden check's values and what follows from them (products of sizes: 165 = 15 x 11), less
    what a public check states (those are not secret)."""
    def values(check):
        ws = check.world_size
        sizes = {check.global_batch_size, check.input_dim, check.output_dim, check.global_batch_size // ws,
                 check.global_batch_size // check.accumulation_steps, check.output_dim // ws}
        return numbers(check) | sizes | {a * b for a in sizes for b in sizes}
    shown = set().union(*(values(c) for c in PUBLIC))
    return set().union(*(values(c) for c in HIDDEN)) - shown


def leaked(text: str) -> list:
    """The hidden values `text` holds: hex of any, decimal of those of 3 digits or more (smaller ones
    are points, dates, ranks), and shapes of two of them. Line numbers of the hand-in's own files
    are allowed (the hand-in's layout, not the check's), and so are the course's totals (100 in the stock
    course), with and without its bonus."""
    found = []
    text = re.sub(r"(assignment4\.py|utils\.py):\d+|line \d+", "", text)
    totals = {round(RUBRIC.max_score), round(sum(p.log + p.rerun for p in RUBRIC.parts.values()))}
    for v in sorted(secrets() - totals):
        if v >= 10 and re.search(rf"0x0*{v:x}\b", text, re.IGNORECASE):
            found.append(hex(v))
        if v >= 100 and re.search(rf"(?<![\w.]){v}(?![\w%]|\.\d)", text):   # 100% is a pass rate
            found.append(v)
    for c in HIDDEN:
        local = c.global_batch_size // c.world_size
        for a, b in ((local, c.input_dim), (c.global_batch_size, c.input_dim), (local, c.output_dim)):
            if re.search(rf"[\[(]{a}, {b}[\])]|(?<!\d){a} ?x ?{b}(?!\d)", text):
                found.append(f"{a}x{b}")
    return found


def student_facing(grading: dict) -> str:
    """What of grading.json a student or a gradebook reads (the TA-only grader_error aside)."""
    said = [grading["message"], *grading["notes"]]
    for part in grading["parts"].values():
        said.append(part["message"])
        for o in part["checks"]:
            if o["hidden"]:
                said += [o["message"], o["diagnosis"], o["error"], o["traceback"], o.get("comm_message", ""),
                         json.dumps(o["collectives"])]
    return "\n".join(said)


# Part 3 raises an exception whose text holds lone surrogates (a JSON escape carries them through
# the grader's pipes) and a line of backticks, then what would be the feedback's own Markdown if it
# ended the traceback's fence.
ODD_TEXT = ("    raise RuntimeError('boom \\udc80 \\ud800' + chr(10) + '`' * 3 + chr(10) + '**Score: 100 / 100**'"
            " + chr(10) + '<img src=x onerror=alert(1)>' + chr(10) + '`' * 3)\n")


@pytest.fixture(scope="module")
def graded(reference_run, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("feedback")
    inbox = tmp / "inbox"
    inbox.mkdir()
    shape = REF.replace(SLICE, SHAPED)
    cuda = REF.replace(START, START + "    full_inputs = full_inputs.to(f'cuda:{dist.get_rank()}')\n")
    assert shape != REF and cuda != REF
    for name, code in (("shape_bug", shape), ("hostile", hostile()), ("cuda_rank", cuda)):
        write_zip(inbox / f"{name}.zip", _handin(code, reference_run))
    out = tmp / "out"
    grade_batch([inbox], out, jobs=2, rubric_path=fast_rubric(tmp), progress=False)
    results = {p.parent.name: json.loads(p.read_text()) for p in result_files(out)}
    return out, results, tmp


@pytest.mark.timeout(900)
def test_odd_text_in_a_name_or_an_exception_costs_no_page_and_breaks_no_fence(reference_run, tmp_path):
    """A file name with an undecodable byte (a download unpacked by a tool of another locale) and an
    exception with lone surrogates: the batch writes every page, the hand-in gets its result (the odd
    characters replaced), and the exception's backticks do not end the fence its traceback is in."""
    inbox, out = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    write_zip(inbox / os.fsdecode(b"odd_text_\xff.zip"), _handin(REF.replace(START, START + ODD_TEXT), reference_run))
    grade_batch([inbox], out, jobs=1, rubric_path=fast_rubric(tmp_path), progress=False)
    results = {p.parent.name: json.loads(p.read_text()) for p in result_files(out)}
    odd = next(key for key in results if key.startswith("odd_text"))
    assert results[odd]["status"] == "graded", results[odd]
    assert results[odd]["parts"]["data_parallel"]["checks"][0]["status"] == "crashed"
    for page in ("grades.csv", "summary.md", "report.html"):
        assert (out / page).is_file(), page
    feedback = (student_dir(out, odd) / "feedback.md").read_text()
    fenced, loose, fence = 0, [], None
    for line in feedback.splitlines():
        if fence is None and line.startswith("```"):
            fence = line
        elif fence is not None and line == fence:
            fence = None
        elif fence is not None:
            fenced += "**Score: 100 / 100**" in line
        elif re.search(r"(?<!\\)\*\*Score: 100|(?<!\\)<img|^```", line):
            loose.append(line)   # the hand-in's Markdown or HTML, live outside a fence
    assert fenced and not loose, loose


def checks_of(result: dict, part: str) -> dict:
    return {o["check"]: o for o in result["parts"][part]["checks"]}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["shape_bug", "hostile"])
def test_no_output_file_holds_a_hidden_value(graded, name):
    out, results, _ = graded
    folder = student_dir(out, name)
    files = {"feedback.md": (folder / "feedback.md").read_text(), "results.json": (folder / "results.json").read_text(),
             "grading.json (student-facing)": student_facing(results[name]),
             "summary.md": (out / "summary.md").read_text(), "grades.csv": (out / "grades.csv").read_text()}
    for file, text in files.items():
        assert not leaked(text), f"{file} of {name} holds hidden values {leaked(text)}"
    hidden = [o for p in results[name]["parts"].values() for o in p["checks"] if o["hidden"]]
    assert any(o["status"] == "crashed" for o in hidden)
    for o in hidden:
        assert "Leak" not in o["error"] and "[" not in o["error"], o
        assert not re.search(r"\d{3,}", re.sub(r"\.py:\d+", "", o["message"])), o


@pytest.mark.timeout(900)
def test_a_shape_bug_at_hidden_sizes_says_type_and_line_there_and_torchs_words_at_the_public_check(graded):
    _, results, _ = graded
    dp = checks_of(results["shape_bug"], "data_parallel")
    line = REF.replace(SLICE, SHAPED).splitlines().index(SHAPED.rstrip("\n")) + 1
    assert dp["default"]["status"] == "passed"   # the default check's own slice
    size = RUBRIC.default_check.global_batch_size * COLS   # one rank: the whole batch
    assert f"shape '[{ROWS}, {COLS}]' is invalid for input of size {size}" in dp["default-1-rank"]["message"]
    assert f"reshape({ROWS}, {COLS})" in dp["default-1-rank"]["traceback"]
    four = dp["four-nodes"]
    assert four["status"] == "crashed"
    assert f"RuntimeError at assignment4.py:{line} in data_parallel_single_step" in four["message"]
    assert "shape" not in four["message"] and "invalid" not in four["message"] and "reshape" not in four["traceback"]


@pytest.mark.timeout(900)
def test_a_hostile_print_keeps_its_words_at_public_checks_only(graded):
    out, results, _ = graded
    base = checks_of(results["hostile"], "baseline")
    default = PUBLIC[0]
    assert base["default"]["status"] == "crashed"
    assert f"[{default.global_batch_size}, {default.input_dim}, {default.output_dim}" in base["default"]["message"]
    for c in HIDDEN:
        if c.kind == "step":
            o = base[c.name]
            assert o["status"] == "crashed" and o["message"].startswith("crashed: an exception at assignment4.py:")
    dp = checks_of(results["hostile"], "data_parallel")
    # The frame compiled at run time under assignment4.py's name, at a line the values chose, is not shown.
    for c in HIDDEN:
        if c.kind == "step":
            assert "ValueError at assignment4.py:" in dp[c.name]["message"]
            assert "in single_step" not in dp[c.name]["message"], dp[c.name]["message"]
    feedback = (student_dir(out, "hostile") / "feedback.md").read_text()
    assert "hidden check `four-nodes`: **crashed**" in feedback


@pytest.mark.timeout(900)
def test_a_device_picked_by_the_global_rank_fails_the_multi_node_check_only(graded):
    _, results, _ = graded
    result = results["cuda_rank"]
    dp = checks_of(result, "data_parallel")
    multi = [c.name for c in RUBRIC.checks if c.nodes > 1 and "data_parallel" in c.parts()]
    assert multi
    for name, o in dp.items():
        if name in multi:
            assert o["status"] == "crashed" and "LOCAL_RANK" in o["message"], o
        else:
            assert o["status"] == "passed", o
    assert all(result["parts"][p]["status"] == "passed" for p in ("baseline", "grad_accumulation", "tensor_parallel"))


@pytest.mark.timeout(300)
def test_the_device_diagnosis_names_the_rank_and_its_node_at_a_public_multi_node_check(tmp_path):
    cuda = tmp_path / "assignment4.py"
    cuda.write_text(REF.replace(START, START + "    full_inputs = full_inputs.to(f'cuda:{dist.get_rank()}')\n"))
    two_nodes = Check(name="two-nodes", world_size=4, nodes=2)
    executor = make_executor("warm", "best")
    try:
        run = run_check(executor, prepare_code(cuda), two_nodes, RUBRIC, tmp_path, ("data_parallel",))["data_parallel"]
    finally:
        executor.close()
    assert run.status == Status.CRASHED
    assert run.detail.startswith("rank 2 asked for cuda:2 but its node has 2 GPUs")
    assert "LOCAL_RANK is 0" in run.detail and "use LOCAL_RANK" in run.detail


def _judge(code: str, checks: list, rubric, tmp: Path) -> dict:
    path = tmp / "assignment4.py"
    path.write_text(code)
    executor = make_executor("warm", "best")
    try:
        return {c.name: judge_check(executor, prepare_code(path), c, rubric, tmp, ("data_parallel",))["data_parallel"]
                for c in checks}
    finally:
        executor.close()


@pytest.mark.timeout(300)
def test_a_rank_that_skips_a_collective_is_named_with_the_collective_it_left_the_others_in(tmp_path):
    rubric = dataclasses.replace(RUBRIC, timeouts=dataclasses.replace(RUBRIC.timeouts, part=3, process_group=2))
    skip = REF.replace(ALL_REDUCE, "        if dist.get_rank() != 1:\n    " + ALL_REDUCE)
    hidden = next(c for c in HIDDEN if c.kind == "step" and c.world_size == 4)
    judged = _judge(skip, [PUBLIC[0], hidden], rubric, tmp_path)
    public = judged[PUBLIC[0].name]
    numel = PUBLIC[0].input_dim * PUBLIC[0].output_dim
    assert public.status == Status.TIMEOUT
    assert (f"rank 1 returned from the part without calling a collective; ranks 0, 2 and 3 waited in collective #1 "
            f"of the part (all_reduce of {numel} elements), while rank 1 never called it") in public.message
    secret = judged[hidden.name]
    assert secret.status == Status.TIMEOUT
    assert "waited in collective #1 of the part (all_reduce)" in secret.message
    assert "rank 1" not in secret.message and "elements" not in secret.message


def test_ranks_that_did_the_same_are_named_together_in_a_hang():
    """Rank 0 waits in an all-reduce the three others returned without: one clause for the three,
    at a public check with their numbers, at a hidden one without."""
    from grader.rerun.hangs import hang_detail
    from grader.rerun.wire.hidden import Words
    call = {"op": "all_reduce", "numel": 2048, "reduce_op": "sum"}
    calls = {0: [call], 1: [], 2: [], 3: []}
    said = hang_detail(calls, {1, 2, 3}, Words({}, hidden=False))
    assert said.startswith("ranks 1, 2 and 3 returned from the part without calling a collective; rank 0 waited in "
                           "collective #1 of the part (all_reduce of 2048 elements), while ranks 1, 2 and 3 never "
                           "called it"), said
    hidden = hang_detail(calls, {1, 2, 3}, Words({}, hidden=True))
    assert "other ranks never called it" in hidden and "rank 1" not in hidden and "2048" not in hidden
    assert hidden.count("never called it") == 1


def test_a_ranks_result_and_a_killed_ranks_progress_record_of_one_collective_are_named_together(tmp_path):
    """Rank 0 reported its wait (its result lists the call), ranks 2 and 3 were killed first and
    left only their progress records (grader.rerun.rank.hooks): the three waited in the same
    collective and are said so, as when rank 1 runs on into a later part with every optional part on."""
    import torch
    from grader.rerun.hangs import collective as _call, progress_calls as _progress_calls, hang_detail
    from grader.rerun.rank.collectives import FUNCTION
    from grader.rerun.rank.hooks import CommRecorder
    from grader.rerun.wire.hidden import Words
    recorder = CommRecorder(progress=str(tmp_path / "progress"))
    calls = []
    with recorder.recording(calls, part="data_parallel"):
        recorder.call("all_reduce", FUNCTION, lambda *args, **kwargs: None, (torch.zeros(2048), torch.distributed.ReduceOp.SUM), {})
    reported = [_call(c) for c in calls]
    left = _progress_calls((tmp_path / "progress").read_text(), "data_parallel")
    assert left == reported == [{"op": "all_reduce", "numel": 2048, "reduce_op": "SUM"}]
    said = hang_detail({0: reported, 1: [], 2: left, 3: left}, {1}, Words({}, hidden=False))
    assert said.startswith("rank 1 returned from the part without calling a collective; ranks 0, 2 and 3 waited in "
                           "collective #1 of the part (all_reduce of 2048 elements), while rank 1 never called it"), said


@pytest.mark.timeout(300)
def test_a_hang_past_the_parts_clock_is_told_from_the_records_the_ranks_left(tmp_path):
    """No rank reports: the collective timeout is longer than the part's clock, so the supervisor
    kills the world and only the progress records say who waited where."""
    rubric = dataclasses.replace(RUBRIC, timeouts=dataclasses.replace(RUBRIC.timeouts, part=3, process_group=60))
    stall = REF.replace(START, START + "    if dist.get_rank() == 1:\n        import time\n        time.sleep(120)\n")
    judged = _judge(stall, [PUBLIC[0]], rubric, tmp_path)
    o = judged[PUBLIC[0].name]
    assert o.status == Status.TIMEOUT
    assert "ranks 0, 2 and 3 waited in collective #1 of the part (all_reduce of" in o.message
    assert "rank 1 called no collective at all in the part" in o.message


@pytest.mark.timeout(900)
def test_grading_runs_the_public_checks_students_check_runs_and_both_say_the_same(graded):
    out, results, tmp = graded
    public = public_rubric(RUBRIC)
    for result in results.values():
        for part in result["parts"].values():
            ran = [o["check"] for o in part["checks"] if not o["hidden"]]
            assert ran == [c.name for c in public.checks if part["part"] in public.parts_at(c)]
    data = zip_bytes(Files(code=REF.replace(SLICE, SHAPED), log=None, err=None))
    handin = Handin(name="shape_bug.zip", student="shape_bug", sha256="0" * 64, zip_bytes=data)
    rubric = dataclasses.replace(public, timeouts=dataclasses.replace(public.timeouts, part=3, process_group=2))
    executor = make_executor("warm", "best")
    try:
        report = check_handin(handin, rubric, executor)
    finally:
        executor.close()
    row = next(r for r in report.rows if r.part == "data_parallel")
    graded_part = results["shape_bug"]["parts"]["data_parallel"]
    failing = next(o for o in graded_part["checks"] if not o["hidden"] and o["status"] != "passed")
    assert row.rerun == Status.CRASHED and f"check '{failing['check']}'" in row.message
    assert failing["message"] in row.message
    assert "All public re-run checks passed" not in (student_dir(out, "shape_bug") / "feedback.md").read_text()


def test_the_spy_names_a_reduce_op_however_it_was_given():
    """By dist's constant, a ReduceOp object (as PREMUL_SUM's is), a group's options, or a
    functional collective's string: one name each (grader.rerun.rank.collectives)."""
    import torch.distributed as dist
    from grader.rerun.rank.collectives import reduce_name
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.MAX
    given = (dist.ReduceOp.SUM, dist.ReduceOp(dist.ReduceOp.AVG), options, "sum", None)
    assert [reduce_name(op) for op in given] == ["SUM", "AVG", "MAX", "SUM", None]
