"""Memory that no process's Pss shows, held to the world's limit (grader.rerun.sandbox.outside) or
refused (grader.rerun.rank.syscalls), and one out-of-memory cause getting one verdict whichever
layer caught it: the world's cgroup (root, cgroup v1 or v2) or its watchdog (an ordinary user
without a cgroup).

Each attack of tests/hostile.py's MEMORY_ATTACKS runs in a real 2-rank world on one warm executor,
graded by the configuration's own Python and kit, under a small limit (MEMORY_LIMIT_MB) that each
rank's HOG_MB alone stays under and both together pass: the part must be out of memory, saying
why, and end before the hand-in's hold is over. Each of REFUSED_MEMORY must crash at its first call,
refused.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import yaml

from grader.limits import RANK_OPEN_FILES, SOCKETS_SHARE, TMP_FILES_PER_MB
from grader.rerun.rank import syscalls
from grader.rerun.sandbox import cgroup, memory, outside, sockets
from tests import tas
from tests.conftest import skip_unless_required
from tests.corpus import FULL, ROOT, Files, zip_bytes
from tests.hostile import HOLD_S, MEMORY_ATTACKS, REFERENCE, REFUSED_MEMORY, inject, memory_attack
from tests.test_sandbox import CONFIG_PARAMS, _ta_or_skip

pytestmark = pytest.mark.hostile   # make test-hostile runs these; make test leaves them out

MEMORY_LIMIT_MB = 800
SOCKET_ATTACKS = ("unix_socket_queues", "tcp_and_udp_buffers", "netlink_queues")
HOG_MB = 600   # each of the 2 ranks: 1200 MB together, unchecked
RUBRIC = {"limits": {"memory_mb": MEMORY_LIMIT_MB, "tmp_mb": HOG_MB + 64},
          "timeouts": {"part": 60, "world_start": 60}}
# No rank may raise its socket buffers past the machine's maximum (that needs CAP_NET_ADMIN), open
# more files than RLIMIT_NOFILE lets it, nor make more files than its scratch may hold: the part
# must pass.
BOUNDED = ("import resource, socket\n"
           "for option in (getattr(socket, 'SO_SNDBUFFORCE', 32), getattr(socket, 'SO_RCVBUFFORCE', 33)):\n"
           "    try:\n        socket.socket().setsockopt(socket.SOL_SOCKET, option, 1 << 30)\n"
           "        raise RuntimeError('LEAK a rank forced a socket buffer past the maximum')\n"
           "    except PermissionError:\n        pass\n"
           "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
           f"assert soft == hard == {RANK_OPEN_FILES}, (soft, hard)\n"
           # nor make more empty files (each about 1 KB of the kernel's that no block shows) than its
           # /tmp and /dev/shm may hold
           "import errno, os\nmade = 0\nfor top in ('/tmp', '/dev/shm'):\n    try:\n"
           "        while made < 10 ** 6:\n"
           "            os.close(os.open(f'{top}/a4-empty-{made}', os.O_CREAT | os.O_WRONLY))\n            made += 1\n"
           "    except OSError as e:\n        assert e.errno == errno.ENOSPC, e\n"
           f"assert made <= 2 * {RUBRIC['limits']['tmp_mb'] * TMP_FILES_PER_MB}, made\n"
           # and, should the kernel's out-of-memory killer pick in the world, it picks the rank or
           # what the rank started, never the world's supervisor: the rank may not put itself behind it
           "def oom_rank():\n    with open('/proc/self/oom_score_adj') as f:\n        return f.read().strip()\n"
           f"assert oom_rank() == '{cgroup.OOM_SCORE_ADJ}', oom_rank()\n"
           "pid = os.fork()\nif pid == 0:\n"
           f"    os._exit(0 if oom_rank() == '{cgroup.OOM_SCORE_ADJ}' else 1)\n"
           "assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, 'a child left the line'\n"
           "try:\n    with open('/proc/self/oom_score_adj', 'w') as f:\n        f.write('-1')\n"
           "    raise RuntimeError('LEAK a rank put itself behind its supervisor in the killer line')\n"
           "except PermissionError:\n    pass\n")

# Run by the configuration's Python in its kit: the baseline part of each hand-in (argv[1], a JSON
# {name: path}) in a 2-rank world of one warm executor; a world the machine failed runs again once,
# as grader.pipeline.grade does.
RUN = """\
import dataclasses, json, sys, time
from pathlib import Path
from grader.rerun.check import prepare_code, run_check
from grader.rerun.executor import WarmExecutor
from grader.rubric import load_rubric
rubric = load_rubric(Path(sys.argv[2]))
check = dataclasses.replace(rubric.checks[0], world_size=2)
executor = WarmExecutor("auto", rubric.limits)
found = {"isolation": executor.start()}
for name, path in json.loads(sys.argv[1]).items():
    started = time.monotonic()
    code = prepare_code(Path(path))
    run = run_check(executor, code, check, rubric, Path(sys.argv[3]), parts=["baseline"])["baseline"]
    if run.status.value == "infra_error":   # the machine's failure (gloo's join): run again, as grading does
        run = run_check(executor, code, check, rubric, Path(sys.argv[3]), parts=["baseline"])["baseline"]
    found[name] = {"status": run.status.value, "detail": run.detail, "output": run.output[-1500:],
                   "exceptions": [r.exception for r in run.ranks.values()], "seconds": time.monotonic() - started}
executor.close()
print(json.dumps(found))
"""


def run_worlds(config: str, codes: dict, tmp) -> dict:
    """name -> the baseline part's result of each of `codes` (name -> assignment4.py's text), graded
    as `config` grades, under RUBRIC."""
    ta = _ta_or_skip(config)
    try:
        tmp = ta.home / "memory" if ta else tmp
        (tmp / "scratch").mkdir(parents=True)
        paths = {}
        for name, code in codes.items():
            paths[name] = str(tmp / f"{name}.py")
            (tmp / f"{name}.py").write_text(code)
        (tmp / "rubric.yaml").write_text(yaml.safe_dump(RUBRIC))
        args = ["-c", RUN, json.dumps(paths), str(tmp / "rubric.yaml"), str(tmp / "scratch")]
        if ta:
            subprocess.run(["chown", "-R", f"{ta.user}:{ta.user}", str(tmp)], check=True)
            proc = ta.run([str(ta.python), *args], timeout=600)
        else:
            proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    finally:
        if ta is not None:
            tas.remove(ta)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=CONFIG_PARAMS[:2])
def memory_worlds(request, tmp_path_factory) -> dict:
    # The TCP and UDP buffers last: what they held stays in the machine's pool until their namespace
    # is gone, some seconds after their world, and the pool's growth is read over the others too.
    names = sorted([*MEMORY_ATTACKS, *REFUSED_MEMORY], key=lambda name: name == "tcp_and_udp_buffers")
    codes = {"bounded": inject(REFERENCE.read_text(), BOUNDED)}
    codes.update({name: memory_attack(name, HOG_MB) for name in names})
    # The machine's TCP and UDP memory (one pool, every namespace's), sampled while the worlds run.
    found, growth_mb = grown_while(sockets.pool, run_worlds, request.param, codes, tmp_path_factory.mktemp("memory"))
    return {**found, "pool_growth_mb": growth_mb}


def grown_while(reading, run, *args) -> tuple:
    """(run(*args), how many MB `reading()` (bytes) rose at most above its start meanwhile, sampled
    every 2 ms)."""
    before, peak, done = reading(), [0], threading.Event()

    def sample():
        while not done.wait(0.002):
            peak[0] = max(peak[0], reading())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        return run(*args), (peak[0] - before) >> 20
    finally:
        done.set()
        sampler.join()


@pytest.mark.timeout(700)
@pytest.mark.parametrize("attack", sorted(MEMORY_ATTACKS))
def test_memory_outside_pss_is_held_to_the_worlds_limit(memory_worlds, attack):
    measured = memory_worlds[attack]
    assert measured["status"] == "oom", measured
    # Sockets are held to their share of it first: the machine's socket memory is one pool.
    assert measured["detail"] == (memory.sockets_verdict(MEMORY_LIMIT_MB) if attack in SOCKET_ATTACKS else
                                  f"the ranks and their children used more than {MEMORY_LIMIT_MB} MB "
                                  "(limits.memory_mb, the world's limit)"), measured
    assert measured["seconds"] < HOLD_S + 30, measured


@pytest.mark.timeout(700)
def test_a_worlds_sockets_take_only_their_share_of_the_machines_pool(memory_worlds):
    # Two ranks queued 1200 MB in TCP and UDP buffers, unchecked; each world may hold a sixteenth of
    # its limit there (50 MB): what it took past that before its watchdog's next poll is all the
    # pool ever lent it, never the other worlds' share.
    assert 0 < memory_worlds["pool_growth_mb"] < MEMORY_LIMIT_MB // 2, memory_worlds["pool_growth_mb"]


@pytest.mark.timeout(700)
@pytest.mark.parametrize("attack", sorted(REFUSED_MEMORY))
def test_memory_the_watchdog_could_not_count_is_refused_to_every_rank(memory_worlds, attack):
    measured = memory_worlds[attack]
    assert measured["status"] == "crashed", measured
    assert measured["exceptions"] and all(e.startswith("PermissionError: [Errno 1]") for e in measured["exceptions"]), measured
    assert f"{syscalls.CALLS} refused" in memory_worlds["isolation"]["limits"]


@pytest.mark.timeout(700)
def test_a_rank_cannot_force_socket_buffers_or_open_files_past_its_bounds(memory_worlds):
    assert memory_worlds["bounded"]["status"] == "passed", memory_worlds["bounded"]


# Every connection made first, then filled at once as fast as loopback takes it: hundreds of MB can
# be queued between two of the watchdog's readings (20 ms apart), which alone then stop the world
# only once they have been lent.
TCP_BURST = (
    "import socket, time\nheld, chunk, queued = [], bytes(1 << 16), 0\n"
    "listener = socket.socket()\nlistener.bind(('127.0.0.1', 0))\nlistener.listen(128)\n"
    "for _ in range(100):\n"
    "    client = socket.create_connection(listener.getsockname())\n    server, _ = listener.accept()\n"
    "    client.setblocking(False)\n    held += [client, server]\n"
    "for client in held[0::2]:\n"
    "    try:\n        while queued < {hog_mb} << 20:\n            queued += client.send(chunk)\n"
    "    except BlockingIOError:\n        pass\n")


def _v1_tcp_limit() -> bool:
    """Whether a root world here gets a cgroup v1 memory folder with a TCP limit."""
    made = cgroup.WorldCgroup.make() if os.geteuid() == 0 else None
    try:
        return bool(made and made.version == 1 and "memory" in made.folders
                    and os.path.exists(os.path.join(made.folders["memory"], "memory.kmem.tcp.limit_in_bytes")))
    finally:
        made and made.remove()


@pytest.mark.timeout(600)
def test_a_burst_of_tcp_memory_stays_within_the_worlds_share_where_its_cgroup_holds_tcp(tmp_path):
    """Root on cgroup v1: the world's memory cgroup holds its TCP sockets to their share of its
    limit in the kernel (memory.kmem.tcp.limit_in_bytes), however fast they are filled: the
    machine's TCP memory grows by about that share, never the 1200 MB two ranks tried to queue."""
    if not _v1_tcp_limit():
        pytest.skip("no cgroup v1 memory folder with a TCP limit for a world here (cgroup v2 charges "
                    "sockets to memory.max; an ordinary user's world has its watchdog alone)")
    code = inject(REFERENCE.read_text(), TCP_BURST.format(hog_mb=HOG_MB) + f"time.sleep({HOLD_S})\n")
    found, growth_mb = grown_while(sockets._tcp_memory, run_worlds, "root", {"tcp_burst": code}, tmp_path)
    share_mb = MEMORY_LIMIT_MB // SOCKETS_SHARE
    assert found["tcp_burst"]["status"] in ("passed", "oom"), found
    assert 0 < growth_mb < 2 * share_mb, (growth_mb, share_mb)


# ---- the readings themselves, in this process --------------------------------------------------

def test_a_socket_is_read_by_its_inode_with_what_it_holds():
    """A unix socket pair's queue (charged to its sender) and a TCP connection's unread bytes, on
    this machine's namespace: each found by its inode, holding at least what was queued."""
    a, b = socket.socketpair()
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    try:
        queued = {}
        for sender, name in ((a, "unix"), (client, "tcp")):
            sender.setblocking(False)
            queued[name] = 0
            try:
                while queued[name] < 4 << 20:
                    queued[name] += sender.send(bytes(1 << 16))
            except BlockingIOError:
                pass
        time.sleep(0.1)
        found = sockets.held()
        assert found.get(os.fstat(a.fileno()).st_ino, 0) >= queued["unix"] > 0, (found, queued)
        # by the two ends' inodes, or (the machine's TCP memory small) by the machine's total under inode 0
        ends = (os.fstat(client.fileno()).st_ino, os.fstat(server.fileno()).st_ino, 0)
        tcp = sum(found.get(inode, 0) for inode in ends)
        assert tcp >= queued["tcp"] > 0, (found, queued)
        assert not sockets.refused
    finally:
        for s in (a, b, listener, client, server):
            s.close()


def test_memory_files_held_open_count_once_each_by_their_blocks():
    """A memfd of 64 MB, open twice, counts 64 MB once; a file on disk counts nothing."""
    fd = os.memfd_create("a4-test")
    again = os.dup(fd)
    os.posix_fallocate(fd, 0, 64 << 20)
    try:
        reading = outside.Outside(own=False)
        before_close = reading.read([os.getpid()])
        assert 64 << 20 <= reading.by_pid[os.getpid()] < 65 << 20, reading.by_pid
        assert before_close >= 64 << 20
    finally:
        os.close(fd)
        os.close(again)
    assert reading.read([os.getpid()]) < before_close - (63 << 20)


# ---- one cause, one verdict ---------------------------------------------------------------------

# Rank 0 fills 1000 MB of shared memory in the baseline (no data limit of one process counts it),
# past the world's 800 MB, while the other ranks go on to the next part: as root the world's cgroup
# or the watchdog catches it, as an ordinary user the watchdog alone. Only the baseline may be
# charged, with one verdict.
OOM_ONCE = ("import mmap, time\nif dist.get_rank() == 0:\n"
            "    held = mmap.mmap(-1, 1000 << 20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)\n"
            "    time.sleep(10)\n")
GRADE_RUBRIC = {"checks": [{"name": "default"},
                           {"name": "two-ranks", "hidden": True, "world_size": 2, "seed": 1234,
                            "global_batch_size": 52, "input_dim": 13, "output_dim": 12, "accumulation_steps": 2}],
                "public_world_sizes": [4], "limits": {"memory_mb": MEMORY_LIMIT_MB},
                "timeouts": {"part": 30, "process_group": 5, "world_start": 60, "handin": 300}}


def grade_as(config: str, handin: bytes, tmp, *extra) -> dict:
    """The grading.json of `handin` (zip bytes), graded by `python -m grader grade` as `config`
    grades, with the command line's `extra` arguments."""
    ta = _ta_or_skip(config)
    try:
        tmp = ta.home / "grade" if ta else tmp
        (tmp / "inbox").mkdir(parents=True)
        (tmp / "inbox" / "oom_once.zip").write_bytes(handin)
        (tmp / "rubric.yaml").write_text(yaml.safe_dump(GRADE_RUBRIC))
        args = ["-m", "grader", "grade", str(tmp / "inbox"), "--out", str(tmp / "out"), "--jobs", "1",
                "--rubric", str(tmp / "rubric.yaml"), "--quiet", *extra]
        if ta:
            subprocess.run(["chown", "-R", f"{ta.user}:{ta.user}", str(tmp)], check=True)
            proc = ta.run([str(ta.python), *args], timeout=600)
        else:
            proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(next((tmp / "out" / "students").glob("*/grading.json")).read_text())
    finally:
        if ta is not None:
            tas.remove(ta)


@pytest.mark.configs
@pytest.mark.timeout(1300)
def test_an_out_of_memory_hand_in_gets_one_verdict_whichever_layer_caught_it(reference_run, tmp_path):
    handin = zip_bytes(Files(code=inject(REFERENCE.read_text(), OOM_ONCE), log=reference_run[0], err=reference_run[1]))
    graded = {config: grade_as(config, handin, tmp_path / config) for config in ("root", "user")}
    said = {config: {part: (v["status"], v["message"]) for part, v in r["parts"].items()}
            for config, r in graded.items()}
    assert said["root"]["baseline"][0] == "oom", said
    assert f"used more than {MEMORY_LIMIT_MB} MB" in said["root"]["baseline"][1], said
    assert said["root"] == said["user"]
    # Only the part rank 0 ran out of memory in is charged, not the one the other ranks had gone on to.
    assert {status for part, (status, _) in said["root"].items() if part != "baseline"} == {"passed"}, said
    assert graded["root"]["score"] == graded["user"]["score"] < FULL, {c: r["score"] for c, r in graded.items()}
    held = {config: r["isolation"]["memory"] for config, r in graded.items()}
    assert "cgroup of the world's own" in held["root"] and "no memory cgroup" in held["user"], held


# Without the sandbox a world's ranks share the machine's /dev/shm, whose files the watchdog never
# counts as the world's: files rank 0 fills there and closes are seen by the world's own cgroup
# alone (root), which charges them. Its kill must read as the world out of memory, at that part, as
# the watchdog's would: not as a rank killed by a signal. Every rank waits in the part: no process
# holds those files, so the rank that held most, whose part is charged, may be any of them.
SHM_FILES = ("import os, time\n"
             "if dist.get_rank() == 0:\n    for i in range(40):\n"
             "        with open(f'/dev/shm/{prefix}{i}', 'wb') as f:\n"
             "            os.posix_fallocate(f.fileno(), 0, 25 << 20)\ntime.sleep(10)\n")


# Where the grader holds CAP_SYS_RESOURCE (root, but for containers that drop it), a rank's place
# first in the killer's line is a floor the hand-in cannot lower.
CAP_SYS_RESOURCE = 24
FLOOR = ("try:\n    with open('/proc/self/oom_score_adj', 'w') as f:\n        f.write('0')\n"
         "    raise RuntimeError('a rank of root lowered its oom_score_adj')\nexcept PermissionError:\n    pass\n")


def _has_capability(number: int) -> bool:
    with open("/proc/self/status") as f:
        effective = next(line.split()[1] for line in f if line.startswith("CapEff:"))
    return bool(int(effective, 16) >> number & 1)


@pytest.mark.timeout(600)
def test_without_the_sandbox_the_kernels_kill_in_the_worlds_own_cgroup_reads_as_out_of_memory(reference_run, tmp_path):
    if os.geteuid() != 0:
        skip_unless_required("A4_REQUIRE_TA_CONFIGS", "a world's own cgroup without the sandbox needs root")
    prefix = f"a4-hog-{os.getpid()}-"   # this run's own names: another run's may be there meanwhile
    floor = FLOOR if _has_capability(CAP_SYS_RESOURCE) else ""   # without it, the rank may lower it to 0
    code = inject(REFERENCE.read_text(), floor + SHM_FILES.replace("{prefix}", prefix))
    handin = zip_bytes(Files(code=code, log=reference_run[0], err=reference_run[1]))
    graded = grade_as("root", handin, tmp_path, "--sandbox", "off")
    assert "cgroup of the world's own" in graded["isolation"]["memory"], graded["isolation"]
    baseline = graded["parts"]["baseline"]
    assert baseline["status"] == "oom" and baseline["message"].startswith(
        f"check 'default': ran out of memory: the ranks and their children used more than {MEMORY_LIMIT_MB} MB "
        "(limits.memory_mb, the world's limit)"), (baseline["status"], baseline["message"])
    assert {v["status"] for part, v in graded["parts"].items() if part != "baseline"} == {"passed"}, graded["parts"]
    assert not any(name.startswith(prefix) for name in os.listdir("/dev/shm"))
