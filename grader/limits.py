"""What one world of a re-run may use: the rubric's `limits`, which the sandbox enforces, and how long
(a batch's part clock from the reference's time, `part_clock`); and how many worlds a machine or a
Slurm task holds at once (`default_jobs`, `slurm_task`).

Its own module so that the processes that run hand-in code import this and nothing else of the
rubric (no loader, no YAML, nothing a hand-in could find in its own memory).
"""

import math
import os
from dataclasses import dataclass

# The rubric's `timeouts`, each default written once here (grader.rubric.Timeouts has them all,
# grader.rerun.wire.protocol.Timeouts what a world's leader is told), in seconds.
PART_SECONDS = 20.0           # wall clock of one part in one world
PROCESS_GROUP_SECONDS = 10.0  # how long a collective waits for a missing rank
WORLD_START_SECONDS = 60.0    # from starting a world to every rank having loaded the code
HANDIN_SECONDS = 600.0        # all re-runs of one hand-in
HELPER_MB = 1024              # a grader's, or a re-run helper's, own memory beside its worlds (CUDA build: 0.6 GB)
# A batch's part clock at each check, from the reference solution's time there (`part_clock`).
PART_FLOOR_SECONDS = 1.5      # never shorter: a correct part far slower than the reference's still fits (the
                              # stock parts take 5 ms to 30 ms a rank); past it on a loaded machine, the part
                              # runs again on the rubric's clock (grader.rerun.starved)
PART_FACTOR = 10.0            # times the reference's whole check: its world, every part, their judging


def part_clock(reference_s: float, ceiling: float = PART_SECONDS) -> float:
    """A part's wall clock at one check of a batch, from what the reference solution needed at that
    check on this machine (the canary times it, grader.batch.local):

        clock = min(ceiling, max(PART_FLOOR_SECONDS, PART_FACTOR x reference_s))

    `reference_s` is the whole check (its world's start, every part, their judging): a part of a
    correct hand-in needs a fraction of it, so the clock is a generous multiple of the part's own
    time; `ceiling`, the rubric's timeouts.part, is never exceeded. A hang so costs about the
    reference's time at a few checks, not the rubric's clock at every one."""
    return round(min(ceiling, max(PART_FLOOR_SECONDS, PART_FACTOR * reference_s)), 2)

# A hand-in's assignment4.py: refused as invalid above either cap, before anything parses it (the
# rubric's `files.max_code_kb` and `files.max_code_lines`; the reference is 28 KB and 641 lines).
# Parsing Python takes up to 0.9 GB of memory per MB of source (one-letter lines, 2 bytes a node):
# the caps keep any parse of a hand-in's code under about 0.25 GB.
CODE_KB = 256
CODE_LINES = 10000
# Grading parses a hand-in's code only in a child process of its own (grader.outline) held to
# PARSE_MB of address space and PARSE_SECONDS of CPU time: a parser's crash or blow-up on crafted
# code (Python 3.10 overflows its stack on a long `a+a+...+a`) costs that parse, never the grader.
PARSE_MB = 1024
PARSE_SECONDS = 10
# Open files of one rank (RLIMIT_NOFILE, soft and hard): a rank of the reference holds 12 at 4 ranks
# (its output, result and data pipes, gloo's sockets to each peer and its store), a world of 16 ranks
# about 30. Each open socket or pipe may hold kernel buffers no Pss shows; the watchdog counts the
# sockets' (grader.rerun.sandbox.outside), and this bounds how many a rank can hold.
RANK_OPEN_FILES = 256
# Files a world's /tmp and /dev/shm (and each rank's) may hold, per MB of limits.tmp_mb: each costs
# the kernel about 1 KB that no block of the file system, and so no reading of the watchdog, shows.
TMP_FILES_PER_MB = 128
# What a world's sockets may hold in the kernel, at most: limits.memory_mb / SOCKETS_SHARE (256 MB of
# the default 4096). The machine's TCP memory is one pool for every world and every process
# (net.ipv4.tcp_mem, UDP's likewise: about a tenth of its RAM); a world that held it all would make
# the other worlds' gloo joins, and the machine's own connections, fail. --jobs worlds, each held
# to a sixteenth of its limit, take at most about 6% of the RAM; gloo's own buffers are a few MB.
SOCKETS_SHARE = 16


@dataclass
class Limits:
    """What one world of a re-run may use (grader.rerun.sandbox.namespaces, cgroup and memory enforce them)."""
    # Memory of one world: its ranks and everything they start, together (the sum of their Pss), held
    # by a cgroup of the world's own where there is one and by a watchdog everywhere. A 4-rank world of
    # the reference at the stock rubric's largest check peaks near 260 MB with torch's CPU build and
    # 390 MB with its CUDA build (which maps 3 GB of address space at `import torch`, none of it a
    # limit's business): 4096 leaves a hand-in ten times that.
    memory_mb: int = 4096
    processes: int = 128       # processes and threads of one world, together (a 4-rank world runs about 20)
    file_mb: int = 64          # largest file a rank may write (its output included)
    tmp_mb: int = 64           # size of the world's /tmp (and /dev/shm), with TMP_FILES_PER_MB files a MB
    cpu_s: int = 300           # CPU seconds of one rank


@dataclass
class SlurmTask:
    """What one grading array task asks Slurm for."""
    minutes: int
    cpus: int
    mem_gb: int

    def __str__(self) -> str:
        return f"{self.minutes} min, {self.cpus} CPUs, {self.mem_gb} GB"


def slurm_task(chunk: int, jobs: int, handin_s: float = HANDIN_SECONDS,
               memory_mb: int = Limits.memory_mb) -> SlurmTask:
    """What an array task grading `chunk` hand-ins, `jobs` at once, needs at most (`handin_s`, the
    rubric's timeouts.handin; `memory_mb`, its limits.memory_mb):

        minutes = (ceil(chunk / jobs) + 1) x handin_s / 60 + 5: every hand-in may run out its
                  timeout, and so may the canary before them (the reference at every check);
                  5 for the helpers to start
        cpus    = max(2, jobs): a world's ranks compute on one thread each, and wait on each other
        mem_gb  = (jobs x (memory_mb + HELPER_MB) + HELPER_MB) / 1024: every world at its limit,
                  its helper, and the grader
    """
    rounds = math.ceil(chunk / max(1, jobs)) + 1
    return SlurmTask(minutes=math.ceil(rounds * handin_s / 60) + 5, cpus=max(2, jobs),
                     mem_gb=math.ceil((jobs * (memory_mb + HELPER_MB) + HELPER_MB) / 1024))


@dataclass
class Machine:
    """What this machine gives a batch: read by `read_machine`, faked by tests. 0: not bounded there."""
    cores: int                 # CPUs this process may run on (os.sched_getaffinity)
    available_mb: int          # MemAvailable of /proc/meminfo
    cgroup_cpus: float = 0.0   # CPU quota of this process's cgroup (cpu.max, cpu.cfs_quota_us), in CPUs
    cgroup_mb: int = 0         # memory limit of this process's cgroup (memory.max, memory.limit_in_bytes)
    slurm_cpus: int = 0        # a Slurm task's SLURM_CPUS_PER_TASK
    slurm_mb: int = 0          # its SLURM_MEM_PER_NODE, or SLURM_MEM_PER_CPU x its CPUs


@dataclass
class Jobs:
    """How many hand-ins a batch grades at once, and the one line that says why."""
    jobs: int
    why: str


def _tightest(*pairs) -> tuple:
    """The smallest of (value, source) pairs whose value bounds (> 0); (0, "unknown") when none does."""
    return min(((v, s) for v, s in pairs if v and v > 0), key=lambda p: p[0], default=(0, "unknown"))


JOBS_RULE = (f"max(1, min(CPUs // the largest check's world_size, (memory - {HELPER_MB} MB) // (limits.memory_mb + "
             f"{HELPER_MB} MB))), CPUs and memory the tightest of the machine's, its cgroup's and a Slurm task's")


def default_jobs(machine: Machine, world_size: int, memory_mb: int = Limits.memory_mb) -> Jobs:
    """--jobs from the machine: as many worlds as its CPUs and its memory hold, never fewer than one.

        cpus = the fewest of cores, the cgroup's quota and a Slurm task's CPUs
        mem  = the least of MemAvailable, the cgroup's limit and a Slurm task's memory (MB)
        jobs = max(1, min(cpus // world_size, (mem - HELPER_MB) // (memory_mb + HELPER_MB)))

    `world_size`: the rubric's largest check (each rank computes on one thread); `memory_mb`: its
    limits.memory_mb. Each world may reach its limit beside its helper, and the grader needs its own
    HELPER_MB: the sum a Slurm task asks for (`slurm_task`), read backwards.
    """
    cpus, cpu_from = _tightest((machine.cores, "cores"), (machine.cgroup_cpus, "the cgroup's CPU quota"),
                               (machine.slurm_cpus, "SLURM_CPUS_PER_TASK"))
    mem, mem_from = _tightest((machine.available_mb, "MemAvailable"), (machine.cgroup_mb, "the cgroup's limit"),
                              (machine.slurm_mb, "the Slurm task's memory"))
    by_cpus = int(cpus) // max(1, world_size)
    by_mem = (int(mem) - HELPER_MB) // (memory_mb + HELPER_MB) if mem else by_cpus   # unknown: the CPUs decide
    jobs = max(1, min(by_cpus, by_mem))
    memory = (f"{mem / 1024:.1f} GB ({mem_from}) hold {max(0, by_mem)} of {memory_mb} MB (limits.memory_mb) and a "
              f"helper each") if mem else "the memory is unknown"
    return Jobs(jobs, f"--jobs {jobs}, from the machine: {cpus:g} CPUs ({cpu_from}) hold {max(0, by_cpus)} "
                      f"world(s) of {world_size} ranks; {memory}"
                      + ("; at least one" if jobs > min(by_cpus, by_mem) else ""))


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _cgroup_folders(controller: str) -> list:
    """This process's cgroup folders for `controller` (v1) or its v2 folder, from itself up to the
    root, where they are mounted (a container's view may lack its own folder: its parents stand)."""
    for line in _read("/proc/self/cgroup").splitlines():
        _, names, path = (line.split(":", 2) + ["", ""])[:3]
        if (controller in names.split(",")) if names else True:
            base = f"/sys/fs/cgroup/{controller}" if names else "/sys/fs/cgroup"
            parts = [p for p in path.split("/") if p]
            folders = [os.path.join(base, *parts[:n]) for n in range(len(parts), -1, -1)]
            found = [f for f in folders if os.path.isdir(f)]
            if found:
                return found
    return []


def _cgroup_bounds() -> tuple:
    """(CPUs, MB) the cgroups above this process allow, the tightest level of each (0: no bound)."""
    cpus, mb = [], []
    for folder in _cgroup_folders("cpu"):
        quota = _read(os.path.join(folder, "cpu.max")).split() or \
            [_read(os.path.join(folder, "cpu.cfs_quota_us")), _read(os.path.join(folder, "cpu.cfs_period_us"))]
        if len(quota) == 2 and quota[0].isdigit() and quota[1].isdigit() and int(quota[1]):
            cpus.append(int(quota[0]) / int(quota[1]))
    for folder in _cgroup_folders("memory"):
        for name in ("memory.max", "memory.limit_in_bytes"):
            text = _read(os.path.join(folder, name))
            if text.isdigit() and int(text) < 1 << 60:
                mb.append(int(text) >> 20)
    return min(cpus, default=0.0), min(mb, default=0)


def _int(name: str) -> int:
    text = os.environ.get(name, "").split("(")[0]   # SLURM_CPUS_PER_TASK can read "4(x2)" on some versions
    return int(text) if text.isdigit() else 0


def read_machine() -> Machine:
    """This machine as `default_jobs` reads it: its CPUs, its memory, its cgroup's and a Slurm task's bounds."""
    meminfo = dict(line.split(":", 1) for line in _read("/proc/meminfo").splitlines() if ":" in line)
    available = meminfo.get("MemAvailable", "0 kB").split()[0]
    cgroup_cpus, cgroup_mb = _cgroup_bounds()
    slurm_cpus = _int("SLURM_CPUS_PER_TASK") if os.environ.get("SLURM_JOB_ID") else 0
    slurm_mb = (_int("SLURM_MEM_PER_NODE") or _int("SLURM_MEM_PER_CPU") * (slurm_cpus or 1)) \
        if os.environ.get("SLURM_JOB_ID") else 0
    return Machine(cores=len(os.sched_getaffinity(0)), available_mb=int(available) >> 10 if available.isdigit() else 0,
                   cgroup_cpus=cgroup_cpus, cgroup_mb=cgroup_mb, slurm_cpus=slurm_cpus, slurm_mb=slurm_mb)
