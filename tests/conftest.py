"""Fixtures shared by the grader's test modules."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.corpus import REFERENCE, ROOT


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory):
    """(log, err) of a real run of the reference on 4 ranks, as slurm/run-local.sh leaves them."""
    out = tmp_path_factory.mktemp("run")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    subprocess.run([str(ROOT / "slurm" / "run-local.sh"), "--nproc", "4", "--out", str(out), str(REFERENCE)],
                   cwd=ROOT, env=env, check=True, capture_output=True, timeout=180)
    log = next(out.glob("*.log"))
    return log.read_text(), log.with_suffix(".err").read_text()
