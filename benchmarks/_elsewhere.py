"""A benchmark run again where TAs are: as an ordinary user made for the run (tests/tas.py: the
system's Python, a venv of the user's own whose packages are those of the Python that runs this,
the kit copied into the user's home), or by another Python (torch's CUDA build, `.venv-cuda`, which
`make test-cuda` makes). The benchmark is given `--json` and prints its figures as JSON on its last
line; each helper returns them, or None and prints why it could not.
"""

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CUDA_PYTHON = ROOT / ".venv-cuda" / "bin" / "python"
# What a benchmark run by the user needs beside the kit's own copy (tests.tas.KIT_PARTS): the
# benchmarks and their helpers, the corpus the hand-ins are made from, and the local run's script.
CARRIED = ("benchmarks", "tests/__init__.py", "tests/corpus.py", "slurm")


def last_json(stdout: str):
    """The JSON a benchmark printed on its last line."""
    return json.loads(stdout.strip().splitlines()[-1])


def as_a_user(script: Path, args: list, label: str, timeout: float = 1800):
    """`script --json ARGS` run by an ordinary user made for the run, with the Python that runs this
    one's packages; its JSON, or None where no user can be made here (not root, no useradd) or the
    run failed, and why, printed under `label`."""
    from tests import tas
    if tas.available():
        print(f"{label}: not measured ({tas.available()})")
        return None
    ta = tas.ta_setup("user", carry=CARRIED)
    try:
        done = ta.run([str(ta.python), str(Path(script).relative_to(ROOT)), "--json", *args], timeout=timeout)
        if done.returncode != 0:
            print(f"{label}: failed ({done.stdout.strip()[-300:]} {done.stderr.strip()[-300:]})")
            return None
        return last_json(done.stdout)
    finally:
        tas.remove(ta)


def with_python(python, script: Path, args: list, label: str, timeout: float = 3600):
    """`script --json ARGS` run by another Python (torch's CUDA build); its JSON, or None where that
    Python is not there or the run failed, and why, printed under `label`."""
    if not python or not os.access(python, os.X_OK):
        print(f"{label}: not measured ({python or 'no Python given'} is not there: make test-cuda makes .venv-cuda)")
        return None
    done = subprocess.run([str(python), str(script), "--json", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        print(f"{label}: failed ({done.stdout.strip()[-300:]} {done.stderr.strip()[-300:]})")
        return None
    return last_json(done.stdout)
