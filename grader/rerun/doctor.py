"""`python -m grader doctor`: which sandbox layers work on this machine, for this user and this
Python, and why a missing one is missing. It starts the sandbox exactly as `grade` does.
"""

import getpass
import os
import sys

from grader.rerun import bwrap, memory
from grader.rerun.executor import SandboxUnavailable, WarmExecutor


def doctor_command(args) -> int:
    binary = bwrap.find_bwrap()
    print(f"user:       {getpass.getuser()} (uid {os.getuid()})"
          + (": each world's ranks run under a user id of their own" if os.geteuid() == 0 else ""))
    print(f"python:     {sys.executable} (prefix {sys.prefix})")
    print(f"bubblewrap: {bwrap.version(binary) + ' at ' + binary if binary else 'not found'}")
    executor = WarmExecutor(args.sandbox)
    try:
        isolation = executor.start()
    except SandboxUnavailable as e:
        print(f"\ngrade would refuse to run hand-ins here:\n  {e}")
        return 1
    except (OSError, RuntimeError) as e:
        print(f"\nthe re-run helper did not start: {e}")
        return 1
    finally:
        executor.close()
    print()
    for layer in ("sandbox", "files", "network", "processes", "user", "limits", "memory", "scratch"):
        print(f"{layer + ':':<11} {isolation.get(layer, '')}")
    if memory.Cgroup.why and isolation.get("sandbox", "none") != "none":
        print(f"{'':<11} (why no memory cgroup: {memory.Cgroup.why}; the watchdog may let a world pass "
              f"its limit by what it allocates between two polls)")
    for problem in isolation.get("problems", []):
        print(f"problem:    {problem}")
    print("\nevery layer holds: hand-in code is isolated" if not isolation.get("problems") and
          isolation.get("sandbox", "none") != "none" else "\nnot every layer holds (see above)")
    return 0
