"""Grading throughput: the warm executor against the torchrun baseline, side by side in one run.

    make bench [RUBRIC=benchmarks/part5.yaml]
    python benchmarks/grading_throughput.py [--handins 100] [--baseline-handins 6] [--jobs N] [--rubric FILE]

Builds synthetic hand-ins from the test corpus (the reference, the skeleton and fast-failing
mutants, each with a real run's log), grades them all with the warm executor and a few with the
torchrun baseline (each re-run at every check of the rubric: grader/rubric.yaml, with --rubric's
changes on top), and prints: hand-ins per minute for both and their ratio; the time per world
against the fork-and-gloo floor measured on the spot; the grader's memory at the start, its peak
and its end, and the helpers' peak; and the log parser's speed on a 100 MB log. --jobs is the grader's
own choice from this machine unless given (grader.limits.default_jobs). Not a test: the
figures depend on the machine and on what else runs on it.

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
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from grader.batch.run import grade_batch  # noqa: E402
from grader.evidence.logfile import parse_log  # noqa: E402
from grader.rubric import load_rubric  # noqa: E402
from benchmarks._floor import fork_gloo_floor  # noqa: E402
from tests.corpus import MUTANTS as CORPUS, REFERENCE, Files, mutate, refingerprint, skeleton, write_zip  # noqa: E402

MUTANTS = ["dp_summed", "acc_unscaled", "baseline_wrong_sign", "tp_own_shard_only", "baseline_no_step",
           "dp_no_allreduce", "tp_returns_shard", "acc_zero_grad_in_loop"]


def memory_mb(pid="self", field="Rss") -> float:
    """A process's resident memory (Rss), or its proportional share of pages shared with others (Pss)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class MemorySampler:
    """Samples the grader's memory and that of the processes re-running hand-ins (the zygotes and
    every rank forked from them, counted by proportional share since they share most pages)."""

    def __init__(self):
        self.grader, self.helpers = [], []
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _helpers(self) -> float:
        """The re-run processes of this benchmark alone: on a shared machine other suites' zygotes
        are in /proc too, and are not its own."""
        parent, zygotes = {}, []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                parent[pid] = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
                if b"grader.rerun.zygote" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    zygotes.append(pid)
            except (OSError, IndexError):
                pass
        return sum(memory_mb(pid, "Pss") for pid in zygotes if _descends(pid, str(os.getpid()), parent))

    def _run(self):
        while self.running:
            self.grader.append(memory_mb())
            self.helpers.append(self._helpers())
            time.sleep(0.2)

    def stop(self):
        self.running = False
        self.thread.join()


def _descends(pid: str, ancestor: str, parent: dict) -> bool:
    """Whether `pid` is `ancestor` or one of its descendants, by the parent ids in `parent`."""
    for _ in range(64):
        if pid == ancestor:
            return True
        if pid not in parent:
            return False
        pid = parent[pid]
    return False


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
    args = parser.parse_args(argv)
    rubric = load_rubric(args.rubric)
    tmp = Path(tempfile.mkdtemp(prefix="a4-bench-"))
    try:
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
        files = sorted(kinds)[: max(args.baseline_handins, 0)]
        # The baseline has no sandbox (torchrun starts its own processes): a plain process per rank.
        # None given (--baseline-handins 0): no baseline, and no ratio.
        cold = grade(tmp / "inbox", tmp / "torchrun", args.jobs, "torchrun", args.rubric, files, sandbox="off") \
            if files else None
        print(f"hand-ins: {args.handins} (half the reference, a tenth the skeleton, the rest mutants), each re-run "
              f"at {len(rubric.checks)} checks ({', '.join(rubric.part_ids)}); {warm[0].jobs}")
        print(f"statuses:          {dict(sorted(warm[0].statuses.items()))}")
        wrong = wrong_results(tmp / "warm", kinds, rubric) + \
            (wrong_results(tmp / "torchrun", {f: kinds[f] for f in files}, rubric) if cold else [])
        if wrong:
            print(f"NO FIGURES: {len(wrong)} hand-in(s) did not get what the corpus says they must, so a rate "
                  f"would count failures as work done:", *wrong[:12], sep="\n  ")
            return 1
        report(args, warm, cold, floor, memory, log, tmp / "warm")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
