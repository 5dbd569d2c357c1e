"""Grading throughput: the warm executor against the torchrun baseline, side by side in one run.

    make bench [RUBRIC=benchmarks/part5.yaml]
    python benchmarks/grading_throughput.py [--handins 100] [--baseline-handins 6] [--jobs N] [--rubric FILE]
                                            [--elsewhere 20,1] [--cuda-python PYTHON]

Builds synthetic hand-ins from the test corpus (the reference, the skeleton and fast-failing
mutants, each with a real run's log), grades them all with the warm executor and a few with the
torchrun baseline (each re-run at every check of the rubric: grader/rubric.yaml, with --rubric's
changes on top), and prints: hand-ins per minute for both and their ratio; the time per world
against the fork-and-gloo floor measured on the spot; the grader's memory at the start, its peak
and its end, and the helpers' peak; and the log parser's speed on a 100 MB log. --jobs is the grader's
own choice from this machine unless given (grader.limits.default_jobs). Not a test: the
figures depend on the machine and on what else runs on it.

Then the same, smaller (`--elsewhere`: 20 hand-ins, one reference among them by torchrun too),
where TAs grade too, each configuration in a run of its own and each against its own torchrun and
floor: as an ordinary user made for the run (as root, where useradd is at hand: benchmarks/_elsewhere.py), and with
torch's CUDA build (`--cuda-python`, `.venv-cuda` as `make test-cuda` makes it) as this user and
as an ordinary user; a table gives each one's hand-ins a minute, its ratio to torchrun and its
time a world against its floor. A configuration that cannot be made here says why and is left out.

It cannot lie: every hand-in's result is held against what the corpus says it must get (the
reference every part passed and full marks, the skeleton every part not implemented, each mutant
its part's status and the others passed). When one differs (a machine that cannot run worlds gives
infra_error to all), it prints each difference and no rate or ratio, and exits 1.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from grader.batch.run import grade_batch  # noqa: E402
from grader.evidence.logfile import parse_log  # noqa: E402
from grader.rubric import load_rubric  # noqa: E402
from benchmarks._floor import fork_gloo_floor  # noqa: E402
from benchmarks._elsewhere import CUDA_PYTHON, as_a_user, with_python  # noqa: E402
from benchmarks._memory import MemorySampler  # noqa: E402
from tests.corpus import MUTANTS as CORPUS, REFERENCE, Files, mutate, refingerprint, skeleton, write_zip  # noqa: E402

MUTANTS = ["dp_summed", "acc_unscaled", "baseline_wrong_sign", "tp_own_shard_only", "baseline_no_step",
           "dp_no_allreduce", "tp_returns_shard", "acc_zero_grad_in_loop"]


def reference_log(tmp: Path) -> tuple:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    subprocess.run([str(ROOT / "slurm" / "run-local.sh"), "--nproc", "4", "--out", str(tmp), str(REFERENCE)],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    log = next(tmp.glob("*.log"))
    return log.read_text(), log.with_suffix(".err").read_text()


def build_handins(inbox: Path, n: int, log: str, err: str) -> dict:
    """n hand-ins: half the reference, a tenth the skeleton, the rest mutants that fail fast.
    Returns each zip's name -> its kind ("reference", "skeleton" or a mutant of tests.corpus)."""
    inbox.mkdir(parents=True)
    codes = {"reference": REFERENCE.read_text(), "skeleton": skeleton(), **{m: mutate(m) for m in MUTANTS}}
    kinds = ["reference"] * 5 + ["skeleton"] + MUTANTS[:4]
    made = {}
    for i in range(n):
        kind = kinds[i % len(kinds)] if i % 20 else MUTANTS[(i // 20) % len(MUTANTS)]
        code = codes[kind]
        # Each hand-in is a different file (a comment with its number), as in a real batch.
        code = f"{code}\n# hand-in {i}\n"
        name = f"student{i:03d}_{kind}.zip"
        write_zip(inbox / name, Files(code=code, log=refingerprint(log, code), err=err))
        made[name] = kind
    return made


def expected(kind: str, rubric) -> dict:
    """What a hand-in of `kind` must get under `rubric`: {"status", "score" (None: any), part: status}."""
    if kind == "reference":
        parts = {part: "passed" for part in rubric.part_ids}
    elif kind == "skeleton":
        parts = {part: "not_implemented" for part in rubric.part_ids}
    else:
        mutant = CORPUS[kind]
        parts = {part: mutant.status if part == mutant.part else mutant.others for part in rubric.part_ids}
    full = sum(p.log + p.rerun for p in rubric.parts.values())
    return {"status": "graded", "score": full if kind == "reference" else None, **parts}


def wrong_results(out: Path, kinds: dict, rubric) -> list:
    """One line per hand-in graded into `out` whose result is not what its kind must get; a hand-in
    with no result at all counts as one."""
    wrong, seen = [], set()
    for path in sorted((out / "students").glob("*/grading.json")):
        result = json.loads(path.read_text())
        seen.add(result["source"])
        want = expected(kinds[result["source"]], rubric)
        got = {"status": result["status"], "score": result["score"] if want["score"] is not None else None,
               **{part: result["parts"].get(part, {}).get("status") for part in rubric.part_ids}}
        if got != want:
            differs = {k: f"{got[k]} (expected {want[k]})" for k in want if got[k] != want[k]}
            wrong.append(f"{result['source']}: {differs}" + (f": {result['message'][:300]}" if result.get("message") else ""))
    wrong += [f"{name}: no result" for name in sorted(set(kinds) - seen)]
    return wrong


def log_speed(log: str) -> float:
    """MB/s of grader.evidence.logfile.parse_log on a 100 MB log: a real log repeated, with noise between."""
    noise = "".join(f"NCCL INFO channel {i} ring 0 1 2 3\x1b[0m\r\n" for i in range(20))
    unit = (log + noise).encode()
    data = unit * (100 * (1 << 20) // len(unit) + 1)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        parse_log(data, min_world_size=4)
        best = min(best, time.perf_counter() - started)
    return len(data) / (1 << 20) / best


def grade(inbox, out, jobs, executor, rubric_path, files=None, sandbox="auto"):
    paths = [inbox / f for f in files] if files else [inbox]
    started = time.monotonic()
    summary = grade_batch(paths, out, jobs=jobs, rubric_path=rubric_path, executor=executor, sandbox=sandbox,
                          progress=False)
    return summary, time.monotonic() - started


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handins", type=int, default=100)
    parser.add_argument("--baseline-handins", type=int, default=6,
                        help="graded with torchrun (slow); 0: no baseline and no ratio")
    parser.add_argument("--jobs", type=int, default=None,
                        help="hand-ins graded at once (default: the grader's own choice from this machine)")
    parser.add_argument("--rubric", help="a rubric read on top of grader/rubric.yaml, as grade's --rubric")
    parser.add_argument("--elsewhere", default="20,1", metavar="HANDINS,BASELINE",
                        help="the hand-ins and the torchrun hand-ins of each other configuration (an ordinary "
                             "user, torch's CUDA build); 0,0: none (default: %(default)s)")
    parser.add_argument("--cuda-python", default=str(CUDA_PYTHON),
                        help="a Python with torch's CUDA build, for the configurations with it (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print this configuration's figures as JSON, and "
                        "nothing else (the run as an ordinary user, or with another torch)")
    parser.add_argument("--user-too", action="store_true",
                        help="with --json, as root: the same again as an ordinary user made for the run")
    args = parser.parse_args(argv)
    rubric = load_rubric(args.rubric)
    tmp = Path(tempfile.mkdtemp(prefix="a4-bench-"))
    try:
        if not args.json:
            print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, "
                  f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / (1 << 30):.0f} GiB, "
                  f"Linux {platform.release()}, Python {platform.python_version()}, torch {torch.__version__}; "
                  f"load average before: {os.getloadavg()[0]:.1f}")
        log, err = reference_log(tmp / "run")
        kinds = build_handins(tmp / "inbox", args.handins, log, err)
        floor = fork_gloo_floor()
        memory = MemorySampler()
        warm = grade(tmp / "inbox", tmp / "warm", args.jobs, "warm", args.rubric)
        memory.stop()
        files = baseline_files(kinds, args.baseline_handins)
        # The baseline has no sandbox (torchrun starts its own processes): a plain process per rank.
        # None given (--baseline-handins 0): no baseline, and no ratio.
        cold = grade(tmp / "inbox", tmp / "torchrun", args.jobs, "torchrun", args.rubric, files, sandbox="off") \
            if files else None
        wrong = wrong_results(tmp / "warm", kinds, rubric) + \
            (wrong_results(tmp / "torchrun", {f: kinds[f] for f in files}, rubric) if cold else [])
        if args.json:
            mine = {configuration(): {"wrong": wrong} if wrong else figures(warm, cold, floor)}
            print(json.dumps(mine | (elsewhere(args) if args.user_too else {})))
            return 0
        print(f"hand-ins: {args.handins} (half the reference, a tenth the skeleton, the rest mutants), each re-run "
              f"at {len(rubric.checks)} checks ({', '.join(rubric.part_ids)}); {warm[0].jobs}")
        print(f"statuses:          {dict(sorted(warm[0].statuses.items()))}")
        if wrong:
            print(f"NO FIGURES: {len(wrong)} hand-in(s) did not get what the corpus says they must, so a rate "
                  f"would count failures as work done:", *wrong[:12], sep="\n  ")
            return 1
        report(args, warm, cold, floor, memory, log, tmp / "warm")
        if args.elsewhere != "0,0" and not args.rubric:
            return print_configurations({configuration(): figures(warm, cold, floor), **elsewhere(args)})
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def baseline_files(kinds: dict, n: int) -> list:
    """The first `n` hand-ins, in name order, but the reference among them (a mutant comes first)."""
    names = sorted(kinds)
    chosen = names[:max(n, 0)]
    if chosen and "reference" not in {kinds[f] for f in chosen}:
        chosen[-1] = next(f for f in names if kinds[f] == "reference")
    return chosen


def configuration() -> str:
    """Who grades and with which torch: "root, CPU build", "ordinary user, CUDA build"."""
    return f"{'root' if os.geteuid() == 0 else 'ordinary user'}, {'CUDA' if torch.version.cuda else 'CPU'} build"


def figures(warm_run, cold_run, floor: float) -> dict:
    """One configuration's figures: hand-ins graded by each executor, hand-ins a minute, the time a
    world (the batch's wall time over its worlds) and the fork-and-gloo floor."""
    (warm, warm_s), cold = warm_run, cold_run or (None, None)
    return {"handins": warm.graded, "rate": warm.graded / warm_s * 60, "world": warm_s / max(warm.worlds, 1),
            "floor": floor, "jobs": warm.jobs.split(",")[0],
            "baseline": cold[0].graded if cold[0] else 0,
            "baseline_rate": cold[0].graded / cold[1] * 60 if cold[0] else None}


def elsewhere(args) -> dict:
    """The figures of the other configurations: as an ordinary user (as root), and, where torch's CUDA
    build is installed, with it as this user (and as an ordinary user, as root)."""
    # as the run with --user-too, the same hand-ins as its own; else the smaller run --elsewhere asks for
    handins, baseline = (args.handins, args.baseline_handins) if args.json else args.elsewhere.split(",")
    again = ["--handins", str(handins), "--baseline-handins", str(baseline)] + (["--jobs", str(args.jobs)] if args.jobs else [])
    user = as_a_user(Path(__file__), again, "an ordinary user") if os.geteuid() == 0 else None
    found = dict(user or {})   # keyed by the user's own configuration()
    if not args.json:
        found.update(with_python(args.cuda_python, Path(__file__), again + ["--user-too"], "torch's CUDA build") or {})
    return found


def print_configurations(found: dict) -> int:
    """A line per configuration measured: its hand-ins a minute, torchrun's and their ratio, its time a
    world against its floor. 1 where a configuration's results were not what the corpus says."""
    print(f"{'configuration':26s} {'hand-ins':>9s} {'per min':>8s} {'torchrun':>9s} {'per min':>8s} {'ratio':>7s} "
          f"{'world':>7s} {'floor':>7s} {'x floor':>7s}  jobs")
    failed = 0
    for name, got in found.items():
        if "wrong" in got:
            failed = 1
            print(f"{name:26s} NO FIGURES: " + "; ".join(got["wrong"][:3]))
            continue
        ratio = f"{got['rate'] / got['baseline_rate']:6.1f}x" if got["baseline_rate"] else f"{'-':>7s}"
        cold = f"{got['baseline_rate']:8.2f}" if got["baseline_rate"] else f"{'-':>8s}"
        print(f"{name:26s} {got['handins']:9d} {got['rate']:8.1f} {got['baseline']:9d} {cold} {ratio} "
              f"{got['world']:7.3f} {got['floor']:7.3f} {got['world'] / got['floor']:6.2f}x  {got['jobs']}")
    print("each line measured side by side in one run of its own: the warm executor with the sandbox, torchrun "
          "without, the floor (4 ranks forked from a warm process, joining gloo, one all-reduce) by the same "
          "Python as the same user; world: the batch's wall time over its worlds")
    return failed


def report(args, warm_run, cold_run, floor: float, memory: MemorySampler, log: str, out: Path) -> None:
    """Print the figures of a batch whose every result was what the corpus expects (`cold_run`:
    None where no baseline ran)."""
    warm, warm_s = warm_run
    mb_s = log_speed(log)
    warm_rate = warm.graded / warm_s * 60
    per_world = warm_s / max(warm.worlds, 1)      # the batch's wall time over its worlds
    latency = warm.world_seconds / max(warm.worlds, 1)   # one world, start to report, jobs sharing the CPUs
    grader_mb, helper_mb = memory.grader, memory.helpers
    tenth = max(len(grader_mb) // 10, 1)
    isolation = json.loads(next((out / "students").glob("*/grading.json")).read_text())["isolation"]
    print(f"every result as expected: {warm.graded} hand-ins by the warm executor, "
          f"{cold_run[0].graded if cold_run else 'none'} by torchrun")
    print(f"sandbox:           {isolation.get('sandbox', 'none')}: {isolation.get('files')}; "
          f"{isolation.get('network')}; {isolation.get('processes')}; {isolation.get('user')}")
    print(f"warm executor:     {warm.graded} hand-ins in {warm_s:.1f} s = {warm_rate:.0f} hand-ins/min "
          f"({warm.worlds} worlds, {latency:.3f} s each from start to report; {warm.jobs.split(',')[0]})")
    if cold_run is None:
        print("torchrun baseline: not run (--baseline-handins 0), so no throughput ratio")
    else:
        cold, cold_s = cold_run
        cold_rate = cold.graded / cold_s * 60
        print(f"torchrun baseline: {cold.graded} hand-ins in {cold_s:.1f} s = {cold_rate:.1f} hand-ins/min "
              f"({cold.worlds} worlds, {cold.world_seconds / max(cold.worlds, 1):.3f} s each)")
        print(f"throughput ratio:  {warm_rate / cold_rate:.1f}x")
    print(f"time per world:    {per_world:.3f} s (wall time / worlds) against a fork-and-gloo floor of "
          f"{floor:.3f} s (4 ranks, one all-reduce) = {per_world / floor:.2f}x the floor")
    print(f"grader memory:     {grader_mb[0]:.0f} MB at the start, {statistics.mean(grader_mb[:tenth]):.0f} MB "
          f"over the first tenth of the batch, {statistics.mean(grader_mb[-tenth:]):.0f} MB over the last, "
          f"peak {max(grader_mb):.0f} MB; re-run processes peak {max(helper_mb):.0f} MB (proportional share)")
    print(f"log parsing:       {mb_s:.0f} MB/s on a 100 MB log")


if __name__ == "__main__":
    raise SystemExit(main())
