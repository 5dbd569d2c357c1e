"""The Slurm kit without a cluster: cluster profiles, the launcher's --dry-run against its golden
file, the launcher's --local run, and the job scripts' shape. (tests/test_slurm.py runs it all on
a real cluster.)

A change to the dry-run output that is meant: A4_UPDATE_GOLDEN=1 pytest tests/test_submit.py -k golden
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from grader.evidence.logfile import parse_log
from tests.worlds import REFERENCE, ROOT
from slurm.profile import ProfileError, load_profile, profile_from_dict, profile_keys

pytestmark = pytest.mark.student   # make test-student runs these; make test leaves them out

# The keys of slurm/common.sh's [Job] header, in order: every run (sbatch, submitit, run-local.sh).
HEADER_KEYS = ["id", "name", "started", "nodes", "nnodes", "nproc_per_node", "world_size", "backend",
               "torch", "nccl", "python"]


def footer_status(log):
    """The status in the log's "[Job] finished" line, or None for a run killed before its end."""
    return int(log.job["status"]) if "status" in log.job else None

GOLDEN = ROOT / "tests" / "golden"
CLUSTERS = ROOT / "slurm" / "clusters"
TEST_PROFILE = ROOT / "tests" / "slurm_cluster" / "profile.yaml"   # the local test cluster


def submit(*args, cwd=ROOT, timeout=60, **env):
    return subprocess.run([sys.executable, "-m", "slurm.submit", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, **env))


# --- profiles -------------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(CLUSTERS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_profile_is_valid(path):
    profile = load_profile(path)
    assert profile.description


def test_profiles_can_be_named_by_their_file_stem():
    assert load_profile("example") == load_profile(CLUSTERS / "example.yaml")
    assert load_profile(TEST_PROFILE).description


def test_an_empty_profile_has_the_sbatch_scripts_defaults():
    p = profile_from_dict({})
    assert (p.gpus_per_node, p.cpus_per_task, p.time_minutes, p.ranks_per_node, p.backend) == (4, 8, 15, 4, "nccl")
    sbatch = (ROOT / "slurm" / "assignment4.sbatch").read_text()
    assert "#SBATCH --gpus-per-node=4\n" in sbatch and "#SBATCH --cpus-per-task=8\n" in sbatch
    assert "#SBATCH --time=00:15:00\n" in sbatch


def test_a_cpu_profile_runs_gloo_with_one_rank_per_node():
    p = profile_from_dict({"gpus_per_node": 0})
    assert (p.ranks_per_node, p.backend) == (1, "gloo")


def test_an_unknown_key_is_named_with_a_suggestion_and_the_valid_keys(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("partition: gpu\ngpus: 4\n")
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    message = str(e.value)
    assert str(path) in message and "unknown key 'gpus'" in message
    assert "did you mean 'gpus_per_node'?" in message
    assert "valid keys: " + ", ".join(profile_keys()) in message


@pytest.mark.parametrize("key, value, expected", [
    ("gpus_per_node", "four", "gpus_per_node: expected a whole number, got 'four'"),
    ("gpus_per_node", -1, "gpus_per_node: must be a whole number >= 0, not -1"),
    ("cpus_per_task", 0, "cpus_per_task: must be a whole number >= 1, not 0"),
    ("nproc_per_node", True, "nproc_per_node: expected a whole number, got True"),
    ("time", "soon", "time: must be a number of minutes or [D-]HH:MM:SS, not 'soon'"),
    ("time", 0, "time: must be a positive number of minutes, not 0"),
    ("time", 1.5, "time: expected a whole number or text, got 1.5"),
    ("setup", "module load cuda", "setup: expected a list, got str"),
    ("setup", ["module load cuda", 12], "setup[1]: expected text, got 12"),
    ("partition", "", "partition: must be a non-empty text, or nothing, not ''"),
    ("sbatch_options", {"--qos": "x"}, "sbatch_options: must be a mapping of sbatch option names (without '--')"),
    ("sbatch_options", {"exclusive": True}, "sbatch_options.exclusive: expected a whole number or text, got True"),
])
def test_a_bad_value_is_named_with_the_file_the_key_what_it_wants_and_what_it_is_for(key, value, expected):
    with pytest.raises(ProfileError) as e:
        profile_from_dict({key: value}, source="clusters/x.yaml")
    message = str(e.value)
    assert message.startswith(f"clusters/x.yaml.{expected}"), message
    assert message.endswith(f" ({key}: {profile_keys()[key][1]})"), message


def test_profiles_are_validated_by_the_kits_one_typed_mechanism():
    """grader/typed.py builds the profile (as it builds the rubric and the policy): no validator of its own."""
    import ast
    import slurm.profile
    tree = ast.parse(Path(slurm.profile.__file__).read_text())
    assert any(isinstance(n, ast.Attribute) and n.attr == "build" and getattr(n.value, "id", "") == "typed"
               for n in ast.walk(tree))
    p = profile_from_dict({"setup": ["module load cuda"], "sbatch_options": {"qos": "normal", "nice": 5},
                           "partition": " gpu ", "time": "1:00:00"})
    assert (p.setup, p.sbatch_options, p.partition, p.time_minutes) == (("module load cuda",),
                                                                          {"qos": "normal", "nice": 5}, "gpu", 60)


@pytest.mark.parametrize("time, minutes", [(30, 30), ("45", 45), ("00:15:00", 15), ("1:30:00", 90),
                                           ("10:30", 11), ("1-00:00", 1440), ("2-1", 2940)])
def test_time_limits_are_read_as_slurm_reads_them(time, minutes):
    assert profile_from_dict({"time": time}).time_minutes == minutes


def test_a_missing_or_broken_profile_file_says_what_to_do(tmp_path):
    with pytest.raises(ProfileError, match=r"no such profile; give a YAML file, or one of the profiles "
                                           r"in slurm/clusters/ by name \(example\)"):
        load_profile(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("partition: [gpu\n")
    with pytest.raises(ProfileError, match=rf"{re.escape(str(broken))}: not valid YAML"):
        load_profile(broken)
    listed = tmp_path / "list.yaml"
    listed.write_text("- partition: gpu\n")
    with pytest.raises(ProfileError, match="expected a mapping of keys to values at the top level, got list"):
        load_profile(listed)


def test_the_cli_reports_a_bad_profile_with_status_2_and_no_traceback(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("partitoin: gpu\n")
    proc = submit("--profile", str(path), "--dry-run")
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"submit: {path}: unknown key 'partitoin' (did you mean 'partition'?)")
    assert "Traceback" not in proc.stderr


def test_help_profile_lists_every_key():
    proc = submit("--help-profile")
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[0] for line in proc.stdout.splitlines()] == list(profile_keys())


# --- --dry-run --------------------------------------------------------------------------------

def normalise(script, tmp_path):
    return (script.replace(str(tmp_path), "<TMP>").replace(shlex.quote(sys.executable), "<PYTHON>")
            .replace(sys.executable, "<PYTHON>").replace(str(ROOT), "<KIT>"))


def test_dry_run_prints_the_sbatch_script_of_the_golden_file(tmp_path):
    proc = submit("--profile", str(GOLDEN / "cluster.yaml"), "--folder", str(tmp_path / "jobs" / "%j"), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    got = normalise(proc.stdout, tmp_path)
    golden = GOLDEN / "dry-run.sbatch"
    if os.environ.get("A4_UPDATE_GOLDEN"):
        golden.write_text(got)
    assert got == golden.read_text()
    assert not (tmp_path / "jobs").exists()       # nothing was submitted or written


def test_dry_run_takes_nodes_and_gpus_from_the_command_line(tmp_path):
    proc = submit("--profile", str(TEST_PROFILE), "--nodes", "2", "--gpus-per-node", "2", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=2\n" in proc.stdout and "#SBATCH --gpus-per-node=2\n" in proc.stdout
    assert "#SBATCH --partition=debug\n" in proc.stdout and "#SBATCH --account=a4course\n" in proc.stdout


def test_dry_run_runs_python_through_the_profiles_command(tmp_path):
    profile = tmp_path / "container.yaml"
    profile.write_text("python: apptainer exec --nv a4.sif python\n")
    proc = submit("--profile", str(profile), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "apptainer exec --nv a4.sif python -u -m submitit.core._submit" in proc.stdout


def test_bad_command_lines_say_what_is_wrong():
    assert "no such script: nope.py" in submit("--script", "nope.py", "--dry-run").stderr
    assert "--nodes must be 1 or more, not 0" in submit("--nodes", "0", "--dry-run").stderr


def test_dry_run_shows_the_torchrun_command_each_node_runs():
    proc = submit("--profile", str(TEST_PROFILE), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    command = proc.stdout.strip().splitlines()[-1]
    assert proc.stdout.strip().splitlines()[-2].startswith("# on each of the 4 nodes")
    assert command.startswith(f"{sys.executable} -m torch.distributed.run --nnodes=4 --nproc_per_node=1 ")
    assert "--rdzv_backend=c10d --rdzv_endpoint=<first node of the job>:" in command
    assert command.endswith(str(ROOT / "assignment_4" / "assignment4.py"))


def test_local_defaults_to_the_handouts_4_ranks_and_leaves_no_folder_behind(tmp_path):
    proc = submit("--local", "--dry-run", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH" not in proc.stdout and "--nnodes=1 --nproc_per_node=4 " in proc.stdout
    from slurm.launch import plan
    p = plan(local=True)
    assert (p.world_size, p.profile.backend, p.temporary) == (4, "gloo", True)
    assert p.folder.parent == Path(tempfile.gettempdir()) and "%j" not in str(p.folder)
    shutil.rmtree(p.folder)


# --- --local ----------------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_local_run_leaves_the_same_log_as_a_slurm_job(tmp_path):
    proc = submit("--local", "--profile", str(TEST_PROFILE), "--script", str(REFERENCE), "--out", str(tmp_path / "logs"),
                  cwd=tmp_path, timeout=240, A4_TIMEOUT_S="60", PYTHONPATH=str(ROOT))
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["logs"]     # no submitit folder left behind
    tmp_path = tmp_path / "logs"
    run_id = re.search(r"job (local-\d+) completed", proc.stdout)[1]
    text = (tmp_path / f"assignment4-{run_id}.log").read_text()
    assert (tmp_path / f"assignment4-{run_id}.err").is_file()
    log = parse_log(text, min_world_size=4)
    # One machine, as many ranks as the 4-node cluster run has.
    assert [k for k in log.job if k not in ("status", "at")] == HEADER_KEYS   # common.sh's header
    assert (log.job["id"], log.job["nnodes"], log.job["nproc_per_node"]) == (run_id, "1", "4")
    assert log.job["backend"] == "gloo" and log.backends == ["gloo"]
    assert all(e.passed for e in log.parts.values()) and sorted(log.done_ranks) == [0, 1, 2, 3]
    assert log.world_size == 4 and footer_status(log) == 0


# --- the job scripts ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["slurm/assignment4.sbatch", "slurm/assignment4-cpu.sbatch", "slurm/run-local.sh",
                                  "tests/slurm_cluster/start-local-cluster.sh", "tests/slurm_cluster/stop-local-cluster.sh",
                                  "tests/slurm_cluster/test-slurm.sh", "grader/gradescope/setup.sh",
                                  "grader/gradescope/run_autograder"])
def test_shell_scripts_parse_and_are_strict(name):
    path = ROOT / name
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    assert "set -euo pipefail" in path.read_text()
    assert os.access(path, os.X_OK)


@pytest.mark.parametrize("name", ["assignment4.sbatch", "assignment4-cpu.sbatch"])
def test_sbatch_scripts_keep_the_handouts_log_names_and_one_task_per_node(name):
    text = (ROOT / "slurm" / name).read_text()
    sbatch_lines = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    for line in ("#SBATCH --output=%x-%j.log", "#SBATCH --error=%x-%j.err", "#SBATCH --nodes=4",
                 "#SBATCH --ntasks-per-node=1", "#SBATCH --job-name=assignment4"):
        assert line in sbatch_lines
    # sbatch stops reading #SBATCH lines at the first command: they must all come first.
    first_command = next(i for i, line in enumerate(text.splitlines()[1:], 1)
                         if line.strip() and not line.startswith("#"))
    assert all(text.splitlines().index(line) < first_command for line in sbatch_lines)
    assert not any("$" in line for line in sbatch_lines)   # #SBATCH lines do not expand variables


def test_the_gpu_job_meets_at_the_first_node_and_never_at_localhost():
    text = (ROOT / "slurm" / "assignment4.sbatch").read_text()
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1' in text
    assert "--rdzv_backend=c10d" in text and '--rdzv_endpoint="$head_node:$port"' in text
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "localhost" not in code and "127.0.0.1" not in code
