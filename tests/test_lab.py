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

pytestmark = pytest.mark.student   # make test-student runs these; make test leaves them out

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
    parts = ["collectives", "data_parallel", "tensor_parallel", "pipeline_parallel", "vocab_parallel", "transformer",
             "all"]
    assert parse_results(proc.stdout) == {(p, r): True for p in parts for r in range(ranks)}, proc.stdout
    for run in ["tp", "tp+loss", "tp+loss+sp"]:      # the losses side by side, at every size of the world
        for k in range(1, ranks + 1):
            assert re.search(rf"^\[lab:transformer\] {re.escape(run)}, {k} ranks?\s+(\d+\.\d{{6}}\s+){{5}}\d\.\de[-+]\d\d$",
                             proc.stdout, re.M), (run, k, proc.stdout)
    assert re.search(r"^\[lab:bandwidth\] all_reduce\s+4096\s", proc.stdout, re.M), proc.stdout
    assert (tmp_path / "out" / f"bandwidth-gloo-{ranks}ranks.csv").is_file()
    assert "FutureWarning" not in proc.stderr      # the collectives' current names


def test_the_lab_imports_as_its_package_docstring_says():
    may_import = {"common": set(), "collectives": {"lab.common"}, "bandwidth": {"lab.common"},
                  "mlp": {"lab.common"}, "data_parallel": {"lab.common", "lab.mlp"},
                  "tensor_parallel": {"lab.common", "lab.mlp"}, "pipeline_parallel": {"lab.common", "lab.mlp"},
                  "gpt": {"lab.common"}, "mappings": {"lab.common"},
                  "vocab_parallel": {"lab.common", "lab.gpt", "lab.mappings"},
                  "gpt_parallel": {"lab", "lab.mappings", "lab.vocab_parallel"},
                  "transformer": {"lab", "lab.common", "lab.mappings"},
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


# --- the transformer: tensor, loss and sequence parallel against the single-device GPT ---------------

# Odd per-rank sizes so a transposed or misplaced slice shows: at 4 ranks 15 vocabulary ids, 3 rows of
# the sequence, 1 head of 12 columns and 9 MLP columns each.
GPT = dict(vocab_size=60, seq_len=12, hidden=48, n_heads=4, ffn=36, n_layers=2, batch_size=2, n_padding=2,
           dropout=0.1, seed=3)
GPT_TOL = dict(rtol=1e-7, atol=1e-10)       # float64 on both sides: only the summation order differs
# How the single-device weights are cut, written from the layouts: (dimension, in which modes).
CUTS = {"w_q": -1, "b_q": -1, "w_k": -1, "b_k": -1, "w_v": -1, "b_v": -1, "w_o": 0, "w_fc1": -1, "b_fc1": -1,
        "w_fc2": 0}
CUTS_LOSS_PARALLEL = {"wte": 0, "w_head": -1}


def _gpt_step(rank, world_size, cfg, mode_name, planted=None):
    """One step of the tensor-parallel GPT in float64 on this rank: the loss, every shard's gradient,
    the collectives called, and the bytes held; or the error, where a planted mistake made one."""
    from lab import gpt, gpt_parallel, mappings
    from lab.transformer import saved_bytes
    cfg = gpt.GPTConfig(**cfg)
    mode = next(m for m in gpt_parallel.MODES if m.name == mode_name)
    undo = plant(planted) if planted else (lambda: None)
    try:
        params = gpt_parallel.init_shards(cfg, mode, "cpu", torch.float64)
        inputs, targets = gpt.make_batch(cfg, "cpu")
        mappings.CALLS.clear()
        loss, activations = saved_bytes(lambda: gpt_parallel.loss_of(params, inputs, targets, cfg, mode), params)
        gpt_parallel.backward(loss, params, mode)
    except Exception as e:  # noqa: BLE001 - a planted mistake may break the shapes: that is caught too
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        undo()
    return {"loss": loss.item(), "grads": {k: p.grad.tolist() for k, p in params.items()},
            "calls": list(mappings.CALLS), "activations": activations,
            "params": sum(p.numel() * p.element_size() for p in params.values())}


def plant(mistake):
    """Make one mistake a student makes; returns what undoes it."""
    from lab import gpt_parallel, mappings, vocab_parallel
    if mistake == "no max all-reduce":          # no max subtracted at all: exp(z) overflows at z near 1e4
        target, name, value = vocab_parallel, "_max_over_vocab", lambda z: torch.zeros(z.shape[:-1], dtype=z.dtype)
    elif mistake == "local max only":           # the local max, never all-reduced
        target, name, value = vocab_parallel, "_max_over_vocab", lambda z: z.max(dim=-1).values
    elif mistake == "target mask off by one slice":
        original = vocab_parallel._target_in_slice
        target, name, value = vocab_parallel, "_target_in_slice", lambda t, start, w: original(t, start + w, w)
    elif mistake == "heads not divided":
        target, name, value = gpt_parallel, "local_heads", lambda cfg: cfg.n_heads
    elif mistake == "row-parallel output not reduced":
        target, name, value = mappings.ReduceFromTensorParallelRegion, "apply", staticmethod(lambda x: x)
    elif mistake == "sequence parallel without its all-gather":
        target, name, value = mappings.GatherFromSequenceParallelRegion, "apply", staticmethod(lambda x: x)
    elif mistake == "LayerNorm gradients not all-reduced":
        original = gpt_parallel.sequence_parallel_weights
        target, name = gpt_parallel, "sequence_parallel_weights"
        value = lambda params, mode: original({k: p for k, p in params.items() if "ln" not in k}, mode)  # noqa: E731
    else:
        raise ValueError(f"no such mistake: {mistake}")
    if name in vars(target):
        before = vars(target)[name]
        setattr(target, name, value)
        return lambda: setattr(target, name, before)
    setattr(target, name, value)                # a method the class inherits (Function.apply)
    return lambda: delattr(target, name)


def single_device_gpt(cfg):
    """The first step's loss and gradients of the GPT on one process, in float64."""
    from lab import gpt
    c = gpt.GPTConfig(**cfg)
    params = {k: v.double().requires_grad_() for k, v in gpt.init_params(c, "cpu").items()}
    inputs, targets = gpt.make_batch(c, "cpu")
    loss = torch.nn.functional.cross_entropy(gpt.forward(params, inputs, c).reshape(-1, c.vocab_size),
                                             targets.reshape(-1), ignore_index=-100)
    loss.backward()
    return loss.item(), {k: p.grad for k, p in params.items()}


def expected_shard(name, full, mode_name, rank, n):
    cuts = dict(CUTS, **(CUTS_LOSS_PARALLEL if "loss" in mode_name else {}))
    dim = cuts.get(name.split(".")[-1])
    if dim is None:
        return full
    k = full.shape[dim] // n
    return full[rank * k:(rank + 1) * k] if dim == 0 else full[..., rank * k:(rank + 1) * k]


def matches(got, want_loss, want_grads, mode_name, rank, n):
    """None where one rank's step equals the single-device one, else what differs."""
    if "error" in got:
        return got["error"]
    if abs(got["loss"] - want_loss) > 1e-9 * abs(want_loss):
        return f"loss {got['loss']} vs {want_loss}"
    for name, g in got["grads"].items():
        want = expected_shard(name, want_grads[name], mode_name, rank, n)
        if not torch.allclose(torch.tensor(g, dtype=torch.float64), want, **GPT_TOL):
            return f"gradient of {name}"
    return None


def _gpt_modes(rank, world_size, cfg):
    return {mode: _gpt_step(rank, world_size, cfg, mode) for mode in ("tp", "tp+loss", "tp+loss+sp")}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world_size", [2, 4])
def test_the_parallel_transformer_equals_the_single_device_one(world_size):
    """Tensor parallel, with loss parallel, with sequence parallel (and seeded dropout on): the loss
    and every shard's gradient equal the single-device model's slices; sequence parallel swaps the
    all-reduces of activations for reduce-scatters and all-gathers; memory per rank shrinks."""
    want_loss, want_grads = single_device_gpt(GPT)
    results = run_world(world_size, _gpt_modes, GPT, timeout=80)
    for rank, got in enumerate(results):
        for mode, step in got.items():
            assert matches(step, want_loss, want_grads, mode, rank, world_size) is None, (mode, rank)
        activation_ops = lambda mode: {op for op, shape in got[mode]["calls"] if len(shape) == 3}   # noqa: E731
        assert activation_ops("tp") == activation_ops("tp+loss") == {"all_reduce"}
        assert activation_ops("tp+loss+sp") == {"all_gather", "reduce_scatter"}
        assert got["tp+loss+sp"]["activations"] < got["tp+loss"]["activations"]
        assert got["tp+loss"]["params"] < got["tp"]["params"]
    single = sum(g.numel() for g in want_grads.values()) * 8
    split = sum(g.numel() for k, g in want_grads.items() if k.split(".")[-1] in {**CUTS, **CUTS_LOSS_PARALLEL})
    assert results[0]["tp+loss"]["params"] == single - split * 8 * (world_size - 1) // world_size


def _vocab_cases(rank, world_size):
    from lab.vocab_parallel import CASES, run_case
    return [[x if isinstance(x, float) else x.tolist() for x in run_case(case)] for case in CASES]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 4])
def test_vocab_parallel_cross_entropy_equals_torchs_on_the_full_logits(world_size):
    """Logits near 1e4, every target in one rank's slice, padding, a vocabulary of 52: the loss, the
    logits' gradient and the embedding's gradient, each rank's slice, against F.cross_entropy."""
    from lab.vocab_parallel import CASES, case_data
    results = run_world(world_size, _vocab_cases, timeout=50)
    for i, case in enumerate(CASES):
        tokens, targets, E, W = case_data(case)
        E.requires_grad_()
        z = E[tokens] @ W + case.shift
        z.retain_grad()
        loss = torch.nn.functional.cross_entropy(z, targets, ignore_index=-100)
        loss.backward()
        k = case.vocab_size // world_size
        if case.one_slice:
            assert targets.min() >= (world_size - 1) * k       # all of them the last rank's
        for rank, got in enumerate(results):
            got_loss, dz, dE = got[i]
            assert got_loss == pytest.approx(loss.item(), rel=1e-12), (case.name, rank)
            torch.testing.assert_close(torch.tensor(dz, dtype=torch.float64), z.grad[:, rank * k:(rank + 1) * k])
            torch.testing.assert_close(torch.tensor(dE, dtype=torch.float64), E.grad[rank * k:(rank + 1) * k])


def _planted(rank, world_size, cfg):
    from lab.vocab_parallel import CASES, run_case
    out = {}
    for mistake in ("no max all-reduce", "local max only", "target mask off by one slice"):
        undo = plant(mistake)
        try:
            out[mistake] = {case.name: run_case(case)[0] for case in CASES[:2]}
        finally:
            undo()
    for mistake, mode in (("heads not divided", "tp"), ("row-parallel output not reduced", "tp"),
                          ("sequence parallel without its all-gather", "tp+loss+sp"),
                          ("LayerNorm gradients not all-reduced", "tp+loss+sp")):
        out[mistake] = (mode, _gpt_step(rank, world_size, cfg, mode, planted=mistake))
    return out


@pytest.mark.timeout(60)
def test_the_comparison_catches_the_mistakes_students_make():
    """Each planted mistake fails the comparison with the single-device run; leaving out the max
    passes on ordinary logits and is caught only near 1e4, which is why that check is there."""
    from lab.vocab_parallel import CASES, reference
    ordinary, near_1e4 = (reference(case)[0] for case in CASES[:2])
    want_loss, want_grads = single_device_gpt(GPT)
    for rank, got in enumerate(run_world(2, _planted, GPT, timeout=50)):
        no_max = got["no max all-reduce"]
        assert no_max["ordinary"] == pytest.approx(ordinary, rel=1e-12)
        assert not no_max["logits near 1e4"] == pytest.approx(near_1e4)      # inf or nan
        for mistake in ("local max only", "target mask off by one slice"):
            assert not got[mistake]["ordinary"] == pytest.approx(ordinary, rel=1e-6), mistake
        for mistake in ("heads not divided", "row-parallel output not reduced",
                        "sequence parallel without its all-gather", "LayerNorm gradients not all-reduced"):
            mode, step = got[mistake]
            assert matches(step, want_loss, want_grads, mode, rank, 2) is not None, (mistake, rank)
        # the LayerNorm gradients are the only thing wrong there: the loss alone would not show it
        mode, step = got["LayerNorm gradients not all-reduced"]
        assert step["loss"] == pytest.approx(want_loss, rel=1e-12)
        assert matches(step, want_loss, want_grads, mode, rank, 2) == "gradient of h0.ln1_w"
        # without the all-gather each rank's heads see only its s/n rows, and the reduce-scatter
        # cuts those again: the residual's [s/n] rows meet [s/n^2], which no run gets past
        assert "must match the size" in got["sequence parallel without its all-gather"][1]["error"]


def test_sizes_that_do_not_split_are_refused_with_both_numbers():
    from lab.gpt import GPTConfig
    from lab.gpt_parallel import MODES, check_sizes
    with pytest.raises(ValueError, match=r"^n_heads \(6\) is not divisible by world_size \(4\)$"):
        check_sizes(GPTConfig(n_heads=6, hidden=48), 4, MODES[0])
    with pytest.raises(ValueError, match=r"^vocab_size \(50\) is not divisible by world_size \(4\)$"):
        check_sizes(GPTConfig(vocab_size=50), 4, MODES[1])
    check_sizes(GPTConfig(vocab_size=50), 4, MODES[0])          # the vocabulary is not split there
    with pytest.raises(ValueError, match=r"^seq_len \(10\) is not divisible by world_size \(4\)$"):
        check_sizes(GPTConfig(seq_len=10), 4, MODES[2])
    with pytest.raises(ValueError, match=r"^hidden \(30\) is not divisible by n_heads \(4\)$"):
        GPTConfig(hidden=30)
