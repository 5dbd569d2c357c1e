"""What one world costs, layer by layer: the reference re-run at the rubric's default check by the warm
executor, with the sandbox and without, each world's timeline split into its leader's set-up, the
ranks joining gloo, the parts, the ranks' end and the rest (the report, the pipes, the zygote's
sweep between worlds), beside the fork-and-gloo floor measured in the same run, and that floor
with its ranks doing the world's own work bare (the reference's part functions called directly).

    python benchmarks/world_layers.py [--worlds 40] [--rubric FILE]

As root where useradd and runuser are at hand, a third column: the same worlds graded by an ordinary
user made for the run (tests/tas.py: its own venv, the kit copied into its home), with the sandbox.
Where torch's CUDA build is installed beside the kit's (`--cuda-python`, by default .venv-cuda's
Python, which `make test-cuda` makes), a fourth: the sandbox's worlds with that build. Each column
has its own fork-and-gloo floor, measured by the same Python as the same user.

Each figure is the median over the worlds, in milliseconds; the first worlds of each executor warm
it and are not counted. As root with the sandbox, each world has a cgroup, namespaces and a user of
its own, and each rank a mount and IPC namespace of its own (docs/security.md); without it
(`--sandbox off`), a cgroup of its own and per-rank views where the machine allows them.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.rerun.check import prepare_code, run_check
from grader.rerun.executor import SandboxUnavailable, WarmExecutor
from grader.rerun.sandbox.namespaces import scratch_dir
from grader.rubric import load_rubric
from benchmarks._elsewhere import CUDA_PYTHON, as_a_user, with_python

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "assignment_4" / "reference" / "assignment4.py"
WARM_UP = 3   # worlds run first and not counted

# (name, what it is, its milliseconds from a world's timeline)
LAYERS = (
    ("set-up", "the leader: cgroup, namespaces, code, every rank forked with its own view",
     lambda t: t["forked"]),
    ("gloo", "the ranks joined gloo and said ready", lambda t: t["ready"]),
    ("parts", "every part run, its data served and its results sent", lambda t: t["done"] - t["ready"]),
    ("end", "the ranks ended and were reaped", lambda t: t["ended"] - t["done"]),
    ("rest", "the report, the pipes, the zygote's sweep between worlds", lambda t: t["round_trip"] - t["forked"] - t["ended"]),
    ("world", "the round trip, from the request sent to the report read", lambda t: t["round_trip"]),
)


def timelines(mode: str, worlds: int, rubric, cpu: dict = None) -> list:
    """The timelines of `worlds` worlds of the reference at the default check, by an executor of `mode`;
    `cpu`, where given, gets "per_world": the machine's CPU seconds a counted world (_floor.busy_seconds)."""
    from benchmarks._floor import busy_seconds
    executor = WarmExecutor(mode, rubric.limits)
    executor.start()
    code = prepare_code(REFERENCE)
    scratch = Path(scratch_dir("a4-layers-"))
    seen = []
    real = executor.run_world

    def run_world(job):
        report = real(job)
        seen.append(dict(report.timeline))
        if len(seen) == WARM_UP:
            busy.append(busy_seconds())
        return report

    busy = []

    executor.run_world = run_world
    try:
        while len(seen) < worlds + WARM_UP:
            run_check(executor, code, rubric.default_check, rubric, scratch, rubric.parts_at(rubric.default_check))
    finally:
        executor.close()
    if cpu is not None and busy and busy[0] is not None:
        cpu["per_world"] = (busy_seconds() - busy[0]) / worlds
    return [t for t in seen[WARM_UP:] if all(k in t for k in ("forked", "ready", "done", "ended", "round_trip"))]


def print_table(columns: dict, floors: dict, cpus: dict, world_size: int, parts: int) -> None:
    """The layers of each column's worlds (medians, ms), its floors, its CPU a world and its ratios."""
    def ms(value) -> str:
        return f"{1000 * value:14.1f}" if value is not None else f"{'-':>14s}"

    print(f"{'layer':8s} " + " ".join(f"{name:>14s}" for name in columns) + "  what")
    for layer, what, of in LAYERS:
        cells = [f"{1000 * statistics.median(of(t) for t in rows):14.1f}" for rows in columns.values()]
        print(f"{layer:8s} " + " ".join(cells) + f"  {what}")
    print(f"{'floor':8s} " + " ".join(f"{1000 * floors[name]['floor']:14.1f}" for name in columns) +
          f"  fork {world_size} ranks from a warm process, join gloo, one all-reduce, exit")
    print(f"{'work':8s} " + " ".join(f"{1000 * floors[name]['work']:14.1f}" for name in columns) +
          f"  the same, each rank calling the reference's {parts} part functions instead: the world's work, bare")
    print(f"{'cpu':8s} " + " ".join(ms(cpus.get(name)) for name in columns) +
          "  the machine's CPU a world, every process's, user and system (/proc/stat over the counted worlds)")
    print(f"{'cpu work':8s} " + " ".join(ms(floors[name].get("work_cpu")) for name in columns) +
          "  the same of the world's work done bare")
    for name, rows in columns.items():
        world = statistics.median(t["round_trip"] for t in rows)
        setup = statistics.median(LAYERS[0][2](t) + LAYERS[4][2](t) for t in rows)
        print(f"{name}: a world of {parts} parts is {world / floors[name]['floor']:.2f}x its floor's one "
              f"all-reduce, {world / floors[name]['work']:.2f}x the same parts done bare; the layers around the "
              f"ranks' own work (set-up and rest) are {1000 * setup:.1f} ms of its {1000 * world:.1f} ms" +
              (f"; its CPU {cpus[name] / floors[name]['work_cpu']:.2f}x the bare work's"
               if cpus.get(name) and floors[name].get("work_cpu") else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, default=40)
    parser.add_argument("--rubric", help="a rubric read on top of grader/rubric.yaml, as grade's --rubric")
    parser.add_argument("--json", action="store_true",
                        help="print the sandbox's timelines and the floor as JSON, and nothing else")
    parser.add_argument("--cuda-python", default=str(CUDA_PYTHON),
                        help="a Python with torch's CUDA build, for a column of its own (default: %(default)s)")
    args = parser.parse_args()
    rubric = load_rubric(args.rubric) if args.rubric else load_rubric()
    from benchmarks._floor import fork_gloo_floor, reference_parts
    check = rubric.default_check
    parts = rubric.parts_at(check)

    def both_floors() -> dict:
        cpu = {}
        return {"floor": fork_gloo_floor(repeats=args.worlds, world_size=check.world_size),
                "work": fork_gloo_floor(repeats=args.worlds, world_size=check.world_size, work=reference_parts(parts),
                                        cpu=cpu),
                "work_cpu": cpu.get("per_world")}

    if args.json:   # the run as an ordinary user (as_a_user), or with another torch (with_python)
        cpu = {}
        rows = timelines("auto", args.worlds, rubric, cpu)
        print(json.dumps({"timelines": rows, "cpu": cpu.get("per_world"), **both_floors()}))
        return 0
    print(f"a world of the reference at the default check ({check.world_size} ranks, parts "
          f"{', '.join(rubric.parts_at(check))}), as {'root' if os.geteuid() == 0 else 'an ordinary user'}, "
          f"median of {args.worlds} worlds each, in ms; load average before: {os.getloadavg()[0]:.1f}")
    columns, cpus = {}, {}
    for mode, name in (("auto", "sandbox"), ("off", "--sandbox off")):
        started, cpu = time.monotonic(), {}
        try:
            columns[name] = timelines(mode, args.worlds, rubric, cpu)
            cpus[name] = cpu.get("per_world")
        except SandboxUnavailable as e:
            print(f"{name}: cannot run here ({e})")
            continue
        print(f"{name}: {len(columns[name])} worlds in {time.monotonic() - started:.1f} s")
    floors = dict.fromkeys(columns, both_floors())
    if os.geteuid() == 0 and not args.rubric:
        again = ["--worlds", str(args.worlds)]
        for name, measured in (("user, sandbox", as_a_user(Path(__file__), again, "an ordinary user", 900)),
                               ("CUDA, sandbox", with_python(args.cuda_python, Path(__file__), again,
                                                             "torch's CUDA build", 900))):
            if measured:
                columns[name], floors[name], cpus[name] = measured["timelines"], measured, measured.get("cpu")
    print_table(columns, floors, cpus, check.world_size, len(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
