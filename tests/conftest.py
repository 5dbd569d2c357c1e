"""Fixtures shared by the test modules: one real run of the reference per session."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.corpus import REFERENCE, ROOT


@pytest.fixture(scope="session")
def reference_run_files(tmp_path_factory):
    """A real run of the reference on 4 ranks by slurm/run-local.sh: the paths of its .log and .err."""
    out = tmp_path_factory.mktemp("run")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    subprocess.run([str(ROOT / "slurm" / "run-local.sh"), "--nproc", "4", "--out", str(out), str(REFERENCE)],
                   cwd=ROOT, env=env, check=True, capture_output=True, timeout=180)
    log = next(out.glob("*.log"))
    return log, log.with_suffix(".err")


@pytest.fixture(scope="session")
def reference_run(reference_run_files):
    """The same run's .log and .err, as text."""
    log, err = reference_run_files
    return log.read_text(), err.read_text()
