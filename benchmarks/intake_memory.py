"""A batch's peak memory against its download's size: 300 hand-ins in a 1 GB Canvas download.

    make bench
    python benchmarks/intake_memory.py [--handins 300] [--gb 1.0] [--small-gb 0.1] [--keep DIR]

Builds Canvas downloads (Assignments > Download Submissions: `login_userid_submissionid_file`)
under the temporary folder: each student one zip of their code, utils.py and a padding file of
random bytes, stored (so the download is as big on disk as asked); every tenth student hands in
loose files instead. Every hand-in fails fast: one in GRADED hands in the skeleton (graded: its
first TODO fails), the others name their code assignment4_draft.py (invalid once unpacked: no
assignment4.py). Each is still unpacked whole, as grading unpacks it: the time goes to intake, which
must read each hand-in from the zip on disk when it is graded and hold no download in memory.
Each download is graded by `grade_batch` in a process of its own, under a rubric of one check,
and the figure printed is that process's peak resident memory (the ranks' processes are others),
for a small download and the full one: flat in the download's size when intake is lazy. Not a
test: the figures depend on the machine and on what else runs on it.
"""

import argparse
import io
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.corpus import UTILS, fast_rubric, skeleton  # noqa: E402

GRADED = 50   # one hand-in in GRADED runs its code (the skeleton); the others are invalid once unpacked

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from grader.batch.run import grade_batch
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.monotonic()
summary = grade_batch([{download!r}], {out!r}, rubric_path={rubric!r}, progress=False)
print(json.dumps({{"before_mb": before / 1024, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "seconds": time.monotonic() - started, "statuses": summary.statuses}}))
"""


def build_download(path: Path, handins: int, total_bytes: int, seed: int = 1) -> None:
    """A Canvas download of `handins` students, `total_bytes` on disk in all (padding of random bytes)."""
    code, utils = skeleton().encode(), UTILS.read_bytes()
    pad = max(0, total_bytes // handins - len(code) - len(utils))
    block = random.Random(seed).randbytes(1 << 20)
    padding = (block * (pad // len(block) + 1))[:pad]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as download:
        for i in range(handins):
            prefix = f"student{i:04d}_{50000 + i}_{90000 + i}"
            name = "assignment4.py" if i % GRADED == 0 else "assignment4_draft.py"
            if i % 10 == 9:   # loose files: the download's members are the hand-in's files
                download.writestr(f"{prefix}_{name}", code)
                download.writestr(f"{prefix}_utils.py", utils)
                download.writestr(f"{prefix}_data.bin", padding)
                continue
            one = io.BytesIO()
            with zipfile.ZipFile(one, "w", zipfile.ZIP_STORED) as z:
                z.writestr(name, code)
                z.writestr("utils.py", utils)
                z.writestr("data.bin", padding)
            download.writestr(f"{prefix}_handin.zip", one.getvalue())


def measure(download: Path, out: Path, rubric: Path) -> dict:
    """Grade `download` into `out` in a process of its own; its peak memory and time."""
    shutil.rmtree(out, ignore_errors=True)
    code = CHILD.format(root=str(ROOT), download=str(download), out=str(out), rubric=str(rubric))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"grading {download} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handins", type=int, default=300)
    parser.add_argument("--gb", type=float, default=1.0, help="the full download's size on disk")
    parser.add_argument("--small-gb", type=float, default=0.1, help="the small download's size, to compare")
    parser.add_argument("--keep", metavar="DIR", help="build in DIR and keep it (default: a temporary folder)")
    args = parser.parse_args(argv)
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="a4-intake-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        rubric = fast_rubric(tmp, checks=[{"name": "default"}], public_world_sizes=[])
        print(f"intake memory: {args.handins} hand-ins, Canvas download, one check; {platform.node()}, "
              f"{os.cpu_count()} CPUs, Python {platform.python_version()}")
        for gb in (args.small_gb, args.gb):
            download = tmp / f"canvas-{gb:g}GB.zip"
            started = time.monotonic()
            build_download(download, args.handins, int(gb * (1 << 30)))
            built = time.monotonic() - started
            figures = measure(download, tmp / f"out-{gb:g}", rubric)
            size = download.stat().st_size / (1 << 30)
            download.unlink()   # the next one needs the room
            print(f"  download {size:.2f} GB (built in {built:.0f} s): batch process peak {figures['peak_mb']:.0f} MB "
                  f"resident ({figures['before_mb']:.0f} MB after its imports, "
                  f"+{figures['peak_mb'] - figures['before_mb']:.0f} MB grading), {figures['seconds']:.0f} s, "
                  f"statuses {figures['statuses']}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
