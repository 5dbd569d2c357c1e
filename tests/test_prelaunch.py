"""A student's `check` and `package` launch the re-runs' helper (the zygote) before they import
torch (grader.rerun.executors.prelaunched), so that its import of torch and the command's run side by
side: the executor's modules load no torch, the first executor asked for with the same sandbox
and limits takes the launched helper, and one never taken is gone when the command ends."""

import os
import subprocess
import sys
import time

from tests.corpus import ROOT

SCRIPT = """
import os, sys
from grader.rerun import executors
wanted = ("off", repr(executors.Limits()))
with executors.prelaunched("off"):
    assert "torch" not in sys.modules, "prelaunched loaded torch"
    launched = executors._LAUNCHED[wanted]
    taken = executors.make_executor("warm", "off", key=b"k" * 32, jobs=3)
    assert taken is launched and (taken.key, taken.jobs) == (b"k" * 32, 3)
    isolation = taken.start()
    assert taken._proc.pid == launched._proc.pid and isolation.get("mode") == "off", isolation
    assert executors.make_executor("warm", "off") is not launched   # taken once only
assert taken._proc is not None, "the block closed an executor it handed out"
taken.close()
with executors.prelaunched("off"):   # a command that never asks for one (it refused early, say)
    untaken = executors._LAUNCHED[wanted]._proc.pid
assert wanted not in executors._LAUNCHED, "a helper of an ended command is left for the next to take"
print(untaken)
"""


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:   # a child of ours would linger as a zombie: it is not, the command's own exited
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split(") ")[-1].startswith("Z"):
                    return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


def test_the_helper_launched_before_torch_is_the_one_check_uses_and_an_untaken_one_ends_with_its_block():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    untaken = int(done.stdout.split()[-1])
    assert _gone(untaken, 30), f"the helper launched and never taken ({untaken}) outlived its block"
