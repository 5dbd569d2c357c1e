"""The integrity report at scale: every pair of 500 graded hand-ins, timed.

    make bench
    python benchmarks/integrity_pairs.py [--handins 500] [--seed 1] [--keep DIR]

Builds N hand-in zips the way a class writes them: each TODO answered in one of the styles of
tests/integrity_corpus.py or the reference's way, chosen per TODO, some hand-ins renamed and
reformatted, a fifth with a usual mistake; each with its own run's .log and .err and the
grading.json `grade` writes. Into them it plants a few pairs of each kind of evidence (copied code
renamed and reformatted, a copied run, the same unexplained wrong weight, a run of another's code),
then runs the integrity report over OUT and the hand-ins, as `python -m grader integrity OUT
INBOX` does, and prints its time by stage and what it listed: the planted pairs should be all of
it. Not a test: the figures depend on the machine and on what else runs on it.
"""

import argparse
import os
import platform
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.integrity.commands import run_integrity  # noqa: E402
from grader.rubric import load_rubric  # noqa: E402
from tests.corpus import Files, mutate, write_zip  # noqa: E402
from tests.integrity_corpus import (REFERENCE, RENAMES, STYLES, disguise, fill, run_err, run_log,  # noqa: E402
                                    write_graded)

POOL = ("terse", "functional", "loops", "helper")   # the class's styles; "defensive", "einsum" are the copied ones
MISTAKES = {"dp_summed": ("data_parallel", "the gradients were summed over the 4 ranks, not averaged"),
            "acc_unscaled": ("grad_accumulation", "the micro-batch losses were not divided by accumulation_steps"),
            "baseline_wrong_sign": ("baseline", "the step has the wrong sign: the weight moved up the gradient")}


def class_code(rng: random.Random, i: int) -> tuple:
    """(code, wrong) of one student of the class: answers mixed from the pool, sometimes renamed
    and reformatted, sometimes a usual mistake instead."""
    if rng.random() < 0.2:
        name = rng.choice(sorted(MISTAKES))
        part, diagnosis = MISTAKES[name]
        return mutate(name) + f"# student {i}\n", [(part, "default", name.encode().hex().ljust(64, "0"), diagnosis)]
    answers = {}
    for key in REFERENCE:
        options = [s for s in POOL if key in STYLES[s]]
        choice = rng.choice(options + [None] * 2)   # the reference's answer as often as any two styles
        if choice:
            answers[key] = STYLES[choice][key]
            if "helpers" in STYLES[choice]:
                answers["helpers"] = answers.get("helpers", "") + STYLES[choice]["helpers"]
    code = fill(answers)
    if rng.random() < 0.5:
        code = disguise(code, {old: f"{new}{i}" for old, new in RENAMES.items() if rng.random() < 0.5})
    return code + f"# student {i}\n", []


def build(inbox: Path, out: Path, n: int, seed: int) -> set:
    """Write n hand-ins and their grading.json; return the planted pairs."""
    rng, rubric = random.Random(seed), load_rubric()
    handins, planted = {}, set()
    for i in range(n - 11):
        code, wrong = class_code(rng, i)
        handins[f"s{i:04d}"] = (Files(code=code, log=run_log(code, 1000 + i), err=run_err(1000 + i)), wrong)
    for k, style in enumerate(("defensive", "einsum")):           # copied code, renamed and reformatted
        original = fill(STYLES[style])
        copy = disguise(original, {old: f"{new}_c" for old, new in RENAMES.items()})
        for name, code, s in ((f"orig{k}", original, 5000 + k), (f"copy{k}", copy, 5100 + k)):
            handins[name] = (Files(code=code, log=run_log(code, s), err=run_err(s)), [])
        planted.add((f"copy{k}", f"orig{k}"))
    for k in range(2):                                             # a copied run
        a, b = f"s{k:04d}", f"s{k + 2:04d}"
        handins[f"run{k}"] = (Files(code=handins[b][0].code, log=handins[a][0].log, err=handins[a][0].err),
                              handins[b][1])
        handins[f"run{k}"][0].code += "# the log is not mine\n"
        planted.add(tuple(sorted((a, f"run{k}"))))
    for k in range(2):                                             # the same unexplained wrong weight
        for side in "ab":
            code = mutate("tp_returns_shard") + f"# wrong {k}{side}\n"
            handins[f"wrong{k}{side}"] = (Files(code=code, log=run_log(code, 5200 + 2 * k + (side == "b")),
                                                err=run_err(5200 + 2 * k + (side == "b"))),
                                          [("tensor_parallel", "odd-sizes", f"{k:02d}" * 32,
                                            "differs from the reference by up to 1.234e-01")])
        planted.add((f"wrong{k}a", f"wrong{k}b"))
    code = handins["s0004"][0].code                                # a run of another's code
    handins["ran_other"] = (Files(code=mutate("acc_zero_grad_in_loop"), log=run_log(code, 5300), err=run_err(5300)), [])
    planted.add(("ran_other", "s0004"))
    for name, (files, wrong) in handins.items():
        write_graded(out, name, write_zip(inbox / f"{name}.zip", files), files.log, wrong, rubric)
    return planted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handins", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", metavar="DIR", help="build the batch here and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="a4-integrity-bench-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        inbox, out = root / "inbox", root / "out"
        inbox.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        planted = build(inbox, out, args.handins, args.seed)
        built = time.monotonic() - started
        cpu = time.process_time()
        report = run_integrity(out, [inbox])
        cpu = time.process_time() - cpu
        listed = {(p.student_a, p.student_b) for p in report.pairs}
        pairs = report.handins * (report.handins - 1) // 2
        print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
              f"{platform.python_version()}")
        print(f"built {report.handins} graded hand-ins in {built:.1f} s (zips, logs, grading.json; not timed below)")
        print(f"integrity report over all {pairs:,} pairs of {report.handins} hand-ins: {report.seconds:.2f} s "
              f"wall, {cpu:.2f} s CPU, one process")
        print(f"  read (find, unpack, fingerprint each hand-in): {report.timings['read']:.2f} s "
              f"({1000 * report.timings['read'] / report.handins:.1f} ms a hand-in)")
        print(f"  all pairs, the four kinds of evidence:        {report.timings['pairs']:.2f} s")
        print(f"  write integrity.csv and .md:                  {report.timings['write']:.2f} s")
        print(f"  peak memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
        print(f"listed {len(report.pairs)} pair(s), {report.strong} strong; planted {len(planted)}: "
              f"{len(planted & listed)} found, {len(listed - planted)} listed beyond them")
        for pair in report.pairs:
            mark = "planted" if (pair.student_a, pair.student_b) in planted else "NOT PLANTED"
            print(f"  {mark:11} {pair.student_a} / {pair.student_b}: {pair.strength}: "
                  + "; ".join(e.summary for e in pair.evidence)[:150])
        print("taken as common: " + (", ".join(f"{n} {what}" for what, n in sorted(report.commons.items())) or "-"))
        return 0 if planted <= listed else 1


if __name__ == "__main__":
    sys.exit(main())
