"""What one world of each part costs alone: the reference re-run by the warm executor, one part per
world, at the first public check of each kind the part runs (4 ranks), so that a part's own work is
set beside the others' (Part 6's loss and gradients against Part 4's layer alone, both at the
backward check).

    python benchmarks/part_worlds.py [--worlds 20] [--rubric FILE]

Every optional part is on unless `--rubric` says otherwise (benchmarks/part8.yaml, the default,
turns all on; part5.yaml, part6.yaml or part7.yaml fewer). Each figure is the median over the
worlds, in milliseconds, with the sandbox: the whole world (the round trip) and its parts' own time
(from the ranks ready to the results sent); the first worlds warm the executor and are not counted.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.parts import BY_ID
from grader.rerun.check import prepare_code, run_check
from grader.rerun.executor import WarmExecutor
from grader.rerun.sandbox.namespaces import scratch_dir
from grader.rubric import load_rubric

REFERENCE = Path(__file__).resolve().parent.parent / "assignment_4" / "reference" / "assignment4.py"
WARM_UP = 3   # worlds run first and not counted
EVERY_PART = Path(__file__).resolve().parent / "part8.yaml"   # every optional part on: each set beside Part 4


def timelines(executor, code, check, rubric, part: str, worlds: int) -> list:
    """The timelines of `worlds` worlds that each run `part` alone at `check`."""
    seen = []
    real = executor.run_world

    def run_world(job):
        report = real(job)
        seen.append(dict(report.timeline))
        return report

    executor.run_world = run_world
    scratch = Path(scratch_dir("a4-part-worlds-"))
    try:
        while len(seen) < worlds + WARM_UP:
            run_check(executor, code, check, rubric, scratch, parts=[part])
    finally:
        executor.run_world = real
    return [t for t in seen[WARM_UP:] if all(k in t for k in ("ready", "done", "round_trip"))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, default=20)
    parser.add_argument("--rubric", default=str(EVERY_PART),
                        help="a rubric read on top of grader/rubric.yaml, as grade's --rubric (default: "
                             "benchmarks/part8.yaml, every optional part on)")
    args = parser.parse_args()
    rubric = load_rubric(args.rubric) if args.rubric else load_rubric()
    first = {}   # kind -> its first public check
    for check in rubric.checks:
        if not check.hidden:
            first.setdefault(check.kind, check)
    print(f"one part per world, the reference, with the sandbox, median of {args.worlds} worlds each, in ms")
    print(f"{'part':62s} {'check':18s} {'world':>8s} {'parts':>8s}")
    executor = WarmExecutor("auto", rubric.limits)
    executor.start()
    code = prepare_code(REFERENCE)
    started = time.monotonic()
    try:
        for part in rubric.part_ids:
            for kind in BY_ID[part].kinds:
                check = first.get(kind)
                if check is None:
                    continue
                rows = timelines(executor, code, check, rubric, part, args.worlds)
                world = 1000 * statistics.median(t["round_trip"] for t in rows)
                own = 1000 * statistics.median(t["done"] - t["ready"] for t in rows)
                print(f"{BY_ID[part].title[:62]:62s} {check.name[:18]:18s} {world:8.1f} {own:8.1f}")
    finally:
        executor.close()
    print(f"in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
