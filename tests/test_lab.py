"""The lecture's lab (lab/): every collective, the bandwidth formulas, and the parallel MLPs'
gradients, in real gloo worlds of 2 and 4 ranks; the lab's Slurm jobs without a cluster.

    .venv/bin/python -m pytest tests/test_lab.py -q

(tests/test_lab_slurm.py runs the lab's job on a real cluster.)
"""

import ast
import csv
import os
import re
import subprocess
import sys

import pytest
import torch

from lab import bandwidth as bw
from lab.common import parse_results
from tests.worlds import ROOT, run_world

LAB = ROOT / "lab"
CHUNK = 3                                   # odd, so a chunk is never a power of two
MLP = dict(batch_size=12, dim=20, num_layers=4, num_micro_batches=3, seed=7)   # at 4 ranks: 5 columns, 3 rows, 1 layer each
TOL = dict(rtol=1e-4, atol=1e-6)            # float32 in another summation order against float64


# --- the collectives ------------------------------------------------------------------------------

# A world's results come back as lists: a tensor sent through the queue would point into the
# memory of a process that has ended by the time it is read.

def _collectives(rank, world_size, chunk):
    from lab.collectives import run_collectives
    native = run_collectives(rank, world_size, chunk)
    fallback = run_collectives(rank, world_size, chunk, force_fallback=True)
    as_lists = lambda steps: {k: (None if s.after is None else s.after.tolist(), s.note)  # noqa: E731
                              for k, s in steps.items()}
    return as_lists(native), as_lists(fallback)


def expected_collectives(rank, n, c):
    """Written from the definitions: rank s holds x_s = 100s + [0..c) and a_s = 100s + [0..n*c)."""
    f = lambda values: torch.tensor(values, dtype=torch.float32)   # noqa: E731
    ranks_sum = 100 * n * (n - 1) // 2                              # sum over s of 100s
    gathered = f([100 * s + i for s in range(n) for i in range(c)])
    return {
        "broadcast": f(range(c)),
        "scatter": f([rank * c + i for i in range(c)]),
        "gather": gathered if rank == 0 else None,
        "reduce": f([ranks_sum + n * i for i in range(c)]) if rank == 0 else None,
        "all-gather": gathered,
        "reduce-scatter": f([ranks_sum + n * (rank * c + i) for i in range(c)]),
        "all-reduce": f([ranks_sum + n * j for j in range(n * c)]),
        "reduce-scatter + all-gather": f([ranks_sum + n * j for j in range(n * c)]),
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 4])
def test_every_collective_leaves_what_its_definition_says(world_size):
    results = run_world(world_size, _collectives, CHUNK, timeout=50)
    for rank, (native, fallback) in enumerate(results):
        for label, steps in (("native", native), ("fallback", fallback)):
            want = expected_collectives(rank, world_size, CHUNK)
            assert list(steps) == list(want)
            for name, expected in want.items():
                got, note = steps[name]
                if expected is None:
                    assert got is None, f"rank {rank}, {name}: only the root gets a result"
                else:
                    torch.testing.assert_close(torch.tensor(got), expected, rtol=0, atol=0,
                                               msg=lambda m: f"rank {rank}, {name} ({label}): {m}")
            assert steps["reduce-scatter + all-gather"][1] == "equals the all-reduce: True"
        assert fallback["reduce-scatter"][1].startswith("FALLBACK")   # labelled as such
        assert native["reduce-scatter"][1] == ""      # gloo in torch 2.13 has its own


# --- the bandwidth formulas: pure functions, synthetic timings -------------------------------------

@pytest.mark.parametrize("n, factors", [
    (1, {"all_reduce": 0.0, "all_gather": 0.0, "reduce_scatter": 0.0, "broadcast": 1.0}),
    (2, {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 1.0}),
    (4, {"all_reduce": 1.5, "all_gather": 0.75, "reduce_scatter": 0.75, "broadcast": 1.0}),
    (8, {"all_reduce": 1.75, "all_gather": 0.875, "reduce_scatter": 0.875, "broadcast": 1.0}),
])
def test_bus_bandwidth_uses_nccl_tests_factors(n, factors):
    size, seconds = 3 * 2 ** 20, 0.0125                       # 3 MiB in 12.5 ms
    assert bw.algbw(size, seconds) == pytest.approx(size / seconds)
    for op, factor in factors.items():
        assert bw.bus_factor(op, n) == pytest.approx(factor)
        assert bw.busbw(op, size, seconds, n) == pytest.approx(size / seconds * factor)
    with pytest.raises(ValueError, match="unknown collective 'all_to_all'"):
        bw.bus_factor("all_to_all", n)


def test_the_lectures_figures_against_bus_bandwidth():
    """The lecture divided by n*t: for all-reduce that lands on busbw (in GiB/s), for reduce-scatter
    (counting only the output, S/n) on busbw / n."""
    n, size, t = 4, 400 * 2 ** 20, 0.01
    lecture_all_reduce = size * 2 * (n - 1) / (n * t)
    lecture_reduce_scatter = (size / n) * (n - 1) / (n * t)
    assert lecture_all_reduce == pytest.approx(bw.busbw("all_reduce", size, t, n))
    assert lecture_reduce_scatter == pytest.approx(bw.busbw("reduce_scatter", size, t, n) / n)


def test_a_row_reports_the_median_of_the_slowest_ranks_times():
    row = bw.row_from_times("all_reduce", 10 ** 6, 4, [0.004, 0.001, 0.100, 0.002])
    assert row.time_us == pytest.approx(3000.0)                # median of 1, 2, 4, 100 ms
    assert row.algbw_gbps == pytest.approx(10 ** 6 / 0.003 / 1e9)
    assert row.busbw_gbps == pytest.approx(row.algbw_gbps * 1.5)


def test_sizes_parse_double_and_split_into_whole_elements_per_rank():
    assert [bw.parse_size(s) for s in ("4096", "1K", "64M", "64MB", "64MiB", "1G", "1.5K")] == [
        4096, 1024, 64 * 2 ** 20, 64 * 2 ** 20, 64 * 2 ** 20, 2 ** 30, 1536]
    with pytest.raises(ValueError, match="not a size: 'lots'"):
        bw.parse_size("lots")
    assert bw.sizes_between(1024, 5000) == [1024, 2048, 4096, 5000]
    assert bw.sizes_between(1024, 4096) == [1024, 2048, 4096]
    with pytest.raises(ValueError, match="below the smallest"):
        bw.sizes_between(2048, 1024)
    assert bw.fit_size(1024, 3) == 1020 and bw.fit_size(1024, 4) == 1024 and bw.fit_size(5, 4) == 16


def test_table_csv_and_a_plot_that_is_optional(tmp_path, monkeypatch):
    rows = [bw.row_from_times(op, 4096, 3, [0.001]) for op in bw.OPS]
    table = bw.format_table(rows)
    assert "busbw (GB/s)" in table.splitlines()[0]
    assert re.search(r"^all_reduce\s+4096\s+4K\s+1000\.0\s+0\.004\s+0\.005$", table, re.M), table
    assert [bw.human(s) for s in (996, 1024, 1536, 3 * 2 ** 20, 2 ** 30)] == ["996", "1K", "1.5K", "3M", "1G"]
    bw.write_csv(rows, tmp_path / "bw.csv")
    with open(tmp_path / "bw.csv") as f:
        read = list(csv.DictReader(f))
    assert [r["op"] for r in read] == list(bw.OPS)
    assert float(read[0]["busbw_gbps"]) == pytest.approx(rows[0].busbw_gbps)
    assert bw.plot(rows, tmp_path / "drawn.png") == f"plot: {tmp_path / 'drawn.png'}"
    assert (tmp_path / "drawn.png").read_bytes().startswith(b"\x89PNG")   # drawn by grader/plots.py
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # as if it were not installed
    note = bw.plot(rows, tmp_path / "bw.png")
    assert note.startswith("no plot: matplotlib is not installed") and not (tmp_path / "bw.png").exists()


def _bandwidth(rank, world_size, sizes):
    return [r.to_dict() for r in bw.run_bandwidth(rank, world_size, sizes, warmup=1, iters=3)]


@pytest.mark.timeout(60)
def test_the_benchmark_measures_every_collective_in_a_real_world():
    results = run_world(3, _bandwidth, [1000, 2999], timeout=50)
    assert results[0] == results[1] == results[2]             # the ranks agree on every time
    rows = results[0]
    assert [(r["op"], r["size_bytes"]) for r in rows] == [(op, s) for op in bw.OPS for s in (996, 2988)]
    for r in rows:
        assert r["time_us"] > 0 and r["impl"] == "native"
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * bw.bus_factor(r["op"], 3))


# --- the MLP: data, tensor and pipeline parallel against the single process ------------------------

def _parallel_mlps(rank, world_size, cfg):
    from lab import data_parallel, pipeline_parallel, tensor_parallel
    from lab.mlp import MLPConfig
    cfg = MLPConfig(**cfg)
    out = {name: run(rank, world_size, cfg, device="cpu") for name, run in (
        ("data", data_parallel.run_data_parallel), ("tensor", tensor_parallel.run_tensor_parallel),
        ("pipeline", pipeline_parallel.run_pipeline_parallel))}
    # Megatron's f left out: the input's gradient is one rank's share, not the sum.
    apply = tensor_parallel.CopyToParallelRegion.apply
    tensor_parallel.CopyToParallelRegion.apply = staticmethod(lambda x: x)
    try:
        out["tensor without f"] = tensor_parallel.run_tensor_parallel(rank, world_size, cfg, device="cpu")
    finally:
        tensor_parallel.CopyToParallelRegion.apply = apply
    traffic = {}
    for name, run in (("tensor", tensor_parallel.run_tensor_parallel), ("megatron", tensor_parallel.run_megatron)):
        out[name] = run(rank, world_size, cfg, device="cpu")
        traffic[name] = list(tensor_parallel.TRAFFIC.calls), tensor_parallel.TRAFFIC.sent(world_size)
    result = {k: (r.loss, r.local_loss, [g.tolist() for g in r.grads]) for k, r in out.items()}
    result["traffic"] = traffic
    return result


def single_process(cfg):
    """Loss and gradients of the MLP on one process in float64, written here from its definition."""
    from lab.mlp import MLPConfig, init_weights, make_data
    c = MLPConfig(**cfg)
    weights = [w.double().requires_grad_() for w in init_weights(c, "cpu")]
    x = make_data(c, "cpu").double()
    for w in weights:
        x = torch.nn.functional.gelu(x @ w)
    loss = (x ** 2).sum() / x.numel()
    loss.backward()
    return loss.item(), [w.grad for w in weights]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 4])
def test_parallel_mlps_match_the_single_process_loss_and_gradients(world_size):
    loss, grads = single_process(MLP)
    d, layers, n = MLP["dim"], MLP["num_layers"], world_size
    k, s = d // n, layers // n
    results = run_world(world_size, _parallel_mlps, MLP, timeout=50)
    for rank, got in enumerate(results):
        expected = {
            "data": grads,                                                 # all of it, all-reduced
            "tensor": [g[:, rank * k:(rank + 1) * k] for g in grads],      # this rank's columns
            "pipeline": grads[rank * s:(rank + 1) * s],                    # this stage's layers
        }
        for name, want in expected.items():
            got_loss, _, got_grads = got[name]
            assert got_loss == pytest.approx(loss, rel=1e-5), f"{name} on rank {rank}"
            assert len(got_grads) == len(want), f"{name} on rank {rank}"
            for i, (g, w) in enumerate(zip(got_grads, want)):
                torch.testing.assert_close(torch.tensor(g, dtype=torch.float64), w, **TOL, msg=lambda m: f"{name}, rank {rank}, W_{i}: {m}")
        # Megatron's layout: columns of the first layer of each pair, rows of the second.
        megatron = [g[rank * k:(rank + 1) * k, :] if i % 2 else g[:, rank * k:(rank + 1) * k]
                    for i, g in enumerate(grads)]
        got_loss, _, got_grads = got["megatron"]
        assert got_loss == pytest.approx(loss, rel=1e-5) and len(got_grads) == layers
        for g, w in zip(got_grads, megatron):
            torch.testing.assert_close(torch.tensor(g, dtype=torch.float64), w, **TOL)
        # What each layout hands the collectives per step: per layer an all-gather of [B, d/n] and
        # (but the first) an all-reduce of [B, d]; per pair an all-reduce of [B, d] each way (but
        # the first pair's backward). 4 bytes a number.
        full, piece = 4 * MLP["batch_size"] * d, 4 * MLP["batch_size"] * k
        calls, sent = got["traffic"]["tensor"]
        assert sorted(calls) == sorted([("all_gather", piece)] * layers + [("all_reduce", full)] * (layers - 1))
        assert sent == layers * (n - 1) * piece + (layers - 1) * 2 * (n - 1) * full // n
        calls, sent = got["traffic"]["megatron"]
        assert calls == [("all_reduce", full)] * (layers - 1) and sent < got["traffic"]["tensor"][1]
        # Without f the last layer is still right, and every other layer wrong.
        broken = [torch.tensor(g, dtype=torch.float64) for g in got["tensor without f"][2]]
        torch.testing.assert_close(broken[-1], expected["tensor"][-1], **TOL)
        for i in range(layers - 1):
            assert not torch.allclose(broken[i], expected["tensor"][i], **TOL), f"W_{i} on rank {rank}"
    local_losses = [got["data"][1] for got in results]
    assert len(set(local_losses)) == world_size                    # each rank saw other rows
    assert sum(local_losses) / world_size == pytest.approx(loss, rel=1e-5)


# --- the scripts, as a person runs them ---------------------------------------------------------

def run_lab(command, tmp_path, timeout=120):
    env = dict(os.environ, A4_LAB_OUT=str(tmp_path / "out"), A4_LAB_MAX_SIZE="4K", A4_TIMEOUT_S="60",
               PATH=f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("ranks", [1, 2])
def test_the_whole_lab_runs_with_and_without_torchrun(tmp_path, ranks):
    script = str(LAB / "run_all.py")
    command = ([sys.executable, script] if ranks == 1 else
               [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", script])
    proc = run_lab(command, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    parts = ["collectives", "data_parallel", "tensor_parallel", "pipeline_parallel", "all"]
    assert parse_results(proc.stdout) == {(p, r): True for p in parts for r in range(ranks)}, proc.stdout
    assert re.search(r"^\[lab:bandwidth\] all_reduce\s+4096\s", proc.stdout, re.M), proc.stdout
    assert (tmp_path / "out" / f"bandwidth-gloo-{ranks}ranks.csv").is_file()
    assert "FutureWarning" not in proc.stderr      # the collectives' current names


def test_the_lab_imports_as_its_package_docstring_says():
    may_import = {"common": set(), "collectives": {"lab.common"}, "bandwidth": {"lab.common"},
                  "mlp": {"lab.common"}, "data_parallel": {"lab.common", "lab.mlp"},
                  "tensor_parallel": {"lab.common", "lab.mlp"}, "pipeline_parallel": {"lab.common", "lab.mlp"},
                  "__init__": set(),
                  "run_all": {"lab", "lab.common"}}
    assert set(may_import) == {p.stem for p in LAB.glob("*.py")}
    for path in LAB.glob("*.py"):
        tops = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                tops.add(node.module)
                if node.module == "grader":
                    assert {a.name for a in node.names} == {"plots"}, path.name
        assert {t for t in tops if t.split(".")[0] == "lab"} <= may_import[path.stem], path.name
        # of the grader, only its plotting module (shipped with the release, matplotlib only)
        assert not {t.split(".")[0] for t in tops - {"grader"}} & {"grader", "slurm", "tests"}, path.name
        assert "grader" not in tops or path.stem == "bandwidth", path.name   # `from grader import plots`
    for folder in ("grader", "slurm", "assignment_4"):
        for path in (ROOT / folder).rglob("*.py"):
            assert not re.search(r"^\s*(from|import) lab\b", path.read_text(), re.M), path


def test_every_lab_file_says_how_to_run_it_and_stays_short():
    for path in sorted(LAB.glob("*.py")):
        text = path.read_text()
        assert text.startswith('"""'), path.name
        doc = text.split('"""')[1]
        if path.name != "__init__.py":
            assert f"lab/{path.name}" in doc or "import lab.common" in doc, f"{path.name}: no command in its docstring"
        assert len(text.splitlines()) <= 300, path.name


# --- the Slurm jobs, without a cluster ------------------------------------------------------------

@pytest.mark.parametrize("name", ["lab.sbatch", "lab-cpu.sbatch"])
def test_the_lab_jobs_are_strict_and_run_the_assignments_job_body(name):
    path = ROOT / "slurm" / name
    text = path.read_text()
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    assert "set -euo pipefail" in text and os.access(path, os.X_OK)
    lines = text.splitlines()
    sbatch_lines = [line for line in lines if line.startswith("#SBATCH")]
    for line in ("#SBATCH --job-name=lab", "#SBATCH --output=%x-%j.log", "#SBATCH --error=%x-%j.err",
                 "#SBATCH --ntasks-per-node=1", "#SBATCH --nodes=1"):
        assert line in sbatch_lines, line
    first_command = next(i for i, line in enumerate(lines[1:], 1) if line.strip() and not line.startswith("#"))
    assert all(lines.index(line) < first_command for line in sbatch_lines)   # sbatch stops at the first command
    assert not any("$" in line for line in sbatch_lines)
    assert "A4_SCRIPT=${A4_SCRIPT:-lab/run_all.py}" in text and 'exec bash "$body"' in text
    assert "/slurm/assignment4.sbatch" in text


def test_the_launcher_submits_the_lab_by_its_script_and_name():
    proc = subprocess.run([sys.executable, "-m", "slurm.submit", "--profile", str(ROOT / "tests" / "slurm_cluster" / "profile.yaml"), "--nodes", "1",
                           "--script", "lab/run_all.py", "--name", "lab", "--dry-run"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --job-name=lab\n" in proc.stdout and "#SBATCH --nodes=1\n" in proc.stdout
