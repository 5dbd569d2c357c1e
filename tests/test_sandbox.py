"""Hostile hand-ins, graded in one batch by the real command line: every verdict as expected, a clean
exit inside the sum of the timeouts, and nothing escaped (a listener on 127.0.0.1 hears nothing,
no marker file appears outside, no process is left behind)."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from grader.rerun import sandbox
from grader.parts import PART_IDS
from tests.corpus import REFERENCE, ROOT
from tests.hostile import ATTACKS, MARKER, all_handins, zip_attacks

RUBRIC = {"checks": [{"name": "default"},
                     {"name": "two-ranks", "hidden": True, "world_size": 2, "seed": 1234,
                      "global_batch_size": 52, "input_dim": 13, "output_dim": 12, "accumulation_steps": 2}],
          "timeouts": {"part": 5, "process_group": 3, "world_start": 30, "handin": 120}}


class Listener:
    """A TCP listener on the grader's loopback that counts every connection and byte it gets."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections, self.received = 0, b""
        self.running = True
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while self.running:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.settimeout(1)
            try:
                self.received += conn.recv(1024)
            except OSError:
                pass
            conn.close()

    def close(self):
        self.running = False
        self.thread.join()
        self.sock.close()


def escaped_markers() -> list:
    found = []
    for top in ("/tmp", "/var/tmp", "/dev/shm", str(Path.home()), str(ROOT.parent)):
        for folder, dirs, files in os.walk(top):
            if folder.startswith(("/proc", "/sys")):
                continue
            found += [os.path.join(folder, f) for f in files if MARKER in f]
    return found


def leftover_processes() -> list:
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"grader.rerun.zygote" in cmdline:
            left.append(pid)
    return left


@pytest.fixture(scope="module")
def hostile(reference_run, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    inbox, out = tmp / "inbox", tmp / "out"
    inbox.mkdir()
    (tmp / "rubric.yaml").write_text(yaml.safe_dump(RUBRIC))
    isolation = sandbox.probe()
    full = isolation.pid and isolation.net and isolation.mount and isolation.own_uid
    listener = Listener()
    values = {"port": listener.port, "reference": str(REFERENCE), "rubric": str(ROOT / "grader" / "rubric.yaml"),
              "out": str(out)}
    handins = all_handins(values, *reference_run, full_sandbox=full)
    for name, data in handins.items():
        (inbox / f"{name}.zip").write_bytes(data)
    before = escaped_markers()
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "grader", "grade", str(inbox), "--out", str(out), "--jobs", "2",
                           "--rubric", str(tmp / "rubric.yaml"), "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    elapsed = time.monotonic() - started
    time.sleep(0.5)
    listener.close()
    results = {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/grading.json")}
    return dict(proc=proc, elapsed=elapsed, results=results, listener=listener, handins=handins,
                escaped=[m for m in escaped_markers() if m not in before], isolation=isolation, full=full, out=out)


@pytest.mark.timeout(900)
def test_the_batch_exits_cleanly_inside_the_sum_of_its_timeouts(hostile):
    proc = hostile["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(hostile["handins"]) >= 25
    assert set(hostile["results"]) == set(hostile["handins"])
    # Every check of every hand-in may wait for its part timeout twice (the retry) and its start-up.
    per_handin = len(RUBRIC["checks"]) * 2 * (len(PART_IDS) * 5 + 30)
    assert hostile["elapsed"] < per_handin * len(hostile["handins"]) / 2


def test_the_reference_still_gets_full_marks_among_them(hostile):
    r = hostile["results"]["reference"]
    assert r["score"] == 100 and r["status"] == "graded"


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_each_code_attack_gets_its_verdict_and_costs_only_its_part(hostile, name):
    attack = ATTACKS[name]
    if attack.needs_full_sandbox and not hostile["full"]:
        pytest.skip("needs the full sandbox (PID namespace and an own uid), not available here")
    r = hostile["results"][name]
    assert r["status"] == "graded", r["message"]
    baseline = r["parts"]["baseline"]
    assert baseline["status"] in attack.status, (baseline["message"], baseline["checks"][0].get("traceback", "")[-800:])
    assert attack.words in baseline["message"], baseline["message"]
    assert "LEAK" not in json.dumps(r)
    others = {p: r["parts"][p]["status"] for p in PART_IDS if p != "baseline"}
    expected = {p: "passed" for p in others}
    if attack.base == "three_parts":
        expected["tensor_parallel"] = "not_implemented"
    assert others == expected


@pytest.mark.parametrize("name", sorted(zip_attacks()))
def test_each_zip_attack_is_refused_with_a_message(hostile, name):
    r = hostile["results"][name]
    assert (r["status"], r["score"]) == ("invalid", 0)
    assert zip_attacks()[name][1] in r["message"]


def test_nothing_escaped(hostile):
    assert hostile["listener"].connections == 0 and hostile["listener"].received == b""
    assert hostile["escaped"] == []
    assert leftover_processes() == []
    for path in [hostile["out"] / "reference" / "results.json", hostile["out"] / "grades.csv",
                 ROOT / "grader" / "rubric.yaml"]:
        assert "TAMPERED" not in path.read_text()


def test_every_result_says_which_isolation_was_active(hostile):
    r = hostile["results"]["network"]
    assert r["isolation"]["network"] == ("own network namespace, loopback only" if hostile["isolation"].net
                                         else "NOT isolated")
    assert r["isolation"]["mode"] == "auto"


def test_output_floods_are_capped(hostile):
    r = hostile["results"]["flood_output"]
    assert len(json.dumps(r)) < 200_000
