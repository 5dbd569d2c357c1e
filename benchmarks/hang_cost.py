"""The cost of a hanging hand-in against a correct one, graded in one batch on this machine.

    python benchmarks/hang_cost.py [--correct 3] [--rubric FILE]

Grades `--correct` copies of the reference and two hand-ins that hang (Part 2's accumulation loop
that never ends, and Part 3's step asleep forever) in one batch, one at a time (--jobs 1), with the
rubric (grader/rubric.yaml, with --rubric's changes on top) and the part clocks its canary measured
(grader.limits.part_clock), and prints each one's grading time (grading.json's seconds), the
ratio of a hang's to a correct one's, and the clocks. Not a test: the figures depend on the machine
and on what else runs on it. It cannot lie: a correct copy with a part not passed, or a hang
whose part is not `timeout`, prints the difference and no ratio, and exits 1.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.batch.run import grade_batch  # noqa: E402
from grader.results import read_canary  # noqa: E402
from grader.rubric import load_rubric  # noqa: E402
from tests.corpus import REFERENCE, Files, write_zip  # noqa: E402

# Each hang and the part it hangs: the accumulation loop's counter never moves; the step sleeps.
HANGS = {"acc_loops_forever": ("grad_accumulation", "    for i in range(accumulation_steps):\n",
                               "    for i in iter(int, 1):   # a loop that never ends\n"),
         "dp_sleeps": ("data_parallel", "        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)\n",
                       "        __import__('time').sleep(10 ** 6)\n")}


def hanging(old: str, new: str) -> str:
    text = REFERENCE.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in the reference"
    return text.replace(old, new)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--correct", type=int, default=3)
    parser.add_argument("--rubric", help="rubric changes on top of grader/rubric.yaml")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        box, out = Path(tmp) / "inbox", Path(tmp) / "out"
        box.mkdir()
        for i in range(args.correct):
            write_zip(box / f"correct{i}.zip", Files(code=REFERENCE.read_text()))
        for name, (_, old, new) in HANGS.items():
            write_zip(box / f"{name}.zip", Files(code=hanging(old, new)))
        started = time.monotonic()
        summary = grade_batch([box], out, jobs=1, rubric_path=args.rubric, progress=False)
        seconds = time.monotonic() - started
        results = {p.parent.name: json.loads(p.read_text()) for p in out.glob("students/*/grading.json")}
        clocks = read_canary(out).clocks
    for s, r in sorted(results.items()):
        print(f"  {s}: {r['seconds']:.2f} s, " + ", ".join(f"{p} {v['status']}" for p, v in r["parts"].items()))
    rubric = load_rubric(args.rubric)
    wrong = [f"{s}: {p} is {v['status']}, not passed" for s, r in results.items() if s.startswith("correct")
             for p, v in r["parts"].items() if v["status"] != "passed"]
    wrong += [f"{s}: {HANGS[s][0]} is {r['parts'][HANGS[s][0]]['status']}, not timeout" for s, r in results.items()
              if s in HANGS and r["parts"][HANGS[s][0]]["status"] != "timeout"]
    if wrong or len(results) != args.correct + len(HANGS):
        print("\n".join(wrong) or f"graded {len(results)} hand-ins, not {args.correct + len(HANGS)}")
        return 1
    correct = statistics.median(r["seconds"] for s, r in results.items() if s.startswith("correct"))
    print(f"{len(rubric.checks)} checks, --jobs 1, the batch in {seconds:.1f} s ({summary.worlds} worlds)")
    print(f"a correct hand-in: {correct:.2f} s (median of {args.correct})")
    for name, (part, _, _) in HANGS.items():
        cost = results[name]["seconds"]
        print(f"a hand-in whose {part} hangs ({name}): {cost:.2f} s, {cost / correct:.1f}x a correct one")
    print(f"part clocks from the canary: {min(clocks.values()):g} to {max(clocks.values()):g} s "
          f"(the rubric's timeouts.part: {rubric.timeouts.part:g} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
