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
from pathlib import Path

import pytest

from tests import tas
from tests.corpus import REFERENCE, ROOT
from tests.hostile import build
from tests.test_sandbox import CONFIG_PARAMS, _ta_or_skip

# Run by root's or the TA's own Python in the kit: the hand-ins named on the command line, one after
# another, on one warm executor (one slot) in the given sandbox mode, each at one check's baseline.
GRADE_IN_ORDER = """\
import dataclasses, json, sys
from pathlib import Path
from grader.rerun.check import prepare_code, run_check
from grader.rerun.executor import WarmExecutor
from grader.rubric import load_rubric
mode, world_size, scratch, files = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
rubric = load_rubric()
check = dataclasses.replace(rubric.checks[0], world_size=world_size)
executor = WarmExecutor(mode, rubric.limits)
isolation = executor.start()
found = []
for i, path in enumerate(files):
    (scratch / str(i)).mkdir()
    run = run_check(executor, prepare_code(Path(path)), check, rubric, scratch / str(i), parts=["baseline"])["baseline"]
    found.append({"status": run.status.value, "detail": (run.detail + " " + run.output + " " + str(run.ranks))[-3000:], "isolation": isolation})
executor.close()
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
