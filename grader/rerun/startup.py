"""What starting a re-run helper process (the zygote) needs, and how the refusal to start reads:
the environment it is given, the sandbox modes, and the two refusals a batch gets before its first
hand-in (grader.rerun.executor starts it)."""

import os

from grader import kit
from grader.rerun import bwrap
from grader.rerun.sandbox import environment

# The only variables of the grader's environment that reach the processes running hand-ins (and
# the Python's own, grader.rerun.sandbox.environment.PYTHON).
PASSED_ON = ("PATH", "LANG", "LC_ALL", "TMPDIR", "GLOO_SOCKET_IFNAME")
SANDBOX_MODES = ("auto", "off", "best")
HELPER_TASKS = 8   # the zygote's own tasks, and a world's leader's, beside limits.processes


class CannotGrade(RuntimeError):
    """No world can run right on this machine as it is: the message names the cause, with its
    numbers, and the fix. Grading refuses before the first hand-in."""


class SandboxUnavailable(CannotGrade):
    """`--sandbox auto` and the machine cannot isolate hand-in code: the message says what is missing
    and the two ways out."""


def child_env(cgroups: list = ()) -> dict:
    """A minimal environment: nothing of a TA's (tokens, say) is ever in a re-run's process tree; the
    Python's own variables (a module Python's), one thread per pool and no GPU, from the start."""
    env = {k: os.environ[k] for k in PASSED_ON if k in os.environ}
    python = environment.python_variables()
    env.update(python, **environment.ZYGOTE)
    env.update(PYTHONDONTWRITEBYTECODE="1", HOME="/tmp", A4_CGROUPS=os.pathsep.join(cgroups or ()),
               PYTHONPATH=os.pathsep.join([str(kit.ROOT)] + ([python["PYTHONPATH"]] if "PYTHONPATH" in python else [])))
    return env


def refusal(problems: list) -> str:
    return ("hand-in code cannot be isolated on this machine: " + "; ".join(problems) + ". " + bwrap.ADVICE +
            "; or grade on a machine where it can be (`python -m grader doctor` says what is missing here), "
            "or pass --sandbox off to accept the risk: hand-in code then runs with your user's rights and "
            "network, every result records it, and summary.md opens with a warning")


def unfit(problems: list) -> str:
    return ("no re-run world can run right on this machine: " + "; ".join(problems) +
            " (`python -m grader doctor` runs a world and says what holds)")
