"""The lecture's lab (lab/) as a Slurm job on a real cluster: slurm/lab-cpu.sbatch and the submitit
launcher, each running lab/run_all.py to the end on every rank.

    make test-slurm        # starts the local 4-node cluster, runs every test marked slurm, stops it

Without a cluster that answers, these skip and say why, as tests/test_slurm.py's do: they use its
fixtures (`cluster`, `workdir`) and helpers. The jobs' .log and .err stay in build/test-slurm/<test>/.
"""

import re
import subprocess

import pytest

from lab.common import parse_results
from tests.test_slurm import (HANG_GUARD_S, LOCAL_PROFILE, NODES, cluster, job_env, job_files,  # noqa: F401
                              sbatch, submit_cli, wait_for_job, workdir)
from tests.worlds import ROOT

pytestmark = pytest.mark.slurm

SBATCH_LAB_CPU = ROOT / "slurm" / "lab-cpu.sbatch"
RUN_ALL = ROOT / "lab" / "run_all.py"
PARTS = ["collectives", "data_parallel", "tensor_parallel", "pipeline_parallel", "vocab_parallel", "transformer", "all"]


def job_header(text):
    """{key: value} of the log's "[Job] key=value ..." lines (common.sh's header and footer)."""
    return dict(re.findall(r"(\w+)=(\S+)", "\n".join(line for line in text.splitlines() if line.startswith("[Job] "))))


def assert_whole_lab(text, nnodes, nproc, hosts):
    """Header, every rank on the expected hosts, every part matched on every rank, the benchmark's
    table, and the footer of a run that ended well."""
    world = nnodes * nproc
    job = job_header(text)
    assert (job["name"], job["nnodes"], job["nproc_per_node"], job["world_size"], job["backend"]) == (
        "lab", str(nnodes), str(nproc), str(world), "gloo"), text
    inits = dict(re.findall(r"^\[Distributed Init\] Rank (\d+) initialized on node \S+ \((\S+)\)", text, re.M))
    assert sorted(map(int, inits)) == list(range(world)), text
    assert sorted(set(inits.values())) == sorted(hosts), text          # every node ran ranks
    assert parse_results(text) == {(p, r): True for p in PARTS for r in range(world)}, text
    assert re.search(r"^\[lab:bandwidth\] all_reduce\s+1024\s", text, re.M), text
    assert job["status"] == "0", text


@pytest.mark.timeout(300)
def test_lab_cpu_job_runs_the_whole_lab_on_4_ranks_of_one_node(workdir):  # noqa: F811 - the fixture, imported
    job_id = sbatch(SBATCH_LAB_CPU, [], workdir, A4_LAB_OUT=str(workdir / "out"))
    assert wait_for_job(job_id) == "COMPLETED"
    text, err = job_files(workdir, job_id, name="lab")
    assert_whole_lab(text, nnodes=1, nproc=4, hosts=["node1"])
    assert job_header(text)["id"] == job_id
    assert "script lab/run_all.py" in err
    assert (workdir / "out" / "bandwidth-gloo-4ranks.csv").is_file()


@pytest.mark.timeout(300)
def test_the_launcher_runs_the_lab_on_4_nodes(workdir):  # noqa: F811 - the fixture, imported
    proc = subprocess.run(submit_cli("--profile", str(LOCAL_PROFILE), "--script", str(RUN_ALL), "--name", "lab",
                                     cwd=workdir),
                          cwd=ROOT, env=job_env(A4_LAB_OUT=str(workdir / "out")), capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr
    job_id = re.search(r"job (\d+) completed", proc.stdout)[1]
    text, err = job_files(workdir, job_id, name="lab")
    assert_whole_lab(text, nnodes=4, nproc=1, hosts=NODES)
    assert "rendezvous at node1:" in err
    assert (workdir / "out" / "bandwidth-gloo-4ranks.csv").is_file()
