"""grader.evidence.logfile and errfile on the checked-in sample logs (tests/data/logs/README.md) and on mangled variants."""

import json
import random
from pathlib import Path

import pytest

from grader.evidence.errfile import parse_err
from grader.evidence.logfile import parse_log
from grader.evidence.logtext import Dialect, RankClaim, part_of_prefix
from grader.parts import CORE_PART_IDS as PART_IDS  # the sample logs are of the four parts every course has

DATA = Path(__file__).parent / "data" / "logs"
REFERENCE_SHA = "14615a42c430141688f305735e1bd68951738b89180124d86f52859d873f1d8f"


def read(name) -> bytes:
    return (DATA / name).read_bytes()


def claims(part) -> str:
    """A part's per-rank claims, compactly: "0=match 1=missing"."""
    return " ".join(f"{r}={c.value}" for r, c in part.ranks.items())


def summary(report):
    """{part: (passed, claims, message)} of a LogReport."""
    return {p: (e.passed, claims(e), e.message) for p, e in report.parts.items()}


ALL4 = "0=match 1=match 2=match 3=match"
MISSING4 = "0=missing 1=missing 2=missing 3=missing"
NI4 = "0=not_implemented 1=not_implemented 2=not_implemented 3=not_implemented"
OK4 = (True, ALL4, "matches on all 4 ranks")
NONE4 = (False, MISSING4, "no line for this part")
HANDOUT_BASELINE_OK = (True, "0=match", "the step changed the weight on rank 0 (max diff 1.2e-01), "
                                        "as the handout's baseline expects")
RANK0_OK = (True, "0=match", "matches on rank 0")

# sample -> (dialect, world size, {part: (passed, claims, message)}, flag codes), expected world size 4
LOGS = {
    "a4_reference.log": ("a4", 4, dict.fromkeys(PART_IDS, OK4), []),
    "a4_cluster_4nodes.log": ("a4", 4, dict.fromkeys(PART_IDS, OK4), []),
    "a4_reference_2ranks.log": (
        "a4", 2, dict.fromkeys(PART_IDS, (True, "0=match 1=match", "matches on all 2 ranks")),
        ["world_size_too_small"]),
    "a4_skeleton.log": ("a4", 4, dict.fromkeys(PART_IDS, (False, NI4, "not implemented")), []),
    "a4_broken_parts.log": ("a4", 4, {
        "baseline": OK4,
        "grad_accumulation": (False, "0=mismatch 1=mismatch 2=mismatch 3=mismatch",
                              "ranks 0, 1, 2, 3: Tensors match: False (max diff 3.6e-01)"),
        "data_parallel": (False, "0=match 1=mismatch 2=mismatch 3=mismatch",
                          "ranks 1, 2, 3: Tensors match: False (max diff 9.0e-02)"),
        "tensor_parallel": OK4}, []),
    "a4_world3_valueerror.log": ("a4", 3, {
        "baseline": (True, "0=match 1=match 2=match", "matches on all 3 ranks"),
        "grad_accumulation": (True, "0=match 1=match 2=match", "matches on all 3 ranks"),
        "data_parallel": (False, "0=missing 1=missing 2=missing", "no line for this part"),
        "tensor_parallel": (False, "0=missing 1=missing 2=missing", "no line for this part")},
        ["world_size_too_small", "unfinished", "job_failed"]),
    "a4_tp_shape_guard.log": ("a4", 4, {"baseline": OK4, "grad_accumulation": OK4, "data_parallel": OK4,
                                        "tensor_parallel": NONE4}, ["unfinished", "job_failed"]),
    "a4_dp_gloo_timeout.log": ("a4", 4, {
        "baseline": OK4, "grad_accumulation": OK4,
        "data_parallel": (False, "0=mismatch 1=missing 2=missing 3=missing",
                          "rank 0: Tensors match: False (max diff 1.0e-01); no line for ranks 1, 2, 3"),
        "tensor_parallel": NONE4}, ["missing_ranks", "unfinished", "job_failed"]),
    "a4_time_limit.log": ("a4", 4, {
        "baseline": OK4, "grad_accumulation": OK4,
        "data_parallel": (False, "0=mismatch 1=missing 2=missing 3=missing",
                          "rank 0: Tensors match: False (max diff 1.0e-01); no line for ranks 1, 2, 3"),
        "tensor_parallel": NONE4}, ["missing_ranks", "unfinished"]),
    "a4_nccl_error.log": ("a4", 4, dict.fromkeys(PART_IDS, NONE4), ["unfinished", "job_failed"]),
    "a4_cuda_oom.log": ("a4", 4, {
        "baseline": (False, "0=match 1=missing 2=match 3=match", "no line for rank 1"),
        "grad_accumulation": (False, "0=match 1=missing 2=match 3=match", "no line for rank 1"),
        "data_parallel": NONE4, "tensor_parallel": NONE4}, ["missing_ranks", "unfinished", "job_failed"]),
    "a4_syntax_error.log": ("unknown", 4, dict.fromkeys(PART_IDS, NONE4),
                            ["no_init_lines", "unfinished", "job_failed"]),
    "a4_separate_worlds.log": ("a4", 1, dict.fromkeys(PART_IDS, RANK0_OK),
                               ["separate_worlds", "world_size_too_small", "header_mismatch",
                                "duplicate_ranks"]),
    "handout_reference.log": ("handout", 4, {
        "baseline": HANDOUT_BASELINE_OK, "grad_accumulation": RANK0_OK,
        "data_parallel": OK4, "tensor_parallel": OK4}, []),
    "handout_cluster_4nodes.log": ("handout", 4, {
        "baseline": HANDOUT_BASELINE_OK, "grad_accumulation": RANK0_OK,
        "data_parallel": OK4, "tensor_parallel": OK4}, []),
    # Other names and dialects of real clusters (grader.evidence.runs finds them by content).
    "slurm-48213.out": ("a4", 4, dict.fromkeys(PART_IDS, OK4), []),
    "output_2_48240.out": ("a4", 4, dict.fromkeys(PART_IDS, OK4), []),
    "a4_torchrun_redirected.txt": ("a4", 4, dict.fromkeys(PART_IDS, OK4), []),
    "handout_48311.stdout": ("handout", 4, {
        "baseline": HANDOUT_BASELINE_OK, "grad_accumulation": RANK0_OK,
        "data_parallel": OK4, "tensor_parallel": OK4}, []),
    "handout_invented_prefixes.log": ("handout", 4, {
        "baseline": (False, "0=mismatch", "rank 0: Tensors match: True, so the step did not change the weight"),
        "grad_accumulation": RANK0_OK,
        "data_parallel": OK4,
        "tensor_parallel": (False, "0=mismatch 1=mismatch 2=mismatch 3=mismatch",
                            "ranks 0, 1, 2, 3: Tensors match: False (max diff 1.7e-01)")}, []),
}

GLOO_CLOSED = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
    "peer [127.0.0.1]:24984. This is typically caused by a remote worker crashing. Check the logs of the remote "
    "worker before reporting an error. GLHF! \U0001f3d6\ufe0f")
NCCL_ERROR = (
    "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, "
    "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.5")
CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.94 MiB is free. Process 2210417 has 77.96 GiB memory in use. Including non-PyTorch "
    "memory, this process has 1.22 GiB memory in use. Of the allocated memory 8.00 KiB is allocated by PyTorch, "
    "and 2.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
    "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
    "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
OMP_BANNER_ONLY = (None, None, None, None, [])

# sample -> (exception, failed rank, exception rank, exit code, flag codes)
ERRS = {
    "a4_reference.err": OMP_BANNER_ONLY,
    "a4_reference_2ranks.err": OMP_BANNER_ONLY,
    "a4_skeleton.err": OMP_BANNER_ONLY,
    "a4_broken_parts.err": OMP_BANNER_ONLY,
    "handout_reference.err": OMP_BANNER_ONLY,
    "handout_invented_prefixes.err": OMP_BANNER_ONLY,
    "slurm-48213.out": OMP_BANNER_ONLY,   # stdout and stderr in one file: warnings only
    "a4_torchrun_redirected.txt": OMP_BANNER_ONLY,
    "output_2_48240.err": OMP_BANNER_ONLY,
    "handout_48311.stderr": OMP_BANNER_ONLY,
    "a4_world3_valueerror.err": ("ValueError: global_batch_size (128) is not divisible by world_size (3)",
                                 2, 2, 1, ["python_error"]),
    "a4_tp_shape_guard.err": ("AssertionError: SHAPE GUARD: At dimension 1: expected 32, but got 8 "
                              "(actual shape: [128, 8]).", 0, 3, 1, ["python_error"]),
    "a4_dp_gloo_timeout.err": (GLOO_CLOSED, 0, 0, 1, ["python_error", "collective_timeout"]),
    "a4_syntax_error.err": ("SyntaxError: unmatched ')'", 0, None, 1, ["python_error"]),
    "a4_time_limit.err": (None, None, None, None, ["slurm_time_limit"]),
    "a4_nccl_error.err": (NCCL_ERROR, 2, 2, 1, ["python_error", "nccl_error"]),
    "a4_cuda_oom.err": (CUDA_OOM, 1, 1, 1, ["python_error", "oom"]),
    "a4_oom_kill.err": (None, 1, None, -9, ["oom"]),
    "a4_node_fail.err": (None, None, None, None, ["slurm_node_fail"]),
}


def test_every_sample_is_tested_and_the_folder_stays_small():
    names = {p.name for p in DATA.iterdir()} - {"README.md"}
    assert names == set(LOGS) | set(ERRS)
    assert sum(p.stat().st_size for p in DATA.iterdir()) < 200_000
    readme = (DATA / "README.md").read_text()
    assert all(f"`{name.rsplit('.', 1)[0]}" in readme for name in names)


@pytest.mark.parametrize("name", sorted(LOGS))
def test_log_sample(name):
    dialect, world_size, parts, flags = LOGS[name]
    report = parse_log(read(name), min_world_size=4)
    assert report.dialect.value == dialect
    assert report.world_size == world_size
    assert summary(report) == parts
    assert report.flag_codes() == flags
    assert all(f.message.endswith((".", ")")) and "\n" not in f.message for f in report.flags)


@pytest.mark.parametrize("name", sorted(ERRS))
def test_err_sample(name):
    exception, failed_rank, exception_rank, exit_code, flags = ERRS[name]
    report = parse_err(read(name))
    assert report.exception == exception
    assert report.failed_rank == failed_rank
    assert report.exception_rank == exception_rank
    assert report.exit_code == exit_code
    assert report.flag_codes() == flags
    if exception:
        assert report.traceback_head[-1].strip() == exception and len(report.traceback_head) <= 15
        message = report.flags[0].message
        assert message.startswith(("Rank", "The script")) and len(message) < 330
        assert message.endswith("...") == (len(exception) > 300)
    json.dumps(report.to_dict(), allow_nan=False)


def test_reference_log_fields():
    report = parse_log(read("a4_reference.log"), min_world_size=4)
    assert report.init_ranks == [2, 3, 0, 1]
    assert report.done_ranks == [0, 2, 1, 3]
    assert report.fingerprints == [REFERENCE_SHA]
    assert report.finished is True
    assert report.job == {"id": "local-20261121-075144", "name": "assignment4",
                          "started": "2026-11-21T07:51:46Z", "nodes": "node1", "nnodes": "1",
                          "nproc_per_node": "4", "world_size": "4", "backend": "gloo", "torch": "2.13.0+cpu",
                          "nccl": "none", "python": "3.11.7", "status": "0", "at": "2026-11-21T07:51:53Z"}
    dp = report.parts["data_parallel"]
    assert dp.max_diff == 2.384186e-07
    assert dp.excerpt == [f"[DataParallel][Rank {r}] Tensors match: True | Max diff: 2.384186e-07 | "
                          "Mean diff: 4.337522e-09" for r in range(4)]


def test_cluster_log_fields_and_unfinished_runs():
    report = parse_log(read("a4_cluster_4nodes.log"))
    assert report.job["nodes"] == "node[1-4]" and report.job["nccl"] == "2.27.5"
    assert report.parts["baseline"].excerpt[0].startswith("[Baseline][Rank 0] Tensors match: True")
    assert parse_log(read("a4_time_limit.log")).finished is False
    assert "job footer is missing" in parse_log(read("a4_time_limit.log")).flags[-1].message
    assert parse_log(read("a4_dp_gloo_timeout.log")).flags[0].message == (
        "Some ranks are silent where others spoke (no DataParallel line from ranks 1, 2, 3): "
        "a rank crashed or hung, or its output is missing from this log.")


def test_skeleton_excerpt_quotes_the_todo():
    part = parse_log(read("a4_skeleton.log")).parts["baseline"]
    assert part.excerpt[0] == ("[Baseline][Rank 0] Not implemented yet: TODO in single_step: "
                               "inputs, targets = ... (1 line)")
    assert part.max_diff is None


def test_handout_fields():
    report = parse_log(read("handout_invented_prefixes.log"), min_world_size=4)
    assert report.fingerprints == [] and report.job == {}
    assert report.init_ranks == [0, 1, 3, 2]
    assert report.parts["baseline"].max_diff == 0.0
    assert report.parts["data_parallel"].excerpt[0].startswith("[Data Parallel][Rank 0] Tensors match: True")
    assert report.parts["tensor_parallel"].excerpt[0].startswith(
        "[TensorParallel][Rank 0] Tensors match: False")


def test_separate_worlds_message():
    flags = {f.code: f.message for f in parse_log(read("a4_separate_worlds.log"), 4).flags}
    assert flags["separate_worlds"] == (
        "4 processes each started as rank 0 of a world of their own: start torchrun on every node with the "
        "first node of the job as rendezvous, not localhost.")
    assert flags["world_size_too_small"] == (
        "The run had a world size of 1, the assignment needs at least 4: run the job on all its nodes and GPUs.")


def test_handout_separate_worlds_from_node_ids():
    text = "".join(f"{n}: [Distributed Init] Rank 0 initialized on {n} on GPU 0.\n" for n in range(4))
    report = parse_log(text + "0: [DataParallel][Rank 0] Tensors match: True | Max diff: 0.0\n")
    assert report.dialect is Dialect.HANDOUT
    assert report.flag_codes() == ["separate_worlds", "duplicate_ranks", "unfinished"]


@pytest.mark.parametrize("prefix, part", [
    ("Baseline", "baseline"), ("SingleStep", "baseline"), ("GradAccumulation", "grad_accumulation"),
    ("GradAccum", "grad_accumulation"), ("BatchAccumulation", "grad_accumulation"),
    ("Data Parallel", "data_parallel"), ("DataParallel", "data_parallel"), ("DP", "data_parallel"),
    ("FullColumnParallel", "tensor_parallel"), ("TensorParallel", "tensor_parallel"),
    ("ColumnParallel", "tensor_parallel"), ("TP", "tensor_parallel"), ("Tensor-Parallel", "tensor_parallel"),
    ("Warmup", None), ("Rank 0", None),
])
def test_invented_prefixes_map_to_parts(prefix, part):
    assert part_of_prefix(prefix) == part


# ---- what clusters do to logs -------------------------------------------------------------------

def test_spliced_and_broken_lines_are_read():
    text = read("a4_reference.log").decode()
    lines = text.splitlines(keepends=True)
    dp = [i for i, line in enumerate(lines) if line.startswith("[DataParallel]")]
    # two ranks' lines on one physical line, then a line broken in two after its "[Rank r]"
    lines[dp[0]] = lines[dp[0]].rstrip("\n") + lines[dp[1]].rstrip("\n") + "\n\n"
    lines[dp[1]] = ""
    lines[dp[2]] = lines[dp[2]].replace("] Tensors", "]\nTensors")
    mangled = "".join(lines)
    assert mangled.count("\n[DataParallel]") == 3
    report = parse_log(mangled, min_world_size=4)
    assert summary(report) == dict.fromkeys(PART_IDS, OK4)
    assert report.flag_codes() == []


def test_srun_labels_and_torchrun_prefixes_are_read():
    text = read("a4_reference.log").decode()
    labelled = "".join(line if line.startswith("[Job]") else f" {i % 4}: [default{i % 4}]:{line}"
                       for i, line in enumerate(text.splitlines(keepends=True)))
    report = parse_log(labelled, min_world_size=4)
    assert summary(report) == dict.fromkeys(PART_IDS, OK4)
    assert report.flag_codes() == []
    assert report.parts["tensor_parallel"].excerpt[0].startswith("[FullColumnParallel][Rank 0]")


def test_crlf_and_colour_codes():
    text = read("a4_broken_parts.log").decode()
    coloured = (text.replace("Tensors match: True", "Tensors match: \x1b[32mTrue\x1b[0m")
                .replace("[DataParallel]", "\x1b[1;34m[DataParallel]\x1b[0m").replace("\n", "\r\n"))
    plain, report = parse_log(read("a4_broken_parts.log"), 4), parse_log(coloured.encode(), 4)
    assert summary(report) == summary(plain)
    assert report.job == plain.job and report.job["status"] == "0"
    assert report.parts["data_parallel"].excerpt == plain.parts["data_parallel"].excerpt
    assert report.flag_codes() == []


def test_invalid_utf8_and_utf16():
    data = read("a4_reference.log").replace(b"[Rank 0] All ranks ready!", b"\xff\xfe\xc3( caf\xe9 \x80")
    data = data.replace(b"| Mean diff: 5.845351e-09", b"| Mean diff: 5.845351e-09 \xe9\xff")
    report = parse_log(data, 4)
    assert summary(report) == dict.fromkeys(PART_IDS, OK4)
    assert report.flag_codes() == []
    utf16 = parse_log(read("a4_reference.log").decode().encode("utf-16"), 4)
    assert summary(utf16) == dict.fromkeys(PART_IDS, OK4)


def test_truncated_last_line():
    data = read("handout_reference.log")
    cut = data[:data.rindex(b"[FullColumnParallel][Rank 1]") + 40]
    report = parse_log(cut, 4)
    assert summary(report)["tensor_parallel"] == (
        False, "0=match 1=missing 2=match 3=match", "no line for rank 1")
    assert report.done_ranks == [3, 0]
    assert report.flag_codes() == ["missing_ranks", "unfinished"]
    assert report.flags[1].message == (
        "The run did not finish: ranks 1, 2 never printed 'done'; see the .err file.")


@pytest.mark.parametrize("data", [b"", "", b"  \n\r\n", "\n\n", None])
def test_empty(data):
    report = parse_log(data, 4)
    assert report.flag_codes() == ["empty"]
    assert report.dialect is Dialect.UNKNOWN and report.world_size is None and report.finished is False
    assert summary(report) == dict.fromkeys(PART_IDS, (False, "", "no line for this part"))
    err = parse_err(data)
    assert (err.exception, err.flags) == (None, [])


def test_a_megabyte_of_junk():
    rng = random.Random(4)
    binary = parse_log(rng.randbytes(1 << 20), 4)
    assert binary.flag_codes() == ["binary", "no_init_lines"]
    assert summary(binary) == dict.fromkeys(PART_IDS, (False, "", "no line for this part"))
    assert parse_err(rng.randbytes(1 << 20)).flags == []
    words = ["[Rank", "]", "[", "Tensors", "match:", "True", "done", "[Job]", "NCCL", "Killed", "\n", "1"]
    text = " ".join(rng.choice(words) for _ in range(200_000))
    report = parse_log(text, 4)
    assert "parse_error" not in report.flag_codes() and "no_init_lines" in report.flag_codes()
    assert "parse_error" not in parse_err(text).flag_codes()


def test_never_raises_on_damaged_samples():
    rng = random.Random(7)
    samples = sorted(DATA.glob("*.log")) + sorted(DATA.glob("*.err"))
    for _ in range(300):
        data = bytearray(rng.choice(samples).read_bytes())
        for _ in range(rng.randint(1, 20)):
            i = rng.randrange(len(data) or 1)
            if rng.random() < 0.5:
                data[i:i + rng.randint(1, 50)] = b""
            else:
                data[i:i] = rng.randbytes(rng.randint(1, 8))
        for report in (parse_log(bytes(data), rng.choice([None, 4])), parse_err(bytes(data))):
            assert "parse_error" not in report.flag_codes()
            json.dumps(report.to_dict(), allow_nan=False)


def test_two_runs_in_one_log():
    twice = parse_log(read("a4_reference.log") + read("a4_reference.log"), 4)
    assert twice.init_ranks == [2, 3, 0, 1] * 2
    assert summary(twice) == dict.fromkeys(PART_IDS, OK4)
    assert twice.flag_codes() == ["duplicate_ranks"]
    assert twice.flags[0].message == ("Ranks 0, 1, 2, 3 started more than once: the log holds several runs "
                                      "(or separate worlds); hand in the log of one run.")
    mixed = parse_log(read("a4_reference.log") + read("a4_broken_parts.log"), 4)
    broken_sha = "088cfcd6b9afa191c34ed3b26a021f1604be5330bc0198e1a291f8bc640f55b6"
    assert mixed.fingerprints == [REFERENCE_SHA, broken_sha]
    assert summary(mixed)["data_parallel"] == (
        False, "0=match 1=conflicting 2=conflicting 3=conflicting",
        "ranks 1, 2, 3: conflicting lines (several runs in one log?)")
    assert mixed.flag_codes() == ["duplicate_ranks", "mixed_fingerprints"]
    assert mixed.parts["data_parallel"].excerpt[1:3] == [
        "[DataParallel][Rank 1] Tensors match: True | Max diff: 2.384186e-07 | Mean diff: 4.337522e-09",
        "[DataParallel][Rank 1] Tensors match: False | Max diff: 8.745289e-02 | Mean diff: 1.246540e-02"]
    handout = parse_log(read("handout_reference.log") * 2, 4)
    assert summary(handout)["baseline"] == HANDOUT_BASELINE_OK
    assert summary(handout)["grad_accumulation"] == (True, "0=match", "matches on rank 0")


def test_a_run_killed_before_its_footer():
    data = read("a4_reference.log")
    report = parse_log(data[:data.index(b"[Job] finished")], 4)
    assert report.finished is False
    assert report.flag_codes() == ["unfinished"]
    assert report.flags[0].message == ("The run did not finish: the job footer is missing (time limit or "
                                       "cancelled?); see the .err file.")


def test_shape_mismatch_line_and_json():
    shapes = "[FullColumnParallel][Rank 2] Tensors match: False | Max diff: inf | Mean diff: inf | shapes " \
             "[64, 32] vs [64, 8]"
    line = "[FullColumnParallel][Rank 2] Tensors match: True | Max diff: 2.384186e-07 | Mean diff: 5.845351e-09"
    text = read("a4_reference.log").decode().replace(line, shapes)
    report = parse_log(text, 4)
    part = report.parts["tensor_parallel"]
    assert (part.passed, part.message) == (False, "rank 2: Tensors match: False (max diff inf)")
    assert part.ranks[2] is RankClaim.MISMATCH and part.max_diff == float("inf")
    assert shapes in part.excerpt
    as_json = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert as_json["parts"]["tensor_parallel"]["max_diff"] == "inf"
    assert as_json["parts"]["tensor_parallel"]["ranks"] == {"0": "match", "1": "match", "2": "mismatch",
                                                           "3": "match"}
    assert as_json["dialect"] == "a4" and as_json["flags"] == []


def test_world_size_is_only_checked_when_expected():
    assert parse_log(read("a4_reference_2ranks.log")).flag_codes() == []
    assert parse_log(read("a4_reference_2ranks.log"), 2).flag_codes() == []


def test_handout_without_init_lines_and_missing_ranks():
    text = b"".join(line + b"\n" for line in read("handout_reference.log").splitlines()
                    if b"Distributed Init" not in line and b"[Rank 3]" not in line)
    report = parse_log(text, 4)
    assert report.dialect is Dialect.HANDOUT and report.world_size == 3
    assert report.flag_codes() == ["no_init_lines", "world_size_too_small"]


# ---- .err odds and ends -------------------------------------------------------------------------

def test_warnings_only_err_is_clean():
    text = read("a4_reference.err").decode() + (
        "/home/student/a4/.venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:4807: "
        "UserWarning: No device id is provided via `init_process_group` or `barrier `.\n  warnings.warn(\n"
        "[rank0]:[W1121 08:01:02.123456000 ProcessGroupNCCL.cpp:5023] Warning: destroy_process_group() was "
        "not called\nsrun: warning: can't honor --ntasks-per-node set to 1\n")
    report = parse_err(text)
    assert report.to_dict() == {"exception": None, "traceback_head": [], "failed_rank": None, "nccl": [],
                                "slurm": [], "oom": [], "flags": [], "exception_rank": None, "exit_code": None}


def test_preemption_killed_and_watchdog():
    killed = "/var/spool/slurmd/job00912/slurm_script: line 31: 4711 Killed      torchrun assignment4.py"
    report = parse_err("slurmstepd: error: *** JOB 912 ON node1 CANCELLED AT 2026-11-20T10:00:00 DUE TO "
                       f"PREEMPTION ***\n{killed}\nsrun: error: node1: task 0: Killed\n")
    assert report.flag_codes() == ["slurm_cancelled", "oom"]
    assert report.oom == [killed]
    watchdog = parse_err(
        "[rank1]:[E1120 10:05:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=2048, NumelOut=2048, "
        "Timeout(ms)=300000) ran for 300021 milliseconds before timing out.\n")
    assert watchdog.flag_codes() == ["collective_timeout", "nccl_error"]
    assert watchdog.nccl[0].startswith("[E1120 10:05:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog")
    assert parse_err("srun: error: node2: task 1: Killed\n").flag_codes() == []


def test_traceback_of_a_plain_python_run_and_chained_exceptions():
    text = ("W1120 warn first\nTraceback (most recent call last):\n"
            '  File "assignment4.py", line 3, in <module>\n'
            "    import utils\nW1120 10:00:00.000000 1 torch/distributed/run.py:1] a warning in between\n"
            "ModuleNotFoundError: No module named 'utils'\n\nDuring handling of the above exception, another "
            "exception occurred:\n\nTraceback (most recent call last):\nKeyError: 'x'\n")
    report = parse_err(text)
    assert report.exception == "ModuleNotFoundError: No module named 'utils'"
    assert report.traceback_head == ["Traceback (most recent call last):", '  File "assignment4.py", line 3, '
                                     "in <module>", "    import utils", report.exception]
    assert (report.failed_rank, report.exception_rank) == (None, None)
    assert report.flags[0].message == "The script raised ModuleNotFoundError: No module named 'utils'"


def test_long_tracebacks_keep_their_exception():
    head = parse_err(read("a4_tp_shape_guard.err")).traceback_head
    assert len(head) == 15 and head[-2] == "  ..." and head[0] == "Traceback (most recent call last):"
    assert head[1] == '  File "/home/student/a4/assignment4.py", line 413, in <module>'
    assert not any(set(line.strip()) <= set("^~") for line in head)


def test_interleaved_tracebacks_keep_to_their_rank():
    text = ("[rank1]: Traceback (most recent call last):\n"
            "Traceback (most recent call last):\n"
            '[rank1]:   File "/home/student/a4/assignment4.py", line 413, in <module>\n'
            '  File "/home/student/a4/.venv/bin/torchrun", line 8, in <module>\n'
            "[rank0]: Traceback (most recent call last):\n"
            "[rank1]:     main()\n"
            "    sys.exit(main())\n"
            "[rank1]: RuntimeError: rank 1 failed\n"
            "[rank0]: RuntimeError: rank 0 failed\n")
    report = parse_err(text)
    assert report.exception == "RuntimeError: rank 1 failed"
    assert report.traceback_head == ["Traceback (most recent call last):",
                                     '  File "/home/student/a4/assignment4.py", line 413, in <module>',
                                     "    main()", "RuntimeError: rank 1 failed"]
    assert (report.failed_rank, report.exception_rank) == (1, 1)


def test_done_means_the_last_line_only():
    text = read("a4_reference.log").replace(b"[Rank 0] All ranks ready!", b"[Rank 0] done with the setup")
    assert parse_log(text, 4).done_ranks == [0, 2, 1, 3]


def test_a_syntax_error_comes_before_the_tracebacks_it_causes():
    text = read("a4_syntax_error.err").decode().replace(
        "E1121", "[rank1]: Traceback (most recent call last):\n[rank1]:   File \"x.py\", line 1, in <module>\n"
        "[rank1]: RuntimeError: Connection closed by peer\nE1121", 1)
    report = parse_err(text)
    assert report.exception == "SyntaxError: unmatched ')'"
    assert report.traceback_head == ['  File "/home/student/a4/assignment4.py", line 160',
                                     "    scaled_loss = micro_loss / accumulation_steps)", report.exception]


def test_our_utils_with_the_handouts_comparisons():
    lines = [line for line in read("a4_reference.log").decode().splitlines(keepends=True)
             if not line.startswith(("[Baseline]", "[GradAccumulation]"))]
    at = lines.index("[Rank 0] Part 3: data parallel, world size 4.\n")
    lines[at:at] = ["[Rank 0] Tensors match: False | Max diff: 1.193051e-01 | Mean diff: 3.029096e-02\n",
                    "[Rank 0] Tensors match: True | Max diff: 2.384186e-07 | Mean diff: 4.071808e-09\n"]
    report = parse_log("".join(lines), 4)
    assert report.dialect is Dialect.A4
    assert summary(report) == {"baseline": HANDOUT_BASELINE_OK,
                               "grad_accumulation": (True, "0=match", "matches on rank 0"),
                               "data_parallel": OK4, "tensor_parallel": OK4}
    assert report.flag_codes() == []


def test_a_forged_large_rank_stays_small():
    report = parse_log("[Rank 9999] done\n[DataParallel][Rank 123456] Tensors match: True\n", 4)
    assert report.world_size == 10000 and len(report.parts["data_parallel"].ranks) == 10000
    assert report.parts["data_parallel"].message == "no line for this part"
    assert report.flags[-1].message == ("The run did not finish: ranks 0-9998 never printed 'done'; "
                                        "see the .err file.")


def test_ranks_lost_from_the_log():
    data = b"".join(line for line in read("a4_reference.log").splitlines(keepends=True)
                    if b"Rank 2]" not in line and b"Rank 3]" not in line and b"Rank 3 " not in line)
    report = parse_log(data, 4)
    assert report.world_size == 4 and report.init_ranks == [2, 0, 1]
    assert summary(report)["data_parallel"] == (False, "0=match 1=match 2=missing 3=missing", "no line for ranks 2, 3")
    assert report.flag_codes() == ["missing_ranks", "unfinished"]
    assert report.flags[0].message == (
        "Some ranks are silent where others spoke (no init line from rank 3; no 'done' from ranks 2, 3; no Baseline "
        "line from ranks 2, 3; no GradAccumulation line from ranks 2, 3; no DataParallel line from ranks 2, 3; no "
        "FullColumnParallel line from ranks 2, 3): a rank crashed or hung, or its output is missing from this log.")


def test_a_larger_world_than_the_minimum_is_fine():
    """4 nodes of 4 GPUs: 16 ranks, every part matching on every one of them, no world-size flag."""
    lines = ["[Job] id=7 name=assignment4 started=x", "[Job] nodes=g1,g2,g3,g4 nnodes=4 nproc_per_node=4 "
             "world_size=16 backend=nccl"]
    lines += [f"[Distributed Init] Rank {r} initialized on node {r // 4} (g{r // 4 + 1}) on cuda:{r % 4} | "
              f"backend nccl | world size 16 | torch 2.13.0 | code sha256 {'a' * 64}" for r in range(16)]
    lines += [f"[{p}][Rank {r}] Tensors match: True | Max diff: 2.4e-07 | Mean diff: 5.0e-09"
              for p in ("Baseline", "GradAccumulation", "DataParallel", "FullColumnParallel") for r in range(16)]
    lines += [f"[Rank {r}] done" for r in range(16)] + ["[Job] finished status=0 at=x"]
    report = parse_log("\n".join(lines) + "\n", min_world_size=4)
    assert report.world_size == 16 and report.finished
    assert report.flag_codes() == []
    assert all(e.passed and e.message == "matches on all 16 ranks" for e in report.parts.values())
