"""Fixtures shared by the test modules (one real run of the reference per session), and the line
between the kit's tests and the stock course's.

Every test reads points, checks and tolerances from the rubric it grades with (grader/rubric.yaml,
or a rubric of its own), so the suite holds for a course that changes its rubric. The few tests
marked `stock_rubric` check the stock course's own checks and numbers (that its four-node check
catches a shard picked by LOCAL_RANK, that its points add up to 100); they run only while
grader/rubric.yaml is the stock one (STOCK_RUBRIC, its Rubric.digest()) and are skipped, by name,
under any other. With A4_STOCK_RUBRIC=required (this repository's CI) a changed rubric is an error.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grader.rubric import load_rubric
from tests.corpus import REFERENCE, ROOT

# Rubric.digest() of the stock course's grader/rubric.yaml (comments and layout do not count). A
# deliberate change of the stock course changes it here too, and the stock_rubric tests with it.
STOCK_RUBRIC = "5620d5e1a4721c70a8fd8a8c104ee426ee3d9e17b0130e8708e2af2cb3ce4776"
NOT_STOCK = ("grader/rubric.yaml is not the stock course's rubric: this test checks the stock course's "
             "own checks and numbers")


def pytest_configure(config):
    config.stock_rubric = load_rubric().digest() == STOCK_RUBRIC
    if not config.stock_rubric and os.environ.get("A4_STOCK_RUBRIC") == "required":
        raise pytest.UsageError(f"A4_STOCK_RUBRIC=required, but grader/rubric.yaml's digest is "
                                f"{load_rubric().digest()}, not the stock {STOCK_RUBRIC}: after a deliberate "
                                f"change of the stock rubric, update STOCK_RUBRIC in tests/conftest.py")


def pytest_collection_modifyitems(config, items):
    stock = [item for item in items if item.get_closest_marker("stock_rubric")]
    config.stock_tests = [item.nodeid for item in stock]
    if not config.stock_rubric:
        for item in stock:
            item.add_marker(pytest.mark.skip(reason=NOT_STOCK))


def pytest_report_header(config):
    state = "the stock one" if config.stock_rubric else "changed: the stock_rubric tests are skipped"
    return f"grader/rubric.yaml: {state}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Name the stock-course tests, so that after a change of the rubric their skips are expected."""
    tests = getattr(config, "stock_tests", [])
    if not tests:
        return
    ran = "ran against the stock grader/rubric.yaml" if config.stock_rubric else \
        "skipped: grader/rubric.yaml is not the stock one"
    terminalreporter.section(f"stock-course tests (marker stock_rubric): {len(tests)}, {ran}")
    for nodeid in tests:
        terminalreporter.write_line(nodeid)


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
