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

from grader.rubric import load_rubric
from tests import tas
from tests.conftest import own_processes, skip_unless_required
from tests.corpus import FULL, REFERENCE, ROOT, Files, refingerprint, zip_bytes
from tests.hostile import ATTACKS, MARKER, all_handins, build, inject, zip_attacks

pytestmark = pytest.mark.hostile   # make test-hostile runs these; make test leaves them out

# Two worlds per hand-in: the public check at 4 ranks only (what each world size finds is
# tests/test_grader.py's), and a hidden check, whose messages must hold no value either.
RUBRIC = {"checks": [{"name": "default"},
                     {"name": "two-ranks", "hidden": True, "world_size": 2, "seed": 1234,
                      "global_batch_size": 52, "input_dim": 13, "output_dim": 12, "accumulation_steps": 2}],
          "public_world_sizes": [4],
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
        while True:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                if self.running:
                    continue
                break   # closing, and the backlog is empty: every connection made before close is counted
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
        """Stop once every connection already made is accepted and read."""
        self.running = False
        self.thread.join()
        self.sock.close()


def escaped_markers(home=None) -> list:
    found = []
    for top in ("/tmp", "/var/tmp", "/dev/shm", str(Path.home()), str(ROOT.parent), *([str(home)] if home else [])):
        for folder, dirs, files in os.walk(top):
            if folder.startswith(("/proc", "/sys")):
                continue
            found += [os.path.join(folder, f) for f in files if MARKER in f]
    return found


def leftover_processes() -> list:
    """The zygotes this test process started, directly or not, that are still alive."""
    return own_processes(b"grader.rerun.zygote")


# Where TAs grade: as root (CI), as an ordinary user with the system's Python, and as an ordinary
# user whose Python and packages live in their private home directory (pyenv, conda, a venv in ~).
CONFIGS = ("root", "user", "user_home")
# root's runs in `make test-hostile`; an ordinary user's two in `make test-configs` (marker configs).
CONFIG_PARAMS = [c if c == "root" else pytest.param(c, marks=pytest.mark.configs) for c in CONFIGS]
# What the TA configurations run: every attack on isolation, and the reference.
ISOLATION_ATTACKS = ("reference", "network", "port_from_graders_environment", "read_secrets", "read_kit_through_proc",
                     "walk_the_file_system", "scan_own_memory", "write_results", "kill_parent",
                     "kill_everything_it_can", "fork_bomb", "daemon_that_escapes_its_group", "top_level_command",
                     "plant_bytecode", "lazy_imports")


def _sandbox_here() -> str:
    from grader.rerun.executor import SandboxUnavailable, WarmExecutor
    executor = WarmExecutor("auto")
    try:
        executor.start()
        return ""
    except SandboxUnavailable as e:
        return str(e)
    finally:
        executor.close()


def _ta_or_skip(config):
    """The TA of `config` (None for root), after checking that this machine can sandbox at all."""
    why = _sandbox_here()
    if why:
        userns = subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True).returncode == 0
        if userns:   # this machine can sandbox: the grader failing to is a bug, not a limitation
            pytest.fail(f"user namespaces work here, yet the grader refuses to run hand-ins: {why}")
        skip_unless_required("A4_REQUIRE_TA_CONFIGS",
                             f"no user namespaces on this machine; the grader refuses to run hand-ins: {why}")
    return ta_for(config)


def ta_for(config):
    """The TA of `config` (None for root), made for the test; skipped where none can be made here."""
    if config == "root":
        return None
    missing = tas.available()
    if missing:
        skip_unless_required("A4_REQUIRE_TA_CONFIGS", f"no TA configuration here: {missing}")
    return tas.ta_setup(config)


@pytest.fixture(scope="module", params=CONFIG_PARAMS)
def hostile(request, reference_run, tmp_path_factory):
    config = request.param
    ta = _ta_or_skip(config)
    try:
        yield _grade_hostile(config, ta, reference_run, tmp_path_factory)
    finally:
        if ta is not None:
            tas.remove(ta)


def _grade_hostile(config, ta, reference_run, tmp_path_factory) -> dict:
    tmp = ta.home / "work" if ta else tmp_path_factory.mktemp("hostile")
    kit = ta.kit if ta else ROOT
    inbox, out = tmp / "inbox", tmp / "out"
    inbox.mkdir(parents=True)
    (tmp / "rubric.yaml").write_text(yaml.safe_dump(RUBRIC))
    listener = Listener()
    values = {"port": listener.port, "reference": str(kit / "assignment_4" / "reference" / "assignment4.py"),
              "rubric": str(kit / "grader" / "rubric.yaml"), "out": str(out)}
    handins = all_handins(values, *reference_run)
    if ta:
        handins = {name: data for name, data in handins.items() if name in ISOLATION_ATTACKS}
    for name, data in handins.items():
        (inbox / f"{name}.zip").write_bytes(data)
    args = ["-m", "grader", "grade", str(inbox), "--out", str(out), "--jobs", "2", "--rubric", str(tmp / "rubric.yaml"),
            "--quiet"]
    before = escaped_markers()
    started = time.monotonic()
    if ta:
        subprocess.run(["chown", "-R", f"{ta.user}:{ta.user}", str(tmp)], check=True)
        proc = ta.run([str(ta.python), *args], timeout=900, env={"A4_TEST_PORT": listener.port})
    else:
        proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=900,
                              env=dict(os.environ, A4_TEST_PORT=str(listener.port)))
    elapsed = time.monotonic() - started
    listener.close()
    results = {p.parent.name: json.loads(p.read_text()) for p in (out / "students").glob("*/grading.json")}
    return dict(config=config, proc=proc, elapsed=elapsed, results=results, listener=listener, handins=handins,
                escaped=[m for m in escaped_markers(ta.home if ta else None) if m not in before], out=out, kit=kit,
                user=ta.user if ta else "root")


@pytest.mark.timeout(900)
def test_the_batch_exits_cleanly_inside_the_sum_of_its_timeouts(hostile):
    proc = hostile["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(hostile["handins"]) >= (28 if hostile["config"] == "root" else len(ISOLATION_ATTACKS))
    assert set(hostile["results"]) == set(hostile["handins"])
    # Every check of every hand-in may wait for its part timeout twice (the retry) and its start-up.
    per_handin = len(RUBRIC["checks"]) * 2 * (len(load_rubric().part_ids) * 5 + 30)
    assert hostile["elapsed"] < per_handin * len(hostile["handins"]) / 2


def test_the_reference_still_gets_full_marks_among_them(hostile):
    r = hostile["results"]["reference"]
    assert r["score"] == FULL and r["status"] == "graded"


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_each_code_attack_gets_its_verdict_and_costs_only_its_part(hostile, name):
    attack = ATTACKS[name]
    if name not in hostile["handins"]:
        pytest.skip(f"{hostile['config']} runs the attacks on isolation only")
    r = hostile["results"][name]
    assert r["status"] == "graded", r["message"]
    baseline = r["parts"]["baseline"]
    assert baseline["status"] in attack.status, (baseline["message"], baseline["checks"][0].get("traceback", "")[-800:])
    assert attack.words in baseline["message"], baseline["message"]
    assert "LEAK" not in json.dumps(r)
    others = {p: r["parts"][p]["status"] for p in load_rubric().part_ids if p != "baseline"}
    expected = {p: "passed" for p in others}
    if attack.base == "three_parts":
        expected["tensor_parallel"] = "not_implemented"
    assert others == expected


@pytest.mark.parametrize("name", sorted(zip_attacks()))
def test_each_zip_attack_is_refused_with_a_message(hostile, name):
    if name not in hostile["handins"]:
        pytest.skip(f"{hostile['config']} runs the attacks on isolation only")
    r = hostile["results"][name]
    assert (r["status"], r["score"]) == ("invalid", None)   # no score: the student hands in again
    assert zip_attacks()[name][1] in r["message"]


def test_nothing_escaped(hostile):
    assert hostile["listener"].connections == 0 and hostile["listener"].received == b""
    assert hostile["escaped"] == []
    assert leftover_processes() == []
    for path in [hostile["out"] / "students" / "reference" / "results.json", hostile["out"] / "grades.csv",
                 hostile["kit"] / "grader" / "rubric.yaml"]:
        assert "TAMPERED" not in path.read_text()


def test_every_result_says_which_isolation_was_active(hostile):
    """Every layer, in every result, whoever grades and wherever their Python lives."""
    for name, r in hostile["results"].items():
        if r["status"] == "invalid":
            continue
        isolation = r["isolation"]
        assert isolation["sandbox"].startswith("bubblewrap"), (name, isolation)
        assert isolation["files"] == "private root: system, Python and the hand-in only", (name, isolation)
        assert isolation["network"] == "own network namespace, loopback only", (name, isolation)
        assert isolation["processes"] == "own PID namespace, one per world", (name, isolation)
        assert isolation["mode"] == "auto" and isolation["problems"] == [], (name, isolation)
        assert isolation["user"] == ("an unprivileged user id of its own per world" if hostile["config"] == "root"
                                     else "the grader's user, in a user namespace of its own"), (name, isolation)


def test_no_hand_in_read_the_kit_or_reached_the_grader(hostile):
    for name, r in hostile["results"].items():
        text = json.dumps(r)
        assert "LEAK" not in text and "BEGIN SOLUTION" not in text and "student_id_pattern" not in text, name


def test_output_floods_are_capped(hostile):
    if "flood_output" not in hostile["handins"]:
        pytest.skip(f"{hostile['config']} runs the attacks on isolation only")
    r = hostile["results"]["flood_output"]
    assert r["parts"]["baseline"]["status"] == "crashed"
    shown = r["parts"]["baseline"]["checks"][0]
    assert not shown["hidden"] and "bytes left out" in shown["traceback"], shown["traceback"][:500]
    assert len(json.dumps(r)) < 200_000


# ---- one executor, one world after another ------------------------------------------------------

def _grade_in_order(config, ta, reference_run, tmp: Path, handins: dict, python=sys.executable) -> dict:
    """Grade `handins` (name -> zip bytes) with one executor (--jobs 1), in the order of their names,
    as root (by `python`) or as `ta`; return name -> grading.json."""
    kit = ta.kit if ta else ROOT
    inbox, out = tmp / "inbox", tmp / "out"
    inbox.mkdir(parents=True)
    # Timeouts a loaded machine cannot run out: this is about what each world finds, not about time.
    (tmp / "rubric.yaml").write_text(yaml.safe_dump({"checks": RUBRIC["checks"][:1], "public_world_sizes": [4],
                                                     "timeouts": dict(RUBRIC["timeouts"], part=60)}))
    for name, data in handins.items():
        (inbox / f"{name}.zip").write_bytes(data)
    args = ["-m", "grader", "grade", str(inbox), "--out", str(out), "--jobs", "1", "--rubric", str(tmp / "rubric.yaml"),
            "--quiet"]
    if ta:
        subprocess.run(["chown", "-R", f"{ta.user}:{ta.user}", str(tmp)], check=True)
        proc = ta.run([str(ta.python), *args], timeout=600)
    else:
        proc = subprocess.run([str(python), *args], cwd=kit, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {p.parent.name: json.loads(p.read_text()) for p in (out / "students").glob("*/grading.json")}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("config", CONFIG_PARAMS)
def test_a_planted_compiled_module_never_reaches_the_next_world(config, reference_run, tmp_path_factory):
    """A hand-in plants an unchecked .pyc of `utils` beside its code and in /tmp, files in /tmp and
    /dev/shm, and makes the folders read only; the correct hand-ins graded after it by the same
    executor (one that does in every part what the sandbox must not notice, then the reference)
    score full marks: each world starts with a new /tmp and /dev/shm, and code loads from source.
    Root's grader runs a Python reached through a link in /tmp (a clone whose .venv links to another):
    each new /tmp has that link again, or every import a part makes late fails."""
    log, err = reference_run
    ta = _ta_or_skip(config)
    python = sys.executable
    try:
        tmp = ta.home / "work" if ta else tmp_path_factory.mktemp("in-order")
        if not ta:
            (tmp / "python").symlink_to(os.path.realpath(sys.prefix))
            python = tmp / "python" / "bin" / Path(sys.executable).name
        values = {"port": 9, "reference": "", "rubric": "", "out": ""}
        handins = {}
        for order, name in (("a", "plant_bytecode"), ("b", "lazy_imports"), ("c", "plant_bytecode"), ("d", "lazy_imports")):
            code = build(name, values, log, err).code
            handins[f"{order}_{name}"] = zip_bytes(Files(code=code, log=refingerprint(log, code), err=err))
        handins["e_reference"] = zip_bytes(Files(code=REFERENCE.read_text(), log=log, err=err))
        results = _grade_in_order(config, ta, reference_run, tmp, handins, python)
    finally:
        if ta is not None:
            tas.remove(ta)
    for name in ("b_lazy_imports", "d_lazy_imports", "e_reference"):
        r = results[name]
        assert (r["status"], r["score"]) == ("graded", FULL), \
            (name, r["message"], {p: v["message"] for p, v in r["parts"].items() if v["status"] != "passed"})
        assert r["isolation"]["scratch"] == "a new /tmp and /dev/shm per world and per rank, the code read only"
    assert {p["status"] for p in results["a_plant_bytecode"]["parts"].values()} == {"passed"}
    assert "LEAK" not in json.dumps(results)


# ---- the memory of a world as a whole ----------------------------------------------------------

FAN_OUT = """\
import os, time
if dist.get_rank() == 0:
    for _ in range(16):
        if os.fork() == 0:
            hog = []
            try:
                for _ in range(40):
                    hog.append(b"x" * (25 << 20))
            except MemoryError:
                pass
            time.sleep(60)
            os._exit(0)
    time.sleep(60)
"""

# Run by the TA's (or root's) own Python in the kit: one world of the fan-out hand-in on a warm
# executor, while the memory of every process below this one (the executor, its zygote, the world)
# is polled. Measured on its own tree, with its own reading of /proc, so that what another test
# process does meanwhile cannot move it, and the watchdog under test is not its own judge.
MEASURE = """\
import dataclasses, json, os, sys, threading, time
from pathlib import Path
from grader.rerun.check import prepare_code, run_check
from grader.rerun.executor import WarmExecutor
from grader.rubric import load_rubric
rubric = load_rubric(Path(sys.argv[2]))
check = dataclasses.replace(rubric.checks[0], world_size=2)
executor = WarmExecutor("auto", rubric.limits)
executor.start()
unreadable = {}   # pid: what /proc/PID/status said of it when its memory could not be read
suspects = {}     # pid: start time, of those unreadable at the last poll

def _stat(pid):   # (parent pid, start time) of `pid`, from /proc/PID/stat; None once it has ended
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None

def below_me():   # {pid: start time} of every process below this one
    stat_of = {int(name): _stat(name) for name in os.listdir("/proc") if name.isdigit()}
    found, todo = {}, [os.getpid()]
    while todo:
        parent = todo.pop()
        for pid, stat in stat_of.items():
            if stat and stat[0] == parent:
                found[pid] = stat[1]
                todo.append(pid)
    return found

def _status(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.rstrip("\\n").split(":\t", 1) for line in f if ":\t" in line)
        return " ".join(f"{k}={fields.get(k, '?')}" for k in ("Name", "State", "Uid", "NSpid"))
    except OSError as e:
        return str(e)

def tree_mb():
    # A process counts as unreadable when it is at two polls in a row, the same process (pid and
    # start time) at both: a pid listed as ours may end and be taken by another user's process
    # before it is read (pids wrap at 32768 on a busy machine), and one poll's miss of a process is
    # not a hole in what the watchdog may count. What /proc/PID/status says of it goes in the message.
    global suspects
    total, now = 0, {}
    for pid, started in below_me().items():
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith(b"Pss:"))
        except PermissionError:
            now[pid] = started
            if suspects.get(pid) == started:
                unreadable[pid] = _status(pid)
        except (OSError, StopIteration, ValueError):
            pass  # it ended between the listing and the reading
    suspects = now
    return total >> 10

before = tree_mb()
highest, running = [before], [True]

def poll():
    while running[0]:
        highest[0] = max(highest[0], tree_mb())
        time.sleep(0.01)

watcher = threading.Thread(target=poll)
watcher.start()
started = time.monotonic()
runs = run_check(executor, prepare_code(Path(sys.argv[1])), check, rubric, Path(sys.argv[3]), parts=["baseline"])
running[0] = False
watcher.join()
executor.close()
print(json.dumps({"status": runs["baseline"].status.value, "detail": runs["baseline"].detail,
                  "raised_mb": highest[0] - before, "unreadable": list(unreadable.values()),
                  "seconds": time.monotonic() - started}))
"""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("config", CONFIG_PARAMS)
def test_a_world_that_fans_out_stays_within_its_memory(config, tmp_path_factory):
    """A rank forks 16 children that each try to fill 1000 MB (each may alone: its data limit is
    the world's, 2400 MB): the memory of the grader's process tree rises by no more than the world's
    limit, and the part is out of memory, saying why."""
    ta = _ta_or_skip(config)
    try:
        tmp = ta.home / "fan-out" if ta else tmp_path_factory.mktemp("fan-out")
        (tmp / "scratch").mkdir(parents=True)
        (tmp / "assignment4.py").write_text(inject(REFERENCE.read_text(), FAN_OUT))
        (tmp / "rubric.yaml").write_text(yaml.safe_dump({"limits": {"memory_mb": 2400},
                                                         "timeouts": {"part": 60, "world_start": 60}}))
        args = ["-c", MEASURE, str(tmp / "assignment4.py"), str(tmp / "rubric.yaml"), str(tmp / "scratch")]
        if ta:
            subprocess.run(["chown", "-R", f"{ta.user}:{ta.user}", str(tmp)], check=True)
            proc = ta.run([str(ta.python), *args], timeout=500)
        else:
            proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=500)
    finally:
        if ta is not None:
            tas.remove(ta)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    assert measured["status"] == "oom", measured
    assert "the ranks and their children used more than 2400 MB" in measured["detail"], measured
    assert measured["unreadable"] == [], measured
    # The watchdog polls, so a world may allocate past the limit between two polls (its docstring);
    # the fan-out unchecked would take several GB.
    assert measured["raised_mb"] <= 2400 + 512, measured


def test_the_leftover_check_counts_a_tests_own_orphans_and_no_one_elses():
    """A zygote-named process beside the checking process (another suite's, say) is not counted; the
    checker's own grandchild is, though its parent exited (it comes back as an orphan)."""
    beside = subprocess.Popen(["bash", "-c", "exec -a grader.rerun.zygote-beside sleep 60"])
    checker = ("import ctypes, subprocess, sys, time\n"
               "ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)\n"
               "from tests.conftest import own_processes\n"
               "subprocess.run(['bash', '-c', '(exec -a grader.rerun.zygote-orphan sleep 60) & exit 0'])\n"
               "time.sleep(0.5)\n"
               "found = own_processes(b'grader.rerun.zygote')\n"
               "print(' '.join(open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')[0].decode() for p in found))\n"
               "for p in found:\n    subprocess.run(['kill', str(p)])\n")
    try:
        done = subprocess.run([sys.executable, "-c", checker], cwd=ROOT, capture_output=True, text=True, timeout=60)
    finally:
        beside.kill()
        beside.wait()
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["grader.rerun.zygote-orphan"]
