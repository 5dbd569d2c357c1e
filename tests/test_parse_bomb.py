"""The grader's own parsing under attack, and a batch that outlives its grader.

A hand-in's code is parsed by the grader only under caps and limits (grader.outline): a 24 KB zip
of a 19 MB assignment4.py of one-letter lines (17 GB to parse) is refused at unpacking, and code
under the caps that nests deep enough to crash a parser is parsed in a child held to limits. Each
costs its own hand-in's grade and nothing else, in a real batch beside correct hand-ins, as root
and as an ordinary `useradd` user, with the grader's own peak memory measured. A grader killed
mid-batch (SIGKILL) leaves what it graded on disk, and the next `grade` goes on from there.
"""

import ast
import io
import json
import os
import resource
import signal
import subprocess
import sys
import time
import zipfile

import pytest
import yaml

from grader import outline
from grader.intake import handin as handins
from grader.rubric import load_rubric
from tests import tas
from tests.conftest import own_processes
from tests.corpus import FULL, REFERENCE, ROOT, Files, zip_bytes
from tests.hostile import parse_bombs
from tests.test_sandbox import CONFIG_PARAMS, _ta_or_skip

pytestmark = pytest.mark.hostile   # make test-hostile runs these; make test leaves them out

# A public check and a hidden one: a hidden check is where the grader parses a hand-in's code.
RUBRIC = {"checks": [{"name": "default"},
                     {"name": "two-ranks", "hidden": True, "world_size": 2, "seed": 1234,
                      "global_batch_size": 52, "input_dim": 13, "output_dim": 12, "accumulation_steps": 2}],
          "public_world_sizes": [4],
          "timeouts": {"part": 5, "process_group": 3, "world_start": 30, "handin": 120}}
PEAK_MB = 1500   # the grader's own process, whatever a hand-in holds (the 19 MB file asked 17 GB of it)
# `python -m grader`, writing its own peak memory (ru_maxrss, KB) into the file named first.
MEASURED = ("import atexit, resource, runpy, sys\n"
            "peak = sys.argv.pop(1)\n"
            "atexit.register(lambda: open(peak, 'w').write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)))\n"
            "runpy.run_module('grader', run_name='__main__', alter_sys=True)\n")


def _unpack(tmp_path, data: bytes):
    handin = handins.Handin(name="bomb.zip", student="bomb", sha256="", zip_bytes=data)
    return handins.unpack(handin, tmp_path / "files", load_rubric().files)


def test_code_over_the_caps_is_refused_before_anything_parses_it(tmp_path):
    data, words = parse_bombs("", "")["parse_bomb_lines"]
    started = time.monotonic()
    with pytest.raises(handins.HandinError, match=words) as refused:
        _unpack(tmp_path, data)
    assert "bomb.zip: assignment4.py is 19,531 KB, over the 256 KB" in str(refused.value)
    assert time.monotonic() - started < 20
    # Under the bytes but over the lines, counted as Python counts them (a lone \r ends a line too).
    for i, newline in enumerate(("\n", "\r")):
        code = zip_bytes(Files(code=REFERENCE.read_text() + "pass" + newline * 10_000))
        with pytest.raises(handins.HandinError, match=r"has [\d,]+ lines, over the 10000 .*files\.max_code_lines"):
            _unpack(tmp_path / str(i), code)
    assert _unpack(tmp_path / "reference", zip_bytes(Files(code=REFERENCE.read_text()))).files["assignment"]


def _direct_spans(source: str) -> dict:
    found = {"<module>": [(1, source.count("\n") + 1)]}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.setdefault(node.name, []).append((node.lineno, node.end_lineno))
    return found


def test_spans_are_parsed_in_a_child_held_to_its_limits(monkeypatch):
    code = REFERENCE.read_text()
    assert outline.spans(code) == _direct_spans(code)
    module_only = {"<module>": [(1, code.count("\n") + 1)]}
    monkeypatch.setattr(outline, "PARSE_MB", 8)   # below what the child's parse needs: its limit ends it
    assert outline.spans(code) == module_only
    monkeypatch.undo()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Past the caps, as if intake had let them through: the child dies of them (Python 3.10's parser
    # overflows its stack on the deep one; later ones refuse it; the 19 MB file asks 17 GB), not the grader.
    bomb = zipfile.ZipFile(io.BytesIO(parse_bombs("", "")["parse_bomb_lines"][0])).read("assignment4.py").decode()
    crash = "x = " + "a+" * 300_000 + "a\n"
    started = time.monotonic()
    for text in (crash, bomb, "def f(:\n"):
        assert outline.spans(text) == {"<module>": [(1, text.count("\n") + 1)]}
    assert time.monotonic() - started < 120
    # Under the caps and deep: parsed or refused by the parser (by version), the process goes on.
    deep = zipfile.ZipFile(io.BytesIO(parse_bombs("", "")["parse_bomb_deep"][0])).read("assignment4.py").decode()
    found = outline.spans(deep)
    assert found["<module>"] == [(1, deep.count("\n") + 1)] and set(found) <= set(_direct_spans(code))
    assert outline.tree(crash) is None or sys.version_info < (3, 11)   # 3.10 builds it, on the deep stack
    assert outline.tree(code) is not None
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 400 * 1024


def _grade(ta, out, inbox, rubric, peak, jobs=2):
    """The `grade` command as the TA (root when None), its peak memory written into `peak`."""
    args = ["-c", MEASURED, str(peak), "grade", str(inbox), "--out", str(out), "--jobs", str(jobs),
            "--rubric", str(rubric), "--quiet"]
    if ta:
        return ta.run([str(ta.python), *args], timeout=900)
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module", params=CONFIG_PARAMS[:2])   # root, and an ordinary user
def bombed(request, reference_run, tmp_path_factory):
    """A batch of two correct hand-ins and the parse bombs, graded as root or as an ordinary user."""
    config = request.param
    ta = _ta_or_skip(config)
    try:
        tmp = ta.home / "work" if ta else tmp_path_factory.mktemp("bombed")
        inbox, out = tmp / "inbox", tmp / "out"
        inbox.mkdir(parents=True)
        (tmp / "rubric.yaml").write_text(yaml.safe_dump(RUBRIC))
        correct = zip_bytes(Files(code=REFERENCE.read_text(), log=reference_run[0], err=reference_run[1]))
        bombs = parse_bombs(*reference_run)
        for name, data in {"alice": correct, "bob": correct, **{n: d for n, (d, _) in bombs.items()}}.items():
            (inbox / f"{name}.zip").write_bytes(data)
        if ta:
            subprocess.run(["chown", "-R", f"{ta.user}:{ta.user}", str(tmp)], check=True)
        started = time.monotonic()
        proc = _grade(ta, out, inbox, tmp / "rubric.yaml", tmp / "peak")
        elapsed = time.monotonic() - started
        results = {p.parent.name: json.loads(p.read_text()) for p in (out / "students").glob("*/grading.json")}
        yield dict(config=config, proc=proc, elapsed=elapsed, results=results, bombs=bombs, out=out,
                   peak_mb=int((tmp / "peak").read_text()) / 1024 if (tmp / "peak").exists() else None)
    finally:
        if ta is not None:
            tas.remove(ta)


@pytest.mark.torch
@pytest.mark.timeout(900)
def test_the_batch_finishes_and_the_grader_stays_small(bombed):
    proc = bombed["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "machine" not in proc.stderr
    assert set(bombed["results"]) == {"alice", "bob", *bombed["bombs"]}
    grades = (bombed["out"] / "grades.csv").read_text()
    assert all(name in grades for name in bombed["results"])
    assert bombed["peak_mb"] is not None and bombed["peak_mb"] < PEAK_MB, bombed["peak_mb"]
    assert bombed["elapsed"] < 600   # the canary and four hand-ins (a 4 MB bomb once held its slot 719 s)


@pytest.mark.torch
def test_correct_hand_ins_beside_the_bombs_get_full_marks(bombed):
    for name in ("alice", "bob"):
        r = bombed["results"][name]
        assert (r["status"], r["score"]) == ("graded", FULL), r["message"]


@pytest.mark.torch
def test_the_line_bomb_is_refused_quickly_as_its_own_verdict(bombed):
    r = bombed["results"]["parse_bomb_lines"]
    assert (r["status"], r["score"]) == ("invalid", None)   # no score: the student hands in again
    assert bombed["bombs"]["parse_bomb_lines"][1] in r["message"]
    assert "hand in the assignment4.py you wrote" in r["message"]
    assert r["seconds"] < 30


@pytest.mark.torch
def test_the_deep_bomb_costs_only_its_own_points(bombed):
    r = bombed["results"]["parse_bomb_deep"]
    assert r["status"] == "graded" and r["score"] == 0, r["message"]
    for part in load_rubric().part_ids:
        checks = r["parts"][part]["checks"]
        assert checks and all(c["status"] != "passed" for c in checks), part
        assert any(c["hidden"] for c in checks), part   # the hidden check ran: the grader parsed the code
    assert bombed["bombs"]["parse_bomb_deep"][1] in json.dumps(r)


@pytest.mark.torch
@pytest.mark.timeout(900)
def test_a_grader_killed_mid_batch_goes_on_from_what_it_graded(reference_run, tmp_path):
    """SIGKILL the grader once a hand-in is graded: that result is whole on disk, and the next
    `grade` reuses it and grades the rest, grades.csv listing everyone."""
    inbox, out = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    correct = zip_bytes(Files(code=REFERENCE.read_text(), log=reference_run[0], err=reference_run[1]))
    for name in ("ann", "ben"):
        (inbox / f"{name}.zip").write_bytes(correct)
    rubric = tmp_path / "rubric.yaml"
    rubric.write_text(yaml.safe_dump({**RUBRIC, "checks": RUBRIC["checks"][:1]}))
    args = ["-m", "grader", "grade", str(inbox), "--out", str(out), "--jobs", "1", "--rubric", str(rubric), "--quiet"]
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while not list(out.glob("students/*/grading.json")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    graded = {p.parent.name: p.read_bytes() for p in out.glob("students/*/grading.json")}
    assert len(graded) == 1 and not (out / "grades.csv").exists(), sorted(graded)
    for data in graded.values():
        assert json.loads(data)["score"] == FULL
    for _ in range(100):   # the sandbox's helpers die with the grader
        if not own_processes(b"grader.rerun.zygote"):
            break
        time.sleep(0.1)
    assert not own_processes(b"grader.rerun.zygote")
    again = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "graded 1 hand-in(s) and reused 1 earlier result(s)" in again.stdout
    assert {name: (out / "students" / name / "grading.json").read_bytes() for name in graded} == graded
    rows = (out / "grades.csv").read_text()
    assert "ann" in rows and "ben" in rows
    results = [json.loads(p.read_text()) for p in out.glob("students/*/grading.json")]
    assert [r["score"] for r in results] == [FULL] * 2
