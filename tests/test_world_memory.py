"""Memory that no process's Pss shows, held to the world's limit (grader.rerun.outside), and one
out-of-memory cause getting one verdict whichever layer caught it: the world's cgroup (root, cgroup
v1 or v2) or its watchdog (an ordinary user without a cgroup).

Each attack of tests/hostile.py's MEMORY_ATTACKS runs in a real 2-rank world, graded by the
configuration's own Python and kit, under a small limit (MEMORY_LIMIT_MB) that each rank's
HOG_MB alone stays under and both together pass: the part must be out of memory, saying why, and
end well before the hand-in's hold is over.
"""

import json
import subprocess
import sys

import pytest
import yaml

from tests import tas
from tests.corpus import ROOT
from tests.hostile import HOLD_S, MEMORY_ATTACKS, memory_attack
from tests.test_sandbox import CONFIG_PARAMS, _ta_or_skip

MEMORY_LIMIT_MB = 800
HOG_MB = 600   # each of the 2 ranks: 1200 MB together, unchecked
RUBRIC = {"limits": {"memory_mb": MEMORY_LIMIT_MB, "tmp_mb": HOG_MB + 64},
          "timeouts": {"part": 60, "world_start": 60}}

# Run by the configuration's Python in its kit: the baseline part of the hand-in in one 2-rank world.
RUN = """\
import dataclasses, json, sys, time
from pathlib import Path
from grader.rerun.check import prepare_code, run_check
from grader.rerun.executor import WarmExecutor
from grader.rubric import load_rubric
rubric = load_rubric(Path(sys.argv[2]))
check = dataclasses.replace(rubric.checks[0], world_size=2)
executor = WarmExecutor("auto", rubric.limits)
executor.start()
started = time.monotonic()
runs = run_check(executor, prepare_code(Path(sys.argv[1])), check, rubric, Path(sys.argv[3]), parts=["baseline"])
seconds = time.monotonic() - started
executor.close()
print(json.dumps({"status": runs["baseline"].status.value, "detail": runs["baseline"].detail,
                  "output": runs["baseline"].output[-2000:], "seconds": seconds}))
"""


def run_world(config: str, code: str, tmp) -> dict:
    """The baseline part of `code` in one 2-rank world under RUBRIC, graded as `config` grades."""
    ta = _ta_or_skip(config)
    try:
        tmp = ta.home / "memory" if ta else tmp
        (tmp / "scratch").mkdir(parents=True)
        (tmp / "assignment4.py").write_text(code)
        (tmp / "rubric.yaml").write_text(yaml.safe_dump(RUBRIC))
        args = ["-c", RUN, str(tmp / "assignment4.py"), str(tmp / "rubric.yaml"), str(tmp / "scratch")]
        if ta:
            subprocess.run(["chown", "-R", f"{ta.user}:{ta.user}", str(tmp)], check=True)
            proc = ta.run([str(ta.python), *args], timeout=300)
        else:
            proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        if ta is not None:
            tas.remove(ta)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(400)
@pytest.mark.parametrize("config", CONFIG_PARAMS[:2])
@pytest.mark.parametrize("attack", sorted(MEMORY_ATTACKS))
def test_memory_outside_pss_is_held_to_the_worlds_limit(attack, config, tmp_path):
    measured = run_world(config, memory_attack(attack, HOG_MB), tmp_path)
    assert measured["status"] == "oom", measured
    assert f"the ranks and their children used more than {MEMORY_LIMIT_MB} MB" in measured["detail"], measured
    assert measured["seconds"] < HOLD_S + 30, measured
