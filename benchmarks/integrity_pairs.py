"""The integrity report: its precision and recall on disguised copies, and its time at scale.

    make bench
    python benchmarks/integrity_pairs.py [--handins 500] [--seed 1] [--keep DIR] [--planted-only]

1. The planted set (tests/integrity_planted.py, held to its floors by
   tests/test_integrity_planted.py): twenty independent hand-ins and, per disguise, a copy of
   sixteen of them (renamed, stripped of comments, reformatted, reordered, split into helpers, and
   combinations). Prints precision and recall per disguise, as the integrity command pairs them.
2. A class of N hand-in zips written the way a class writes them: each TODO answered in the way
   of one of the planted set's students or the reference's, chosen per TODO; some reformatted
   and renamed; some from the course's own handout; a fifth with a usual mistake; each with its
   own run's .log and .err and the grading.json `grade` writes. Into it go a copy of a student per
   disguise and a few pairs of each other kind of evidence (a copied run, the same unexplained
   wrong weight, a run of another's code). The integrity report runs over OUT and the hand-ins as
   `python -m grader integrity OUT INBOX` does; it prints the time by stage and what was listed
   against what was planted.
Not a test: the figures depend on the machine and on what else runs on it. Exits 1 only where a
planted pair of the kinds found at any size (a copied run, the same wrong weight, a run of
another's code) is not listed.
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

from grader.integrity.code import Base, own_code  # noqa: E402
from grader.integrity.commands import run_integrity  # noqa: E402
from grader.integrity.similar import MIN_TOKENS  # noqa: E402
from grader.rubric import load_rubric  # noqa: E402
from tests.corpus import Files, mutate, write_zip  # noqa: E402
from tests.integrity_corpus import REFERENCE, RENAMES, STYLES, disguise, fill, handout_fill, run_err, run_log, \
    write_graded  # noqa: E402
from tests.integrity_disguise import DISGUISES  # noqa: E402
from tests.integrity_planted import NO_PART5, STUDENTS, evaluate  # noqa: E402

POOL = {**STYLES, **STUDENTS}   # every student's way of answering a TODO
MISTAKES = {"dp_summed": ("data_parallel", "the gradients were summed over the 4 ranks, not averaged"),
            "acc_unscaled": ("grad_accumulation", "the micro-batch losses were not divided by accumulation_steps"),
            "baseline_wrong_sign": ("baseline", "the step has the wrong sign: the weight moved up the gradient")}


def print_planted() -> None:
    started = time.monotonic()
    scores = evaluate()
    print("1. the planted set: twenty independent hand-ins, a copy of sixteen of them per disguise")
    print(f"   {'disguise':28} {'precision':>9} {'recall':>7}  missed")
    for name, s in scores.items():
        missed = ", ".join(sorted(a for a, _ in s.planted - s.listed)) or "-"
        print(f"   {name:28} {s.precision:9.2f} {s.recall:7.2f}  {missed}")
    found = sum(len(s.found) for s in scores.values())
    listed = sum(len(s.listed) for s in scores.values())
    planted = sum(len(s.planted) for s in scores.values())
    print(f"   {'all':28} {found / max(listed, 1):9.2f} {found / planted:7.2f}  ({found} of {planted} copies found, "
          f"{listed - found} pair(s) listed beyond them; {time.monotonic() - started:.0f} s)")


def class_code(rng: random.Random, i: int) -> tuple:
    """(code, wrong) of one student of the class: each TODO answered some student's way or the
    reference's, sometimes from the handout, reformatted and renamed; sometimes a usual mistake."""
    if rng.random() < 0.2:
        name = rng.choice(sorted(MISTAKES))
        part, diagnosis = MISTAKES[name]
        return mutate(name) + f"# student {i}\n", [(part, "default", name.encode().hex().ljust(64, "0"), diagnosis)]
    answers, helpers = dict(NO_PART5) if rng.random() < 0.8 else {}, []
    for key in (k for k in REFERENCE if k not in answers):   # Part 5 left undone by four in five
        options = [s for s, a in POOL.items() if a.get(key)]
        choice = rng.choice(options + [None] * max(len(options), 1))   # the reference's answer as often as all others
        if choice:
            answers[key] = POOL[choice][key]
            if POOL[choice].get("helpers") and POOL[choice]["helpers"] not in helpers:
                helpers.append(POOL[choice]["helpers"])
    answers["helpers"] = "\n\n".join(helpers)
    if rng.random() < 0.1:
        code = handout_fill({k: v for k, v in answers.items() if v and k in ("batch", "forward", "loss", "step",
                                                                               "slice", "scale", "allreduce")})
    else:
        code = fill(answers)
    if rng.random() < 0.5:
        code = disguise(code, {old: f"{new}{i}" for old, new in RENAMES.items() if rng.random() < 0.5})
    return code + f"# student {i}\n", []


def build(inbox: Path, out: Path, n: int, seed: int) -> tuple:
    """Write n hand-ins and their grading.json; return (the planted pairs, which of them are copies)."""
    rng, rubric, base = random.Random(seed), load_rubric(), Base.from_files()
    handins, planted, copies = {}, set(), set()
    for i in range(n - len(DISGUISES) - 7):
        code, wrong = class_code(rng, i)
        handins[f"s{i:04d}"] = (Files(code=code, log=run_log(code, 1000 + i), err=run_err(1000 + i)), wrong)
    own = [name for name, (files, wrong) in handins.items()
           if not wrong and own_code(files.code, base).size >= MIN_TOKENS]
    for k, (name, make) in enumerate(DISGUISES.items()):   # a copy per disguise, of a student with code of their own
        original = own[k * len(own) // len(DISGUISES)]
        code = make(handins[original][0].code, random.Random(f"{seed}-{name}"))
        handins[f"copy~{name}"] = (Files(code=code, log=run_log(code, 5000 + k), err=run_err(5000 + k)), [])
        planted.add(tuple(sorted((original, f"copy~{name}"))))
        copies.add((original, f"copy~{name}"))
    for k in range(2):                                             # a copied run
        a, b = f"s{k:04d}", f"s{k + 2:04d}"
        handins[f"run{k}"] = (Files(code=handins[b][0].code + "# the log is not mine\n", log=handins[a][0].log,
                                    err=handins[a][0].err), handins[b][1])
        planted.add(tuple(sorted((a, f"run{k}"))))
        if own_code(handins[b][0].code, base).size >= MIN_TOKENS:   # and the code is b's (and its copies')
            planted |= {tuple(sorted((x, f"run{k}"))) for x in [b] + [c for o, c in copies if o == b]}
    for k in range(2):                                             # the same unexplained wrong weight
        for side in "ab":
            code = mutate("tp_returns_shard") + f"# wrong {k}{side}\n"
            s = 5200 + 2 * k + (side == "b")
            handins[f"wrong{k}{side}"] = (Files(code=code, log=run_log(code, s), err=run_err(s)),
                                          [("tensor_parallel", "odd-sizes", f"{k:02d}" * 32,
                                            "differs from the reference by up to 1.234e-01")])
        planted.add((f"wrong{k}a", f"wrong{k}b"))
    code = handins[own[1]][0].code                                 # a run of another's code
    handins["ran_other"] = (Files(code=mutate("acc_zero_grad_in_loop"), log=run_log(code, 5300), err=run_err(5300)), [])
    planted.add(tuple(sorted(("ran_other", own[1]))))
    for name, (files, wrong) in handins.items():
        write_graded(out, name, write_zip(inbox / f"{name}.zip", files), files.log, wrong, rubric)
    return planted, copies


def print_scale(args) -> int:
    with tempfile.TemporaryDirectory(prefix="a4-integrity-bench-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        inbox, out = root / "inbox", root / "out"
        inbox.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        planted, copies = build(inbox, out, args.handins, args.seed)
        built = time.monotonic() - started
        cpu = time.process_time()
        report = run_integrity(out, [inbox])
        cpu = time.process_time() - cpu
    listed = {(p.student_a, p.student_b) for p in report.pairs}
    pairs = report.handins * (report.handins - 1) // 2
    print(f"\n2. a class of {report.handins} (built in {built:.1f} s: zips, logs, grading.json; not timed below)")
    print(f"   integrity report over all {pairs:,} pairs: {report.seconds:.2f} s wall, {cpu:.2f} s CPU, one process")
    print(f"     read (find, unpack, fingerprint each hand-in): {report.timings['read']:.2f} s "
          f"({1000 * report.timings['read'] / report.handins:.1f} ms a hand-in)")
    print(f"     all pairs, the four kinds of evidence:        {report.timings['pairs']:.2f} s")
    print(f"     write integrity.csv and .md:                  {report.timings['write']:.2f} s")
    print(f"     peak memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    code_listed = {(p.student_a, p.student_b) for p in report.pairs if any(e.kind == "same_code" for e in p.evidence)}
    copies = {tuple(sorted(c)) for c in copies}
    print(f"   disguised copies: {len(copies & code_listed)} of {len(copies)} found by their code; "
          f"{len(code_listed - planted)} pair(s) listed for their code beyond the planted ones")
    print(f"   every kind: listed {len(listed)} pair(s), {report.strong} strong; planted {len(planted)}: "
          f"{len(planted & listed)} found (recall {len(planted & listed) / len(planted):.2f}), "
          f"precision {len(planted & listed) / max(len(listed), 1):.2f}")
    for pair in report.pairs:
        mark = "planted" if (pair.student_a, pair.student_b) in planted else "NOT PLANTED"
        print(f"     {mark:11} {pair.student_a} / {pair.student_b}: {pair.strength}: "
              + "; ".join(e.summary for e in pair.evidence)[:140])
    for a, b in sorted(planted - listed):
        print(f"     MISSED      {a} / {b}")
    print("   taken as common: " + (", ".join(f"{n} {what}" for what, n in sorted(report.commons.items())) or "-"))
    # Identical runs and the same wrong weights are found at any size; a disguised copy's code weighs
    # less the more of the class holds the same (the generated class holds few styles), so its
    # misses are figures (held by tests/test_integrity_planted.py on the planted set), not a failure.
    return 0 if planted - copies <= listed else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handins", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", metavar="DIR", help="build the batch here and keep it")
    parser.add_argument("--planted-only", action="store_true", help="only the planted set's precision and recall")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, load {os.getloadavg()[0]:.1f}")
    print_planted()
    return 0 if args.planted_only else print_scale(args)


if __name__ == "__main__":
    sys.exit(main())
