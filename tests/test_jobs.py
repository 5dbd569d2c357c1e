"""`--jobs` from the machine (grader.limits.default_jobs): faked machines into the pure function,
this machine's own reading, and one real batch that says its choice at the start."""

import os
import subprocess
import sys

import pytest
import yaml

from grader.limits import HELPER_MB, Machine, default_jobs, read_machine
from tests.corpus import REFERENCE, ROOT, Files, write_zip

pytestmark = pytest.mark.scale   # make test-scale runs these; make test leaves them out

GB = 1024


@pytest.mark.parametrize("machine, world, memory_mb, jobs, named", [
    (Machine(cores=32, available_mb=120 * GB), 4, 4096, 8, "32 CPUs (cores)"),             # the cores bound
    (Machine(cores=32, available_mb=12 * GB), 4, 4096, 2, "12.0 GB (MemAvailable)"),       # the memory bounds
    (Machine(cores=32, available_mb=120 * GB), 4, 16384, 7, "hold 7 of 16384 MB"),         # a rubric's larger worlds
    (Machine(cores=32, available_mb=120 * GB), 2, 4096, 16, "world(s) of 2 ranks"),        # smaller worlds
    (Machine(cores=2, available_mb=120 * GB), 4, 4096, 1, "at least one"),                 # a laptop: never 0
    (Machine(cores=16, available_mb=2 * GB), 4, 4096, 1, "at least one"),                 # nor for memory
    (Machine(cores=64, available_mb=500 * GB, cgroup_cpus=10.5, cgroup_mb=40 * GB), 4, 4096, 2,
     "10.5 CPUs (the cgroup's CPU quota)"),                                                # a container's quota
    (Machine(cores=64, available_mb=500 * GB, cgroup_mb=20 * GB), 4, 4096, 3, "the cgroup's limit"),
    (Machine(cores=64, available_mb=500 * GB, slurm_cpus=8, slurm_mb=16000), 4, 4096, 2,   # a Slurm task
     "8 CPUs (SLURM_CPUS_PER_TASK)"),
    (Machine(cores=64, available_mb=500 * GB, slurm_cpus=32, slurm_mb=11 * GB), 4, 4096, 2,
     "the Slurm task's memory"),
])
def test_jobs_follow_the_tightest_of_the_cpus_and_the_memory(machine, world, memory_mb, jobs, named):
    chosen = default_jobs(machine, world, memory_mb)
    assert chosen.jobs == jobs and named in chosen.why and chosen.why.startswith(f"--jobs {jobs}, from the machine")
    if chosen.jobs > 1:   # what it chose fits: its worlds at their limit, a helper each and the grader
        cpus = min(v for v in (machine.cores, machine.cgroup_cpus, machine.slurm_cpus) if v)
        mem = min(v for v in (machine.available_mb, machine.cgroup_mb, machine.slurm_mb) if v)
        assert chosen.jobs * world <= cpus and chosen.jobs * (memory_mb + HELPER_MB) + HELPER_MB <= mem


def test_this_machine_is_read_with_a_slurm_tasks_allocation(monkeypatch):
    plain = read_machine()
    assert plain.cores == len(os.sched_getaffinity(0)) and plain.available_mb > 0
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    monkeypatch.setenv("SLURM_MEM_PER_CPU", "2000")
    monkeypatch.delenv("SLURM_MEM_PER_NODE", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert read_machine().slurm_cpus == 0   # Slurm's variables count only inside a job
    monkeypatch.setenv("SLURM_JOB_ID", "48187")
    task = read_machine()
    assert (task.slurm_cpus, task.slurm_mb) == (3, 6000)
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "9000")
    assert read_machine().slurm_mb == 9000


@pytest.mark.timeout(300)
def test_a_batch_without_jobs_takes_them_from_the_machine_and_says_so_first(tmp_path):
    box = tmp_path / "inbox"
    box.mkdir()
    for name in ("s1", "s2"):
        write_zip(box / f"{name}.zip", Files(code=REFERENCE.read_text()))
    rubric = tmp_path / "rubric.yaml"
    rubric.write_text(yaml.safe_dump({"checks": [{"name": "default"}], "public_world_sizes": [4]}))
    done = subprocess.run([sys.executable, "-m", "grader", "grade", str(box), "--out", str(tmp_path / "out"),
                           "--rubric", str(rubric)], cwd=ROOT, capture_output=True, text=True, timeout=250)
    assert done.returncode == 0, done.stderr
    expected = default_jobs(read_machine(), 4, 4096).jobs
    first = done.stderr.splitlines()[0]
    assert first.startswith(f"grading 2 hand-in(s): --jobs {expected}, from the machine: "), done.stderr
    given = subprocess.run([sys.executable, "-m", "grader", "grade", str(box), "--out", str(tmp_path / "again"),
                            "--rubric", str(rubric), "--jobs", "2"], cwd=ROOT, capture_output=True, text=True,
                           timeout=250)
    assert given.returncode == 0 and given.stderr.splitlines()[0] == "grading 2 hand-in(s): --jobs 2, as given"
