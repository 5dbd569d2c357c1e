"""The staff report at scale: report.html and analytics.json over 100 graded hand-ins, timed.

    make bench [RUBRIC=benchmarks/part5.yaml]
    python benchmarks/report_size.py [--handins 100] [--seed 1] [--keep DIR] [--rubric FILE]

Writes N results as `grade` writes them (grading.json, feedback.md, results.json) under the rubric
(grader/rubric.yaml, with --rubric's changes on top; its parts, Part 5 where it is on): most hand-ins right, a fifth with a usual mistake in one part (with its diagnosis), a few
crashed or hung at a collective, a few with a TODO left. Then it times what `grade` adds after
grading (grader.analytics.page.write_report: reading every result, the numbers, three plots) and
prints the sizes of report.html and analytics.json. Not a test: the figures depend on the machine
and on what else runs on it.
"""

import argparse
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.analytics.page import write_report  # noqa: E402
from grader.pipeline.record import write_handin  # noqa: E402
from grader.results import CheckOutcome, PartResult, Status, new_result  # noqa: E402
from grader.rubric import load_rubric  # noqa: E402

MISTAKES = {"data_parallel": "the gradients were summed over the 4 ranks, not averaged",
            "grad_accumulation": "the micro-batch losses were not divided by accumulation_steps",
            "baseline": "the step has the wrong sign: the weight moved up the gradient",
            "tensor_parallel": "each rank kept its own shard: the all-gather of the weight is missing",
            "megatron_mlp": "each rank used its own partial sum as the block's output: g's all-reduce is missing"}


def handin(student: str, rubric, rng: random.Random):
    r = new_result(student, f"{student}.zip", f"{rng.getrandbits(256):064x}", rubric)
    roll = rng.random()
    broken = rng.choice(rubric.part_ids) if roll < 0.35 else None
    how = (Status.FAILED if roll < 0.2 else Status.CRASHED if roll < 0.27 else Status.TIMEOUT if roll < 0.3
           else Status.NOT_IMPLEMENTED)
    for part in rubric.part_ids:   # the stock rubric leaves the optional Part 5 off
        points = rubric.parts[part]
        wrong = part == broken
        checks = [CheckOutcome(check=c.name, hidden=c.hidden, world_size=c.world_size,
                               status=how if wrong else Status.PASSED,
                               message="the collective all_reduce waited in vain" if wrong and how == Status.TIMEOUT
                               else "differs" if wrong else "matches the reference",
                               diagnosis=MISTAKES.get(part, "g left out") if wrong and how == Status.FAILED else "")
                  for c in rubric.checks if part in rubric.parts_at(c)]
        r.parts[part] = PartResult(part=part, status=how if wrong else Status.PASSED,
                                   score=0.0 if wrong else points.log + points.rerun,
                                   max_score=points.log + points.rerun, rerun_points=0.0 if wrong else points.rerun,
                                   log_points=0.0 if wrong else points.log, message="", rerun_max=points.rerun,
                                   log_max=points.log, checks=checks)
    r.status, r.seconds = Status.GRADED, round(rng.uniform(4, 12), 2)
    r.score = sum(p.score for p in r.parts.values())
    r.isolation = {"mode": "best", "sandbox": "bwrap", "network": "isolated", "files": "isolated"}
    if rng.random() < 0.1:
        r.flags.append("stale_log")
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--handins", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", help="write OUT here and keep it (default: a temporary folder)")
    ap.add_argument("--rubric", help="a rubric read on top of grader/rubric.yaml, as grade's --rubric")
    args = ap.parse_args(argv)
    rubric, rng = load_rubric(args.rubric), random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.keep or tmp) / "out"
        for i in range(args.handins):
            write_handin(handin(f"s{i:04d}", rubric, rng), out, rubric)
        started = time.perf_counter()
        write_report(out)
        first = time.perf_counter() - started
        started = time.perf_counter()
        write_report(out)   # once more, with matplotlib already loaded (as gradebook finds it)
        again = time.perf_counter() - started
        html, numbers = (out / "report.html").stat().st_size, (out / "analytics.json").stat().st_size
    print(f"report over {args.handins} hand-ins, parts {', '.join(rubric.part_ids)} "
          f"({platform.python_version()}, {platform.machine()}): "
          f"{first:.2f} s the first time (matplotlib loaded), {again:.2f} s again; "
          f"report.html {html / 1024:.0f} KiB, analytics.json {numbers / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
