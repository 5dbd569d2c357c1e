"""Channels between ranks and between worlds that are not torch.distributed.

A rank that writes what it was served where another rank reads it could compute the whole step
alone: under the sandbox each rank has a /tmp, a /dev/shm, a working folder and SysV IPC of its
own, and cannot reach another's through /proc. Without the sandbox (`--sandbox off`) a world still
ends whole: a daemon that left its process group and files it left in /tmp and /dev/shm are gone
when its world ends, and the next hand-in graded on the same executor gets full marks.

Each runs real worlds in the configurations TAs grade in: root, and an ordinary `useradd` user
(marker configs)."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import tas
from tests.corpus import REFERENCE, ROOT
from tests.hostile import OUTLIVE, SESSION_NICE, build, inject
from tests.test_sandbox import CONFIG_PARAMS, _ta_or_skip, leftover_processes, ta_for

pytestmark = pytest.mark.hostile   # make test-hostile runs these; make test leaves them out

# Run by root's or the TA's own Python in the kit: the hand-ins named on the command line, one after
# another, on one warm executor (one slot) in the given sandbox mode, each at one check's baseline.
GRADE_IN_ORDER = """\
import dataclasses, json, shutil, sys
from pathlib import Path
from grader.rerun.check import prepare_code, run_check
from grader.rerun.executor import WarmExecutor
from grader.rerun.sandbox.namespaces import scratch_dir
from grader.rubric import load_rubric
mode, world_size, files = sys.argv[1], int(sys.argv[2]), sys.argv[4:]
scratch = Path(scratch_dir("a4-test-"))   # as `grade` makes its own: ranks of an id of their own pass
rubric = load_rubric()
check = dataclasses.replace(rubric.checks[0], world_size=world_size)
executor = WarmExecutor(mode, rubric.limits)
isolation = executor.start()
found = []
for i, path in enumerate(files):
    (scratch / str(i)).mkdir()
    run = run_check(executor, prepare_code(Path(path)), check, rubric, scratch / str(i), parts=["baseline"])["baseline"]
    said = f"{run.detail} {run.output} {run.ranks}"[-3000:]
    found.append({"status": run.status.value, "detail": said, "isolation": isolation})
executor.close()
shutil.rmtree(scratch, ignore_errors=True)
print(json.dumps(found))
"""


def grade_in_order(config, tmp_path_factory, codes: list, mode: str = "auto", world_size: int = 2,
                   ta=None) -> list:
    """Grade the hand-ins `codes` (their assignment4.py) in order on one executor, as root or as
    `ta`: a list of {status, detail, isolation}."""
    tmp = ta.home / f"in-order-{mode}" if ta else tmp_path_factory.mktemp(f"in-order-{mode}")
    (tmp / "scratch").mkdir(parents=True)
    files = []
    for i, code in enumerate(codes):
        (tmp / str(i)).mkdir()
        files.append(tmp / str(i) / "assignment4.py")
        files[-1].write_text(code)
    args = ["-c", GRADE_IN_ORDER, mode, str(world_size), str(tmp / "scratch"), *map(str, files)]
    if ta:
        subprocess.run(["chown", "-R", f"{ta.user}:{ta.user}", str(tmp)], check=True)
        proc = ta.run([str(ta.python), *args], timeout=500)
    else:
        proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _code(name: str) -> str:
    return build(name, {"port": 9, "reference": "", "rubric": "", "out": ""}, "", "").code


@pytest.mark.timeout(600)
@pytest.mark.parametrize("config", CONFIG_PARAMS)
def test_ranks_share_no_file_and_no_memory_but_torch_distributed(config, tmp_path_factory):
    """Each of 4 ranks writes a file into every writable place it sees (/tmp, /dev/shm, /var/tmp,
    /run, /, its working folder, $HOME, $TMPDIR) and a SysV shared memory segment, waits, then
    looks for the others', directly and through /proc/PID/root and cwd: none is found (the part
    would crash with LEAK), and its baseline passes."""
    ta = _ta_or_skip(config)
    try:
        [run] = grade_in_order(config, tmp_path_factory, [_code("share_across_ranks")], world_size=4, ta=ta)
    finally:
        if ta is not None:
            tas.remove(ta)
    assert run["status"] == "passed", run["detail"]
    assert run["isolation"]["scratch"] == "a new /tmp and /dev/shm per world and per rank, the code read only"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["auto", "off"])
@pytest.mark.parametrize("config", CONFIG_PARAMS)
def test_a_world_that_lowers_its_sessions_share_of_the_cpu_lowers_no_later_worlds(config, mode, tmp_path_factory):
    """A rank lowers its session's weight (nice 19 in /proc/self/autogroup: the kernel shares the
    CPU between sessions). Its world is a session of its own, so the hand-in graded next on the same
    executor starts at nice 0 again, with the sandbox and without."""
    ta = ta_for(config) if mode == "off" else _ta_or_skip(config)
    looks = inject(REFERENCE.read_text(), f"assert open('{SESSION_NICE}').read().split()[-1] == '0', "
                                          f"'LEAK ' + open('{SESSION_NICE}').read()\n")
    try:
        runs = grade_in_order(config, tmp_path_factory, [_code("lower_its_sessions_priority"), looks, looks],
                              mode=mode, ta=ta)
    finally:
        if ta is not None:
            tas.remove(ta)
    assert [r["status"] for r in runs] == ["passed"] * 3, [r["detail"] for r in runs]


def _left_behind() -> list:
    """Files and folders of the `outlive_the_world` hand-in still in /tmp, /var/tmp or /dev/shm."""
    return sorted(str(p) for top in ("/tmp", "/var/tmp", "/dev/shm") for p in Path(top).glob(f"{OUTLIVE}*"))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("config", CONFIG_PARAMS)
def test_without_the_sandbox_a_world_ends_whole(config, tmp_path_factory):
    """`--sandbox off`: a hand-in leaves a daemon (double fork, setsid) holding memory and every task
    its world may start, and files and a read-only folder in /tmp, /var/tmp and /dev/shm. When its
    world ends nothing of it is left, and the reference graded next on the same executor passes (not
    infra_error for want of tasks, not out of memory)."""
    ta = ta_for(config)
    before = _left_behind()
    try:
        runs = grade_in_order(config, tmp_path_factory, [_code("outlive_the_world"), REFERENCE.read_text()],
                              mode="off", ta=ta)
        left, processes = [p for p in _left_behind() if p not in before], leftover_processes()
    finally:
        if ta is not None:
            tas.remove(ta)
    assert runs[1]["status"] == "passed", runs[1]["detail"]
    assert processes == [] and left == []
    isolation = runs[0]["isolation"]
    assert isolation["sandbox"] == "none" and "ends with its world" in isolation["processes"], isolation
    assert "removed with it" in isolation["scratch"], isolation


@pytest.mark.timeout(600)
@pytest.mark.parametrize("config", CONFIG_PARAMS)
def test_files_a_rank_puts_in_place_of_its_own_hold_up_nothing(config, tmp_path_factory):
    """`--sandbox off`, and the sandbox: a rank puts a FIFO, or a link to /dev/zero, where its
    world's leader reads its output and its record of its collectives (tests/hostile.py:
    FILES_REPLACED). The leader reads neither (it would wait, or read, for ever: the world then
    reads as the grader's failure), and the part passes."""
    ta = _ta_or_skip(config)
    try:
        runs = [run for mode in ("off", "auto") for run in
                grade_in_order(config, tmp_path_factory, [_code("files_replaced")], mode=mode, ta=ta)]
    finally:
        if ta is not None:
            tas.remove(ta)
    assert [run["status"] for run in runs] == ["passed", "passed"], [run["detail"] for run in runs]


# Root's own Python: one world that leaves a daemon and then sleeps, on an executor without the
# sandbox; its cgroup folders are printed first. The test kills this process with SIGKILL mid-world.
KILLED_MID_WORLD = """\
import dataclasses, json, sys
from pathlib import Path
from grader.rerun.check import prepare_code, run_check
from grader.rerun.executor import WarmExecutor
from grader.rerun.sandbox.namespaces import scratch_dir
from grader.rubric import load_rubric
rubric = load_rubric()
# The world must still be running when the test kills this process, however loaded the machine.
rubric = dataclasses.replace(rubric, timeouts=dataclasses.replace(rubric.timeouts, part=900, world_start=900))
executor = WarmExecutor("off", rubric.limits)
executor.start()
print(json.dumps(list(executor._cgroup.folders.values()) if executor._cgroup else []), flush=True)
check = dataclasses.replace(rubric.checks[0], world_size=2)
run_check(executor, prepare_code(Path(sys.argv[1])), check, rubric, Path(scratch_dir("a4-test-")), parts=["baseline"])
"""


def _live(pids) -> list:
    alive = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                alive.append(pid)
        except OSError:
            pass
    return alive


def _threads(pid: int) -> int:
    try:
        return len(list(Path(f"/proc/{pid}/task").iterdir()))
    except OSError:
        return 0


def _in_cgroup(folder: Path) -> list:
    return [int(p) for below in [folder, *folder.rglob("*")] if (below / "cgroup.procs").exists()
            for p in (below / "cgroup.procs").read_text().split()]


@pytest.mark.timeout(600)
def test_a_killed_graders_cgroups_and_what_is_in_them_go_at_the_next_start(tmp_path):
    """`--sandbox off` as root: the grader is killed (SIGKILL) while a world runs that has left a
    daemon. The world's cgroup folders stay behind with the daemon in them; the next executor to
    start removes them, and kills what was in them."""
    code = _code("outlive_the_world")
    assert code.count("os.waitpid(pid, 0)\n        time.sleep(1)\n") == 1
    code = code.replace("os.waitpid(pid, 0)\n        time.sleep(1)\n",
                        "os.waitpid(pid, 0)\n        time.sleep(10 ** 6)\n")
    (tmp_path / "assignment4.py").write_text(code)
    grader = subprocess.Popen([sys.executable, "-c", KILLED_MID_WORLD, str(tmp_path / "assignment4.py")], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    folders = [Path(f) for f in json.loads(grader.stdout.readline())]
    if not folders:
        grader.kill()
        grader.wait()
        pytest.skip("no cgroup for the worlds here: nothing of a killed grader's to remove")
    daemons = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and grader.poll() is None and not daemons:
            time.sleep(0.5)   # until the daemon has its threads
            daemons = [pid for pid in _in_cgroup(folders[0]) if _threads(pid) > 50]
        assert grader.poll() is None, f"the world ended before the test could kill its grader: {grader.stdout.read()}"
    finally:
        grader.kill()
        grader.wait()
    time.sleep(1)
    # What a killed grader leaves: its folders, the daemon alive in them. An executor that another
    # test starts meanwhile may already have removed both (as it should); then the test's own start
    # below finds nothing left, and the end is the same.
    if all(folder.exists() for folder in folders):
        assert _live(daemons), "the daemon ended with the grader: the test proves nothing"
    subprocess.run([sys.executable, "-c", "from grader.rerun.sandbox import cgroup\nc = cgroup.WorldCgroup.make()\n"
                    "c and c.remove()"], cwd=ROOT, check=True, timeout=120)
    time.sleep(0.5)
    assert not any(folder.exists() for folder in folders)
    assert _live(daemons) == []
    for path in _left_behind():   # nothing removes a killed world's files; this test does
        subprocess.run(["chmod", "-R", "u+w", path])
        subprocess.run(["rm", "-rf", path])
