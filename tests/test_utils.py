"""The provided utilities: shape guard, comparison line, single-write logging, batch, closed form, init."""

import hashlib
import io
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from tests.worlds import ROOT, UTILS_DIR, closed_form_step

sys.path.insert(0, str(UTILS_DIR))
import utils


class CountingStdout(io.StringIO):
    def __init__(self):
        super().__init__()
        self.writes = 0

    def write(self, s):
        self.writes += 1
        return super().write(s)


def test_log_writes_each_line_with_one_write(monkeypatch):
    out = CountingStdout()
    monkeypatch.setattr(sys, "stdout", out)
    utils.log("[DataParallel][Rank 3] Tensors match: True")
    assert out.getvalue() == "[DataParallel][Rank 3] Tensors match: True\n"
    assert out.writes == 1


def test_compare_tensors_logs_one_line_per_call_and_returns_the_verdict(monkeypatch):
    out = CountingStdout()
    monkeypatch.setattr(sys, "stdout", out)
    a = torch.zeros(3, 4)
    assert utils.compare_tensors(a, a + 1e-7, prefix="DataParallel") is True
    assert utils.compare_tensors(a, a + 1.0) is False
    assert utils.compare_tensors(a, torch.zeros(4, 3), prefix="FullColumnParallel") is False
    lines = out.getvalue().splitlines()
    assert out.writes == 3
    assert re.fullmatch(r"\[DataParallel\]\[Rank 0\] Tensors match: True \| Max diff: 1\.0\d+e-07 \| "
                        r"Mean diff: 1\.0\d+e-07", lines[0])
    assert lines[1] == "[Rank 0] Tensors match: False | Max diff: 1.000000e+00 | Mean diff: 1.000000e+00"
    assert lines[2] == ("[FullColumnParallel][Rank 0] Tensors match: False | Max diff: inf | "
                        "Mean diff: inf | shapes [3, 4] vs [4, 3]")


def test_check_accepts_wildcards_and_names_the_wrong_dimension():
    x = torch.randn(32, 64, 10)
    utils.check(x, [32, 64, 10])
    utils.check(x, (32, -1, 10))
    utils.check(None, [1])
    with pytest.raises(AssertionError, match="At dimension 1: expected 128, but got 64"):
        utils.check(x, [32, 128, 10])
    with pytest.raises(AssertionError, match="Expected shape length 2 but got 3"):
        utils.check(x, [32, 64])
    with pytest.raises(AssertionError, match="not a torch.Tensor"):
        utils.check([1, 2], [2])


def test_divide_says_which_numbers_do_not_divide():
    assert utils.divide(128, 4, "global_batch_size", "world_size") == 32
    with pytest.raises(ValueError, match=r"^global_batch_size \(128\) is not divisible by world_size \(3\)$"):
        utils.divide(128, 3, "global_batch_size", "world_size")


def test_create_batch_is_seeded_shaped_and_device_independent():
    x1, y1 = utils.create_batch(8, 5, 3, seed=11, device="cpu")
    x2, y2 = utils.create_batch(8, 5, 3, seed=11)
    assert x1.shape == (8, 5) and y1.shape == (8, 3)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    torch.manual_seed(11)
    assert torch.equal(x1, torch.randn(8, 5)) and torch.equal(y1, torch.randn(8, 3))
    x3, _ = utils.create_batch(8, 5, 3, seed=12, device="cpu")
    assert not torch.equal(x1, x3)


@pytest.mark.parametrize("seed,b,i,o,lr", [(42, 128, 64, 32, 0.5), (7, 52, 13, 12, 0.1)])
def test_expected_weight_is_the_closed_form(seed, b, i, o, lr):
    got = utils.expected_weight(seed, b, i, o, lr, device="cpu")
    assert got.dtype == torch.float32 and got.shape == (i, o)
    torch.testing.assert_close(got.double(), closed_form_step(seed, b, i, o, lr), rtol=1e-6, atol=1e-6)


def test_get_device_without_a_process_group_is_cpu_here():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert utils.get_device() == torch.device("cpu")


def _init_script(tmp_path):
    script = tmp_path / "assignment4.py"
    script.write_text(
        f"import sys; sys.path.insert(0, {str(UTILS_DIR)!r})\n"
        "import torch.distributed as dist\n"
        "from utils import init_distributed, get_device\n"
        "rank, local_rank, world_size = init_distributed()\n"
        "print(rank, local_rank, world_size, get_device(), dist.get_backend(), flush=True)\n"
        "dist.destroy_process_group()\n")
    return script


def test_init_distributed_without_torchrun_makes_a_one_rank_world(tmp_path):
    script = _init_script(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    init, ready, result = proc.stdout.splitlines()
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    assert re.fullmatch(rf"\[Distributed Init\] Rank 0 initialized on node N/A \(.+\) on cpu \| backend gloo "
                        rf"\| world size 1 \| torch \S+ \| code sha256 {digest}", init)
    assert ready == "[Rank 0] All ranks ready!"
    assert result == "0 0 1 cpu gloo"


def test_what_a_rank_prints_after_init_reaches_its_file_before_the_rank_is_killed(tmp_path):
    """A job killed at its time limit (a hang) keeps every line its ranks printed: stdout to a file is
    line-buffered once init_distributed ran, not written in 8 KB blocks at exit."""
    script = tmp_path / "assignment4.py"
    script.write_text(
        f"import sys, time; sys.path.insert(0, {str(UTILS_DIR)!r})\n"
        "from utils import init_distributed\n"
        "init_distributed()\n"
        "print('about to hang in part 3')\n"
        "open('printed', 'w').close()\n"
        "time.sleep(600)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PYTHONUNBUFFERED")}
    with open(tmp_path / "job.log", "w") as out:
        proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=out, cwd=tmp_path)
        try:
            deadline = time.monotonic() + 60
            while not (tmp_path / "printed").exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            proc.kill()   # as Slurm's time limit ends a job that hangs
            proc.wait()
    assert (tmp_path / "job.log").read_text().splitlines()[-1] == "about to hang in part 3"


def test_init_distributed_refuses_an_unknown_backend(tmp_path):
    script = _init_script(tmp_path)
    env = dict(os.environ, A4_BACKEND="mpi")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "A4_BACKEND must be 'gloo' or 'nccl', not 'mpi'" in proc.stderr


def test_utils_never_needs_the_literal_cuda_in_student_code():
    skeleton = (ROOT / "assignment_4" / "assignment4.py").read_text()
    assert '"cuda"' not in skeleton and "'cuda'" not in skeleton and ".cuda()" not in skeleton
