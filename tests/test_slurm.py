"""The Slurm kit on a real Slurm cluster: real sbatch, real srun, real torchrun, real submitit.

`make test-slurm` starts a local cluster of 4 emulated nodes (tests/slurm_cluster/start-local-cluster.sh),
runs these tests and stops it. Without a cluster that answers, every test here skips and says
why. Each test works in build/test-slurm/<test>/, where the jobs' .log and .err stay for a look.
"""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader.evidence.logfile import parse_log
from tests.corpus import FULL_CSV
from tests.test_submit import HEADER_KEYS, footer_status
from tests.worlds import REFERENCE, ROOT

pytestmark = pytest.mark.slurm

SBATCH_GPU = ROOT / "slurm" / "assignment4.sbatch"
SBATCH_CPU = ROOT / "slurm" / "assignment4-cpu.sbatch"
JOBS = ROOT / "tests" / "slurm_jobs"
LOCAL_PROFILE = ROOT / "tests" / "slurm_cluster" / "profile.yaml"
NODES = [f"node{i}" for i in range(1, 5)]
HANG_GUARD_S = 240   # no job here should take this long; only a hang would
UNFINISHED = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}


def _cluster_problem():
    if os.environ.get("A4_SLURM_SKIP_REASON"):
        return os.environ["A4_SLURM_SKIP_REASON"]
    if shutil.which("sbatch") is None:
        return "no Slurm here (sbatch not found); `make test-slurm` starts a local cluster (root, Debian)"
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    if "UP" not in ping.stdout:
        return "no Slurm controller answers (scontrol ping); `make test-slurm` starts a local one"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        idle = subprocess.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], capture_output=True,
                              text=True, timeout=30).stdout.split()
        if set(NODES) <= set(idle):
            return None
        time.sleep(0.5)
    return f"the cluster does not have {', '.join(NODES)} idle (sinfo); is it the local test cluster?"


@pytest.fixture(scope="module")
def cluster():
    problem = _cluster_problem()
    if problem:
        pytest.skip(problem)


@pytest.fixture
def workdir(request, cluster):
    path = ROOT / "build" / "test-slurm" / request.node.name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def job_env(**extra):
    """The environment sbatch passes to the job: the kit, this Python first on PATH."""
    env = dict(os.environ, A4_KIT=str(ROOT), A4_TIMEOUT_S="60",
               A4_SETUP=f'export PATH="{Path(sys.executable).parent}:$PATH"')
    env.update(extra)
    return env


def sbatch(script, args, cwd, **env):
    proc = subprocess.run(["sbatch", "--parsable", *args, str(script)], cwd=cwd, env=job_env(**env),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def job_state(job_id):
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True,
                         text=True, timeout=30).stdout.split("\n")[0].strip()
    return out or "UNKNOWN"


def wait_for_job(job_id, guard_s=HANG_GUARD_S):
    """Poll sacct every half second (sbatch --wait backs off to long intervals) until the job ends."""
    deadline = time.monotonic() + guard_s
    while True:
        state = job_state(job_id)
        if state != "UNKNOWN" and state.split()[0] not in UNFINISHED:
            return state
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id])
            pytest.fail(f"job {job_id} still {state} after {guard_s} s (hang guard); cancelled it")
        time.sleep(0.5)


def job_files(workdir, job_id, name="assignment4"):
    log, err = workdir / f"{name}-{job_id}.log", workdir / f"{name}-{job_id}.err"
    assert log.is_file() and err.is_file(), sorted(p.name for p in workdir.iterdir())
    return log.read_text(), err.read_text()


def submit_cli(*args, cwd):
    return [sys.executable, "-m", "slurm.submit", "--out", str(cwd), "--folder", str(cwd / "jobs" / "%j"),
            *args]


def assert_complete_run(text, nnodes, nproc, hosts):
    """Header, init lines, every part on every rank, done and footer, as the grader will read them."""
    log = parse_log(text, min_world_size=nnodes * nproc)
    world = nnodes * nproc
    assert [k for k in log.job if k not in ("status", "at")] == HEADER_KEYS, text
    assert log.job["nodes"] == ",".join(hosts), text
    assert (log.job["nnodes"], log.job["nproc_per_node"], log.job["world_size"]) == (
        str(nnodes), str(nproc), str(world)), text
    assert log.job["backend"] == "gloo" and log.backends == ["gloo"], text
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", log.job["torch"]), text
    assert log.world_size == world and log.flags == [], text
    assert sorted(log.hosts) == list(range(world)), text
    assert sorted(set(log.hosts.values())) == sorted(hosts), text   # every node ran ranks
    assert all(e.passed for e in log.parts.values()), text
    assert sorted(log.done_ranks) == list(range(world)) and log.finished, text
    assert footer_status(log) == 0, text
    return log


@pytest.mark.timeout(300)
def test_sbatch_cpu_job_on_4_nodes_matches_every_part_on_every_rank(workdir):
    job_id = sbatch(SBATCH_CPU, [], workdir, A4_SCRIPT=str(REFERENCE))
    assert wait_for_job(job_id) == "COMPLETED"
    text, err = job_files(workdir, job_id)
    log = assert_complete_run(text, nnodes=4, nproc=1, hosts=NODES)
    assert log.job["id"] == job_id
    assert "rendezvous at node1:" in err


@pytest.mark.timeout(300)
def test_sbatch_cpu_job_on_1_node_with_4_ranks(workdir):
    job_id = sbatch(SBATCH_CPU, ["--nodes=1", "--cpus-per-task=4"], workdir,
                    A4_SCRIPT=str(REFERENCE), A4_NPROC_PER_NODE="4")
    assert wait_for_job(job_id) == "COMPLETED"
    text, _ = job_files(workdir, job_id)
    assert_complete_run(text, nnodes=1, nproc=4, hosts=["node1"])


@pytest.mark.timeout(300)
def test_gpu_sbatch_starts_one_rank_per_allocated_gpu(workdir):
    # The local nodes have 2 count-only GPUs each: Slurm allocates them, torch stays on the CPU.
    job_id = sbatch(SBATCH_GPU, ["--nodes=2", "--gpus-per-node=2", "--cpus-per-task=2"], workdir,
                    A4_SCRIPT=str(REFERENCE), A4_BACKEND="gloo")
    assert wait_for_job(job_id) == "COMPLETED"
    text, _ = job_files(workdir, job_id)
    assert_complete_run(text, nnodes=2, nproc=2, hosts=["node1", "node2"])


@pytest.mark.timeout(300)
def test_submitit_launcher_on_the_cluster_leaves_the_sbatch_jobs_log(workdir):
    proc = subprocess.run(submit_cli("--profile", str(LOCAL_PROFILE), "--script", str(REFERENCE), cwd=workdir),
                          cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr
    job_id = re.search(r"job (\d+) completed", proc.stdout)[1]
    assert f"[submit] job {job_id}: RUNNING" in proc.stderr      # the progress line
    assert job_state(job_id) == "COMPLETED"
    text, err = job_files(workdir, job_id)
    log = assert_complete_run(text, nnodes=4, nproc=1, hosts=NODES)
    assert log.job["id"] == job_id
    assert "rendezvous at node1:" in err
    # What submitit submitted is what --dry-run prints.
    dry = subprocess.run(submit_cli("--profile", str(LOCAL_PROFILE), "--script", str(REFERENCE), "--dry-run",
                                    cwd=workdir), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    submitted = (workdir / "jobs" / job_id / f"{job_id}_submission.sh").read_text()
    script, node = dry.stdout.split("\n# on each of the 4 nodes", 1)      # then the command each node ran
    assert submitted.strip() == script.strip()
    assert "--nnodes=4 --nproc_per_node=1 --max_restarts=0 --rdzv_id=<job id> --rdzv_backend=c10d" in node


@pytest.mark.timeout(300)
def test_a_crashing_rank_fails_the_job_and_says_so(workdir):
    crash = str(JOBS / "crash_one_rank.py")
    job_id = sbatch(SBATCH_CPU, [], workdir, A4_SCRIPT=crash)
    proc = subprocess.run(submit_cli("--profile", str(LOCAL_PROFILE), "--script", crash, cwd=workdir),
                          cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    # sbatch: Slurm's state, a footer with torchrun's status, the rank's exit code in the .err.
    assert wait_for_job(job_id) == "FAILED"
    text, err = job_files(workdir, job_id)
    assert footer_status(parse_log(text)) not in (None, 0), text
    assert "crashing on purpose" in text
    assert re.search(r"exitcode\s*: 3", err), err
    # The launcher: exit status 1 and a message that says a rank crashed, and on which node.
    assert proc.returncode == 1, proc.stderr
    m = re.search(r"submit: job (\d+) failed: a rank crashed; torchrun on node \d \((node\d)\) exited with "
                  r"status 1 \(Slurm state FAILED\)", proc.stderr)
    assert m, proc.stderr
    sub_text, sub_err = job_files(workdir, m[1])
    sub_log = parse_log(sub_text)
    assert m[2] == sub_log.hosts[3], sub_text          # the node that ran the crashing rank 3
    assert footer_status(sub_log) == 1, sub_text
    assert re.search(r"exitcode\s*: 3", sub_err), sub_err


@pytest.mark.timeout(400)
def test_a_job_past_its_time_limit_ends_timed_out_and_says_so(workdir):
    # Slurm counts time limits in whole minutes and checks them every half minute or so: each
    # job here takes 1 to 2 minutes, so the two run side by side, on one CPU of one node each.
    hang = str(JOBS / "sleep_past_time_limit.py")
    profile = workdir / "one-minute.yaml"
    profile.write_text("partition: debug\naccount: a4course\ngpus_per_node: 0\ncpus_per_task: 1\ntime: 1\n")
    job_id = sbatch(SBATCH_CPU, ["--nodes=1", "--cpus-per-task=1", "--time=1"], workdir, A4_SCRIPT=hang)
    proc = subprocess.run(submit_cli("--profile", str(profile), "--nodes", "1", "--script", hang, cwd=workdir),
                          cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert wait_for_job(job_id) == "TIMEOUT"
    text, err = job_files(workdir, job_id)
    assert "sleeping past the time limit" in text
    assert footer_status(parse_log(text)) is None, text     # killed: no footer
    assert "DUE TO TIME LIMIT" in err
    assert proc.returncode == 1, proc.stderr
    m = re.search(r"submit: job (\d+) timed out: it reached its time limit \(TIMEOUT\)", proc.stderr)
    assert m, proc.stderr
    sub_text, sub_err = job_files(workdir, m[1])
    assert footer_status(parse_log(sub_text)) is None, sub_text
    assert "DUE TO TIME LIMIT" in sub_err


@pytest.mark.timeout(300)
def test_a_cancelled_job_ends_cancelled_and_says_so(workdir):
    hang = str(JOBS / "sleep_past_time_limit.py")
    proc = subprocess.Popen(submit_cli("--profile", str(LOCAL_PROFILE), "--nodes", "1", "--script", hang,
                                       cwd=workdir), cwd=ROOT, env=job_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        # Wait until the run has started on its node, then cancel it as a person would.
        deadline = time.monotonic() + HANG_GUARD_S
        started = []
        while not started and time.monotonic() < deadline:
            started = list((workdir / "jobs").glob("*/node0.out"))
            time.sleep(0.5)
        assert started, "the job never started"
        job_id = started[0].parent.name
        subprocess.run(["scancel", job_id], check=True, timeout=30)
        out, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert re.search(rf"submit: job {job_id} was cancelled \(CANCELLED by \d+\)", err), err
    assert job_state(job_id).startswith("CANCELLED")


@pytest.mark.timeout(600)
def test_the_grader_grades_a_batch_through_a_job_array(workdir, reference_run):
    """python -m grader grade --executor slurm: chunks of hand-ins as the tasks of one array, each
    graded on its node (with the sandbox) into the shared output folder."""
    from tests.corpus import Files, fast_rubric, mutate, refingerprint, skeleton, write_zip
    log, err = reference_run
    inbox = workdir / "inbox"
    inbox.mkdir()
    for name, code in {"reference": REFERENCE.read_text(), "skeleton": skeleton(),
                       "dp_summed": mutate("dp_summed")}.items():
        write_zip(inbox / f"{name}.zip", Files(code=code, log=refingerprint(log, code), err=err))
    out = workdir / "grades"
    proc = subprocess.run([sys.executable, "-m", "grader", "grade", str(inbox), "--out", str(out),
                           "--rubric", str(fast_rubric(workdir)), "--executor", "slurm", "--slurm-cluster", "slurm",
                           "--partition", "debug", "--chunk", "2", "--quiet"],
                          cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "graded 3 hand-in(s)" in proc.stdout
    rows = {r.split(",")[0]: r.split(",") for r in (out / "grades.csv").read_text().splitlines()[1:]}
    assert rows["reference"][1:4] == [FULL_CSV, FULL_CSV, "graded"]
    assert rows["skeleton"][1] == "0"
    dp = __import__("json").loads((out / "students" / "dp_summed" / "grading.json").read_text())["parts"]["data_parallel"]
    assert dp["status"] == "failed" and "summed over the 4 ranks" in dp["message"]
    tasks = sorted(p.name for p in out.glob(".slurm/*/*_0_log.out")) + sorted(p.name for p in out.glob(".slurm/*/*_1_log.out"))
    assert len(tasks) == 2, tasks       # two array tasks, one per chunk of two hand-ins


FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def test_an_array_task_whose_node_clock_is_minutes_behind_still_counts(workdir, reference_run, monkeypatch):
    """The collection never compares two machines' clocks: a task on a node whose clock is 10 minutes
    behind the submitting machine's writes results that look older than the submission, and they
    still stand (not infra_error). libfaketime gives the tasks that clock: sbatch passes the
    submitting process's environment to them, and this process, started before, keeps the real one."""
    import json
    from datetime import datetime, timezone

    from grader.batch.run import grade_batch
    from tests.corpus import Files, fast_rubric, refingerprint, skeleton, write_zip
    lib = next((p for p in (FAKETIME, *Path("/usr/lib").glob("*/faketime/libfaketime.so.1")) if p.exists()), None)
    if lib is None:
        pytest.skip("libfaketime is not installed (tests/slurm_cluster/start-local-cluster.sh installs faketime)")
    log, err = reference_run
    inbox = workdir / "inbox"
    inbox.mkdir()
    for name, code in {"reference": REFERENCE.read_text(), "skeleton": skeleton()}.items():
        write_zip(inbox / f"{name}.zip", Files(code=code, log=refingerprint(log, code), err=err))
    out = workdir / "grades"
    submitted = datetime.now(timezone.utc).isoformat(timespec="seconds")
    monkeypatch.setenv("LD_PRELOAD", str(lib))
    monkeypatch.setenv("FAKETIME", "-10m")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    summary = grade_batch([inbox], out, rubric_path=fast_rubric(workdir), executor="slurm", progress=False,
                          slurm={"cluster": "slurm", "partition": "debug", "chunk": 1})
    assert summary.ran == {"graded": 2}, summary.ran
    rows = {r.split(",")[0]: r.split(",") for r in (out / "grades.csv").read_text().splitlines()[1:]}
    assert rows["reference"][1:4] == [FULL_CSV, FULL_CSV, "graded"], rows
    assert rows["skeleton"][1] == "0", rows
    graded_at = json.loads((out / "students" / "reference" / "grading.json").read_text())["graded_at"]
    assert graded_at < submitted, f"the task's clock was not behind ({graded_at} >= {submitted}): the test proves nothing"
