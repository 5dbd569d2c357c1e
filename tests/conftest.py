"""Fixtures shared by the test modules (one real run of the reference per session), and the line
between the kit's tests and the stock course's.

Every test reads points, checks and tolerances from the rubric it grades with (grader/rubric.yaml,
or a rubric of its own), so the suite holds for a course that changes its rubric. The few tests
marked `stock_rubric` check the stock course's own checks and numbers (that its four-node check
catches a shard picked by LOCAL_RANK, that its points add up to 100); they run only while
grader/rubric.yaml is the stock one (STOCK_RUBRIC, its Rubric.digest()) and are skipped, by name,
under any other. With A4_STOCK_RUBRIC=required (this repository's CI) a changed rubric is an error.

What CI must not skip has a switch of its own, set by .ci/run: with A4_REQUIRE_SLURM=1 a test
marked slurm that would skip (no cluster) fails instead; with A4_REQUIRE_TA_CONFIGS=1 so does a
sandbox configuration that cannot be made here (`skip_unless_required`).
"""

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grader.rubric import load_rubric
from tests.corpus import REFERENCE, ROOT

# Rubric.digest() of the stock course's grader/rubric.yaml (comments and layout do not count). A
# deliberate change of the stock course changes it here too, and the stock_rubric tests with it.
STOCK_RUBRIC = "e4eca506891f23b78839887251281eb3ecd387178c1e67952e1b20888d4faaf1"
NOT_STOCK = ("grader/rubric.yaml is not the stock course's rubric: this test checks the stock course's "
             "own checks and numbers")


PR_SET_CHILD_SUBREAPER = 36   # prctl(2): orphans below this process are re-parented to it, not to init


def pytest_configure(config):
    # A process a test started, directly or not, stays this process's descendant even after its
    # parent died (a grader killed mid-batch, a zygote that lost it): `own_processes` finds it, and
    # never another suite's or another user's processes on the same machine.
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    config.stock_rubric = load_rubric().digest() == STOCK_RUBRIC
    if not config.stock_rubric and os.environ.get("A4_STOCK_RUBRIC") == "required":
        raise pytest.UsageError(f"A4_STOCK_RUBRIC=required, but grader/rubric.yaml's digest is "
                                f"{load_rubric().digest()}, not the stock {STOCK_RUBRIC}: after a deliberate "
                                f"change of the stock rubric, update STOCK_RUBRIC in tests/conftest.py")


# The files that take longest, longest first (measured on 2 cores: minutes each, where the rest take
# seconds). `make test` hands whole files to its two processes in collection order
# (--dist loadfile --no-loadscope-reorder), so the long ones start at once and the short ones fill
# in around them: both processes finish together instead of one running a long file handed out last.
LONGEST_FIRST = ("test_grader.py", "test_reliability.py", "test_collectives.py", "test_release.py", "test_sandbox.py",
                 "test_scale.py", "test_machines.py", "test_megatron.py", "test_forgery.py", "test_package.py",
                 "test_report.py", "test_integrity_planted.py", "test_handin_failures.py", "test_parse_bomb.py",
                 "test_channels.py", "test_hangs.py", "test_gradescope.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))   # stable: a file's own order stays
    stock = [item for item in items if item.get_closest_marker("stock_rubric")]
    config.stock_tests = [item.nodeid for item in stock]
    if not config.stock_rubric:
        for item in stock:
            item.add_marker(pytest.mark.skip(reason=NOT_STOCK))


def own_processes(marker: bytes) -> list:
    """The live processes below this one (pytest, or its xdist worker) whose command line holds
    `marker`: what a test left behind, never what other suites run beside it."""
    parents, commands = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            commands[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":             # a zombie is gone, only not yet reaped
            parents[int(pid)] = int(ppid)
    ours, found = {os.getpid()}, True
    while found:
        found = False
        for pid, ppid in parents.items():
            if ppid in ours and pid not in ours:
                ours.add(pid)
                found = True
    return sorted(pid for pid in ours - {os.getpid()} if marker in commands.get(pid, b""))


def skip_unless_required(switch: str, reason: str):
    """Skip with `reason`, or fail where `switch`=1 says this must run here."""
    if os.environ.get(switch) == "1":
        pytest.fail(f"{switch}=1, and this cannot run here: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under A4_REQUIRE_SLURM=1 a skipped slurm test, however it skipped, is a failure."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and item.get_closest_marker("slurm") and os.environ.get("A4_REQUIRE_SLURM") == "1":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"A4_REQUIRE_SLURM=1, and this Slurm test would have been skipped: {reason}"


def pytest_report_header(config):
    state = "the stock one" if config.stock_rubric else "changed: the stock_rubric tests are skipped"
    return f"grader/rubric.yaml: {state}"


STOCK_REPORTED = []   # stock_rubric tests as their reports came in (under xdist, from the workers)


def pytest_runtest_logreport(report):
    if report.when == "setup" and "stock_rubric" in report.keywords:
        STOCK_REPORTED.append(report.nodeid)


# The suites `make test` leaves to targets of their own (each a marker; the Makefile's APART), and
# what each holds: its summary says what it left out and which target runs it.
APART = {
    "slurm": "the Slurm tests against a local cluster; make test-slurm runs them",
    "course": "the suite run again in an instructor's changed copy of the kit (tests/test_course_rubric.py); "
              "make test-course runs it",
    "configs": "grading as an ordinary user, on other machines' configurations, installed elsewhere and from a "
               "student's fresh folder; make test-configs runs them",
    "hostile": "a hand-in's attacks on the sandbox, the grader and other hand-ins; make test-hostile runs them",
    "scale": "batches at scale and through failure (job arrays, a killed grader, hangs under load, --jobs); "
             "make test-scale runs them",
    "lms": "every LMS there and back (downloads, the gradebook, import and feedback files, the staff report, "
           "Gradescope); make test-lms runs them",
    "student": "the student's side (torchrun runs, the lab, check and package, the release from a fresh copy); "
               "make test-student runs them",
    "optional": "the optional parts (5 to 8) each graded in a batch with it on (the reference at every check, the "
                "skeleton, each mistake); make test-optional runs them",
}
def left_out(markexpr: str) -> list:
    """The markers of APART whose tests `-m markexpr` leaves out: the expression is false for a test
    that carries that marker alone (markers are names; and, or, not and parentheses join them)."""
    tokens = re.findall(r"[()]|[A-Za-z_]\w*", markexpr or "")
    if not tokens:
        return []
    out = []
    for marker in APART:
        said = " ".join(t if t in ("(", ")", "and", "or", "not") else str(t == marker) for t in tokens)
        if not eval(said, {"__builtins__": {}}):   # only True, False, and, or, not and parentheses
            out.append(marker)
    return out


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say what -m left out, suite by suite, and name the stock-course tests, so that after a change
    of the rubric their skips are expected."""
    for marker in left_out(config.option.markexpr):
        terminalreporter.write_line(f"left out by -m, the tests marked {marker}: {APART[marker]}")
    tests = list(dict.fromkeys(getattr(config, "stock_tests", []) + STOCK_REPORTED))
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
