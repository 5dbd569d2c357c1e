"""Reading a hand-in's .log and .err cannot stall grading: time linear in the input, bytes read and
lines quoted bounded, a read past its time budget costs only that hand-in's log evidence; and a
fuzz test (Hypothesis) throws generated logs, .err files and zip member names at the readers and the
unpacker."""

import io
import json
import time
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grader.evidence import logtext
from grader.evidence.errfile import parse_err
from grader.evidence.logfile import parse_log
from grader.intake.handin import Handin, HandinError, unpack
from grader.rubric import Files

LOGS = Path(__file__).parent / "data" / "logs"
REFERENCE = (LOGS / "a4_reference.log").read_bytes()
MB = 4 << 20
pytestmark = pytest.mark.filterwarnings("ignore:Duplicate name")   # the fuzzed zips repeat names

# Each line repeats what made a pattern rescan the rest of the line from every occurrence (or a
# traceback be read 64 KB ahead from every "Traceback" line): several MB of it, on one line or many.
PATHOLOGICAL = {
    "srun: on one .err line": (parse_err, b"srun: " * (MB // 6)),
    "slurmstepd without a space": (parse_err, b"slurmstepd" * (MB // 10)),
    "[srun] on one .log line": (parse_log, b"[srun] " * (MB // 7)),
    "[srun] host= without a value": (parse_log, b"[srun] host=" * (MB // 12)),
    "oom_kill on one line": (parse_err, b"oom_kill " * (MB // 9)),
    "Killed on one line": (parse_err, b"Killed " * (MB // 7)),
    "a flood of Traceback lines": (parse_err, b"Traceback (most recent call last):\n" * (MB // 35)),
    "Traceback on one line": (parse_err, b"Traceback (most recent call last):" * (MB // 34)),
    "nccl identifiers": (parse_err, b"ncclA" * (MB // 5)),
    "Root Cause headers": (parse_err, b"Root Cause (first observed failure):rank" * (MB // 40)),
    "init lines without their ')'": (parse_log, b"[Distributed Init] Rank 0 initialized on node a (" * (MB // 49)),
    "a [Job] line of one word": (parse_log, b"[Job] " + b"a" * MB),
    "a [Rank] line of spaces": (parse_log, b"[Rank 1]" + b" " * MB),
    "a claim's diff of MBs": (parse_log, b"[Rank 1] Tensors match: True | Max diff: " + b"9" * MB),
    "a colour code never closed": (parse_log, b"\x1b[" + b"0" * MB),
    "a long line without newline": (parse_log, b"x" * MB),
    "NUL bytes": (parse_log, b"\0" * MB),
    "NUL bytes in an .err": (parse_err, b"\0" * MB),
    "invalid UTF-8": (parse_err, b"\xff\xfe\x80" * (MB // 3)),
    "invalid UTF-8 in a log": (parse_log, b"\x80\xc3" * (MB // 2)),
    "only newlines": (parse_err, b"\n" * MB),
}


@pytest.mark.parametrize("name", PATHOLOGICAL)
def test_several_mb_of_a_pathological_line_are_read_in_seconds(name):
    parse, data = PATHOLOGICAL[name]
    started = time.monotonic()
    report = parse(data)
    seconds = time.monotonic() - started
    assert seconds < 10, f"{name}: {seconds:.1f} s for {len(data) >> 20} MB"
    assert "parse_error" not in report.flag_codes() and "log_timeout" not in report.flag_codes()
    assert len(json.dumps(report.to_dict())) < 20_000   # what it quotes is clipped


def test_a_pathological_err_still_says_what_it_says():
    slurm = parse_err(b"srun: " * (MB // 6) + b"error: CANCELLED AT 2025-01-01 DUE TO TIME LIMIT\n")
    assert slurm.slurm and slurm.slurm[0].endswith("... (cut)") and "slurm_time_limit" not in slurm.flag_codes()
    oom = parse_err(b"oom_kill " * (MB // 9) + b"\n")
    assert oom.oom and len(oom.oom[0]) <= logtext.LINE_CHARS + len("... (cut)")
    srun = parse_log(b"[srun] rank=0 host=n1 [srun] " * 1000 + b"[srun] host=n2\n" + REFERENCE)
    # both hosts are read, and as the local run's header says 1 node, they are no node evidence
    assert srun.nodes is None and "'[srun] ... host=' lines name 2 hosts" in srun.flags[-1].message


def test_a_log_over_the_byte_limit_is_read_head_and_tail_and_says_it_was_cut(tmp_path):
    junk = b"node1:123:456 [0] NCCL INFO Channel 00/02 : 0 1 2 3\n" * (3 * logtext.LOG_BYTES // 52)
    big = REFERENCE + junk + b"[Job] finished status=0\n"
    path = tmp_path / "big.log"
    path.write_bytes(big)
    read = logtext.read_log(path)
    assert len(read) <= logtext.LOG_BYTES + len(logtext.CUT_MARK) and logtext.CUT_MARK in read
    for report in (parse_log(read), parse_log(big)):
        assert "cut" in report.flag_codes()
        assert all(e.passed for e in report.parts.values())
    assert "cut" not in parse_log(REFERENCE).flag_codes()
    assert "cut" in parse_err(big).flag_codes()


def test_a_read_past_its_time_budget_costs_the_log_evidence_and_nothing_else(monkeypatch):
    assert all(e.passed for e in parse_log(REFERENCE).parts.values())
    monkeypatch.setattr(logtext, "LOG_SECONDS", -1.0)
    report = parse_log(REFERENCE)
    assert report.flag_codes() == ["log_timeout"]
    assert not any(e.passed for e in report.parts.values())
    assert parse_err(b"Traceback (most recent call last):\n  x\nValueError: y\n").flag_codes() == ["log_timeout"]


# ---- fuzz ------------------------------------------------------------------------------------

# Pieces of real logs and of the attacks above, glued in any order, with bytes of any kind between.
PIECES = [b"[srun] ", b"srun: ", b"slurmstepd: ", b"host=", b"node1", b"oom_kill ", b"Killed", b"\n", b"\r\n",
          b" ", b"\t", b"\0", b"\xff", b"\x1b[", b"0;31m", b"Traceback (most recent call last):",
          b"  File \"a.py\", line 1\n", b"ValueError: ", b"[Rank ", b"1]", b"[Data Parallel]", b" done",
          b"Tensors match: ", b"True", b"False", b" | Max diff: ", b"1e-9", b"Not implemented yet",
          b"[Distributed Init] Rank 0 initialized on ", b"node a (h) on cpu | backend gloo | world size 4",
          b" on GPU 0.", b"[Job] id=1 world_size=4", b"[Job] finished status=0", b"SLURM_JOB_ID=4",
          b"Root Cause (first observed failure):", b"rank : 2", b"exitcode : -9", b"NCCL error", b"ncclX",
          b"Watchdog caught collective operation timeout", b"CANCELLED", b"TIME LIMIT", b"out of memory",
          b"SyntaxError: x", b"[rank3]: ", b"2: ", b"^^^"]
LOG = st.lists(st.one_of(st.sampled_from(PIECES), st.binary(max_size=8)), max_size=60).map(b"".join)
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(LOG)
def test_no_generated_log_or_err_makes_a_reader_fail(data):
    for parse in (parse_log, parse_err):
        for given_as in (data, data.decode("utf-8", "replace")):
            report = parse(given_as)
            assert "parse_error" not in report.flag_codes(), report.flags
            json.dumps(report.to_dict())


def _seconds(parse, data) -> float:
    best = float("inf")
    for _ in range(3):   # the least of three, in this process's own CPU time: a shared machine's
        started = time.process_time()   # other work and pauses are not the parser's
        parse(data)
        best = min(best, time.process_time() - started)
    return best


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=12).map(b"".join))
def test_time_per_byte_stays_flat_as_a_generated_log_grows(unit):
    # A complexity check, not a speed goal: n and 32n bytes of the same text take 32x the time if
    # the readers are linear and 1024x if quadratic; 4x of noise over linear still tells them apart.
    n = 1 << 16
    small, large = unit * (n // len(unit) + 1), unit * (32 * n // len(unit) + 1)
    for parse in (parse_log, parse_err):
        t_small, t_large = _seconds(parse, small), _seconds(parse, large)
        assert t_large < max(128 * t_small, 0.5), f"{parse.__name__}: {t_small:.4f} s -> {t_large:.4f} s"


def _zip_of(names) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name in names:
            z.writestr(zipfile.ZipInfo(name), b"[Rank 0] done\n")
    return buffer.getvalue()


NAME = st.one_of(st.text(max_size=40),
                 st.lists(st.sampled_from(["a", "..", ".", "", "/", "\\", "assignment4.py", "x.log", "__MACOSX",
                                           "utils.py", "C:", "\0", "é", " ", "a" * 300]), max_size=6).map("/".join))


@FUZZ
@given(st.lists(NAME, min_size=1, max_size=6))
def test_no_generated_member_name_makes_the_unpacker_fail_otherwise_than_with_a_handin_error(tmp_path_factory, names):
    try:
        data = _zip_of(names)
    except (ValueError, UnicodeEncodeError):   # a name the zip format cannot hold: no such hand-in
        return
    dest = tmp_path_factory.mktemp("unpack")
    try:
        unpacked = unpack(Handin(name="h.zip", student="h", sha256="x", zip_bytes=data), dest / "out", Files())
    except HandinError as e:
        assert str(e)
        return
    for path in unpacked.files.values():
        assert dest / "out" in path.resolve().parents


def test_what_the_fuzz_found_in_the_unpacker_is_a_handin_error_or_unpacks(tmp_path):
    def unpack_names(names, where):
        return unpack(Handin(name="h.zip", student="h", sha256="x", zip_bytes=_zip_of(names)), tmp_path / where,
                      Files())
    with pytest.raises(HandinError, match="no name"):
        unpack_names(["", "assignment4.py"], "empty")
    with pytest.raises(HandinError, match="cannot be unpacked"):   # a file, then a folder of its name
        unpack_names(["a", "a/assignment4.py"], "clash")
    twice = unpack_names(["hw4/hw4/assignment4.py", "hw4/hw4/.stripped0"], "twice")
    assert twice.files["assignment"].read_bytes() == b"[Rank 0] done\n"
