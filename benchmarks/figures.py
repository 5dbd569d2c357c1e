"""docs/figures.md: every benchmark of benchmarks/ run once, and what it printed written down with
the date, the commit and the machine.

    make bench
    python benchmarks/figures.py [NAME ...] [--out docs/figures.md] [--rubric FILE] [--with ARGS]

Runs each benchmarks/*.py but this one, in name order (NAME ...: only those, e.g.
grading_throughput; the page keeps the other sections as they were; those named gpu_* need GPUs and
run only when named, as `make gpu-check` does; `--rubric FILE` reaches every benchmark that takes
one, e.g. benchmarks/part5.yaml to measure with Part 5 on), shows its output as it comes
and writes the page: per benchmark, what it measures (its docstring's first paragraph), the command,
when, from which commit and on which machine it ran, and what it printed. A benchmark that fails is
written down with its exit status and the tail of its stderr; the command then exits 1, after
writing the page. The page is the one place the kit's measured figures live: every other page links
to it.
"""

import argparse
import ast
import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
PAGE = ROOT / "docs" / "figures.md"
HEADER = """# Figures

Written by `make bench` (`benchmarks/figures.py`), which runs every benchmark in `benchmarks/` and
writes down what it printed; do not edit this page by hand. Each section says when, from which
commit and on which machine its benchmark ran. The figures move with the machine and with what
else runs on it: the load average of the last minute is given at the start and at the end, and a
ratio measured side by side in one run (the warm executor against torchrun, a world against the
fork-and-gloo floor) moves less than a time. [scale.md](scale.md) says how grading works at scale
and what each benchmark measures.
"""
STDERR_TAIL = 40   # lines of a failed benchmark's stderr kept on the page


def benchmarks() -> dict:
    """name -> path of every benchmark: the scripts of benchmarks/ but this one (a name that starts
    with _ is a helper a benchmark runs)."""
    return {p.stem: p for p in sorted(HERE.glob("*.py")) if p != Path(__file__).resolve() and not p.stem.startswith("_")}


def needs_gpu(name: str) -> bool:
    """Benchmarks named gpu_* run on a machine with GPUs only, when named (make gpu-check)."""
    return name.startswith("gpu_")


def arguments(path: Path, rubric) -> list:
    """What the benchmark at `path` is given: the rubric, when it takes one."""
    return ["--rubric", str(rubric)] if rubric and '"--rubric"' in path.read_text() else []


def summary(path: Path) -> str:
    """The first paragraph of a benchmark's docstring, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or path.stem
    return " ".join(doc.split("\n\n")[0].split())


def commit() -> str:
    """The commit the tree is at, and whether the tree's code differs from it (Markdown pages aside:
    no benchmark reads them)."""
    def git(*args):
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None
    head = git("rev-parse", "--short=12", "HEAD")
    if head is None:
        return "unknown (not a git checkout)"
    dirty = git("status", "--porcelain", "--", ".", ":(exclude)*.md")
    return head + (" with uncommitted changes" if dirty else "")


def machine() -> str:
    """CPU, cores, memory, OS, Python, torch (with CUDA and NCCL when it has them) and GPUs."""
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor() or platform.machine())
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    probe = ("import torch\nnccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None\n"
             "print(torch.__version__, 'CUDA', torch.version.cuda or 'none', 'NCCL', "
             "'.'.join(map(str, nccl)) if isinstance(nccl, tuple) else nccl or 'none')")
    torch = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    torch = torch.stdout.strip() if torch.returncode == 0 else "not importable"
    gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                          text=True) if _has("nvidia-smi") else None
    gpus = ", ".join(gpus.stdout.split("\n")).strip(", ") if gpus and gpus.returncode == 0 else "none"
    return (f"{cpu}, {platform.machine()}, {os.cpu_count()} CPUs, {memory:.0f} GiB; {platform.system()} "
            f"{platform.release()}; Python {platform.python_version()}; torch {torch}; GPUs: {gpus}")


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _has(command: str) -> bool:
    return any((Path(d) / command).is_file() for d in os.environ.get("PATH", "").split(os.pathsep))


def run(path: Path, args: list) -> tuple:
    """Run one benchmark with `args`, echoing its output: (exit status, stdout, the tail of stderr, seconds)."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(path), *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace")
    errors = []

    def echo_stderr():
        for line in proc.stderr:
            sys.stderr.write(line)
            errors.append(line)
            del errors[:-STDERR_TAIL]

    thread = threading.Thread(target=echo_stderr, daemon=True)
    thread.start()
    out = []
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        out.append(line)
    status = proc.wait()
    thread.join()
    return status, "".join(out), "".join(errors), time.monotonic() - started


def section(name: str, path: Path, args: list, ran: tuple, where: str) -> str:
    """The page's section of one benchmark's run with `args`: `ran` is (start time, commit, exit
    status, stdout, the tail of stderr, seconds)."""
    when, at, status, out, errors, seconds = ran
    lines = [f"## {name}", "", f"<!-- section {name}: written by benchmarks/figures.py -->", summary(path), "",
             f"- command: `{' '.join(['python', str(path.relative_to(ROOT)), *args])}`",
             f"- run: {when:%Y-%m-%d %H:%M} UTC, {seconds:.0f} s, exit status {status}",
             f"- commit: {at}", f"- machine: {where}", "", "```text", out.rstrip("\n") or "(printed nothing)",
             "```"]
    if status != 0:
        lines += ["", f"It failed (exit status {status}); the end of its stderr:", "", "```text",
                  errors.rstrip("\n"), "```"]
    return "\n".join(lines) + f"\n<!-- end {name} -->\n"


def kept_sections(page: Path) -> dict:
    """The sections an earlier page holds, by benchmark name, as they were written."""
    text = _read(str(page))
    return {m.group(1): m.group(0) + "\n" for m in
            re.finditer(r"## (\w+)\n\n<!-- section \1: .*?<!-- end \1 -->", text, re.S)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"only these benchmarks (of {', '.join(benchmarks())})")
    parser.add_argument("--out", type=Path, default=PAGE, help="the page to write (default docs/figures.md)")
    parser.add_argument("--rubric", type=Path, metavar="FILE",
                        help="a rubric read on top of grader/rubric.yaml, for every benchmark that takes one")
    parser.add_argument("--with", dest="given", default="", metavar="ARGS",
                        help="more arguments for the benchmarks named, e.g. grading_throughput --with '--handins 40 "
                             "--baseline-handins 2' (the page shows the command as it ran)")
    args = parser.parse_args(argv)
    if args.given and not args.names:
        parser.error("--with needs the benchmarks it is for named")
    found = benchmarks()
    unknown = [n for n in args.names if n not in found]
    if unknown:
        parser.error(f"no benchmark {', '.join(unknown)} in benchmarks/ (there are {', '.join(found)})")
    sections, failed = kept_sections(args.out), []
    where, at = machine(), commit()   # the tree as the run starts: the benchmarks load it as they start
    for name in args.names or [n for n in found if not needs_gpu(n)]:
        extra = arguments(found[name], args.rubric) + shlex.split(args.given)
        print(f"== {name}: {' '.join(['python', str(found[name].relative_to(ROOT)), *extra])}", flush=True)
        load, when = os.getloadavg()[0], datetime.datetime.now(datetime.timezone.utc)
        status, out, errors, seconds = run(found[name], extra)
        load = f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
        sections[name] = section(name, found[name], extra, (when, at, status, out, errors, seconds),
                                 f"{where}; {load}")
        failed += [name] if status else []
    body = "\n".join(sections[n] for n in found if n in sections)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(HEADER + "\n" + body)
    print(f"wrote {args.out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
