"""The scripts as students run them: torchrun on 4 CPU ranks, and plain python as one rank."""

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grader.parts import PARTS
from grader.rubric import load_rubric
from tests.worlds import REFERENCE, ROOT, SKELETON

pytestmark = pytest.mark.student   # make test-student runs these; make test leaves them out

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
PREFIXES = [p.log_prefix for p in PARTS]   # the reference's main() runs every part, the optional ones too

# Every line the script writes to stdout has one of these shapes.
LINE_SHAPES = [
    r"\[Distributed Init\] Rank \d+ initialized on node \S+ \(.*\) on \S+ \| backend gloo \| "
    r"world size \d+ \| torch \S+ \| code sha256 [0-9a-f]{64}",
    r"\[Rank 0\] All ranks ready!",
    r"\[Rank 0\] Part \d: .*",
    rf"\[({'|'.join(PREFIXES)})\]\[Rank \d+\] "
    r"(Tensors match: (True|False) \| Max diff: \S+ \| Mean diff: \S+|Not implemented yet: TODO in .*)",
    r"\[Rank \d+\] done",
]


def run_script(args, **kwargs):
    env = dict(os.environ, PYTHONUNBUFFERED="1", A4_TIMEOUT_S="60")
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, **kwargs)


def check_every_line_is_whole(stdout):
    for line in stdout.splitlines():
        assert any(re.fullmatch(shape, line) for shape in LINE_SHAPES), f"unexpected or spliced line: {line!r}"


@pytest.mark.timeout(200)
def test_torchrun_reference_on_4_ranks_matches_every_part_on_every_rank():
    proc = run_script([TORCHRUN, "--standalone", "--nproc_per_node=4", str(REFERENCE)])
    assert proc.returncode == 0, proc.stderr
    check_every_line_is_whole(proc.stdout)
    for prefix in PREFIXES:
        for rank in range(4):
            assert re.search(rf"^\[{prefix}\]\[Rank {rank}\] Tensors match: True \|", proc.stdout, re.M), (
                prefix, rank, proc.stdout)
    assert "Tensors match: False" not in proc.stdout
    assert sorted(re.findall(r"^\[Rank (\d)\] done$", proc.stdout, re.M)) == ["0", "1", "2", "3"]
    fingerprint = hashlib.sha256(REFERENCE.read_bytes()).hexdigest()
    assert re.findall(r"code sha256 (\w+)", proc.stdout) == [fingerprint] * 4


@pytest.mark.timeout(200)
def test_torchrun_skeleton_completes_and_reports_every_part_not_implemented():
    proc = run_script([TORCHRUN, "--standalone", "--nproc_per_node=4", str(SKELETON)])
    assert proc.returncode == 0, proc.stderr
    check_every_line_is_whole(proc.stdout)
    for prefix in PREFIXES:
        lines = re.findall(rf"^\[{prefix}\]\[Rank (\d)\] Not implemented yet: TODO in ", proc.stdout, re.M)
        assert sorted(lines) == ["0", "1", "2", "3"], (prefix, proc.stdout)
    assert "Tensors match" not in proc.stdout
    assert len(re.findall(r"^\[Rank \d\] done$", proc.stdout, re.M)) == 4


@pytest.mark.timeout(120)
def test_plain_python_runs_the_reference_as_one_rank():
    env_without_launcher = {k: v for k, v in os.environ.items()
                            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, str(REFERENCE)], cwd=ROOT, env=env_without_launcher,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    check_every_line_is_whole(proc.stdout)
    assert "world size 1" in proc.stdout
    # Every part's lines (one per tensor it compares: Part 5 two, Part 6 three ...), none differing.
    assert set(re.findall(r"^\[(\w+)\]\[Rank 0\] Tensors match: True", proc.stdout, re.M)) == set(PREFIXES)
    assert "Tensors match: False" not in proc.stdout


@pytest.mark.timeout(60)
def test_importing_the_reference_has_no_side_effects():
    code = (
        "import importlib.util, sys, torch.distributed as dist\n"
        f"spec = importlib.util.spec_from_file_location('ref', {str(REFERENCE)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "assert not dist.is_initialized()\n"
        "print(m.global_batch_size, m.input_dim, m.output_dim, m.seed, m.accumulation_steps, m.learning_rate)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rubric = load_rubric()   # the reference's defaults are the rubric's default check
    c = rubric.default_check
    assert proc.stdout.split() == [str(v) for v in (c.global_batch_size, c.input_dim, c.output_dim, c.seed,
                                                     c.accumulation_steps, rubric.learning_rate)]
