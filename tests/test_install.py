"""The kit installed as a Python package: `pip install .` and `pip install -e .` of a copy of the kit,
and of the student release, into fresh venvs; the command line run from another folder; and a
hand-in graded by the installed kit, whose rubric and reference then sit in the site-packages the
sandbox binds for torch, cannot read them.

The venvs reuse this venv's packages through a .pth file (no torch download) and build with its
setuptools (--no-build-isolation: no index needed).
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from grader.parts import CORE_PART_IDS
from tests.corpus import ROOT, fast_rubric, write_zip
from tests.hostile import ATTACKS, build

KIT_PARTS = ("grader", "slurm", "lab", "assignment_4", "student", "pyproject.toml", "requirements.txt", "README.md")


def kit_copy(folder: Path) -> Path:
    """The kit's files as a fresh clone has them (no venv, no caches)."""
    for part in KIT_PARTS:
        if (ROOT / part).is_dir():
            shutil.copytree(ROOT / part, folder / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / part, folder / part)
    return folder


def fresh_venv(folder: Path) -> Path:
    """A new venv that sees this venv's packages (torch, PyYAML, pip, setuptools) through a .pth."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, capture_output=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (folder / "lib" / version / "site-packages" / "kit-deps.pth").write_text(os.path.realpath(sysconfig.get_paths()["purelib"]) + "\n")
    return folder / "bin" / "python"


def pip_install(python: Path, *args) -> None:
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-build-isolation", *args],
                          capture_output=True, text=True, timeout=300, env=clean_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def clean_env() -> dict:
    """No PYTHONPATH: what imports must come from the venv."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "A4_"))}


def run(args, cwd, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=clean_env())


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(its python, the folder it lives in, a folder elsewhere) of a venv with `pip install .`."""
    tmp = tmp_path_factory.mktemp("install")
    kit = kit_copy(tmp / "kit")
    python = fresh_venv(tmp / "venv")
    pip_install(python, str(kit))
    shutil.rmtree(kit)    # installed, not linked: the copy it came from is gone
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return python, tmp / "venv", elsewhere


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


@pytest.mark.timeout(300)
def test_pip_install_gives_the_command_line_and_the_console_script_from_any_folder(installed):
    python, venv, elsewhere = installed
    for args in ([python, "-m", "grader", "--help"], [venv / "bin" / "a4", "--help"]):
        done = run(args, elsewhere)
        assert done.returncode == 0 and "grade" in done.stdout and "gradebook" in done.stdout, done.stderr
    ours = run([sys.executable, "-m", "grader", "public-rubric"], ROOT)
    theirs = run([python, "-m", "grader", "public-rubric"], elsewhere)
    assert theirs.returncode == 0, theirs.stderr
    assert theirs.stdout == ours.stdout and "checks:" in theirs.stdout


def test_pip_install_ships_the_assignment_and_its_data_and_finds_the_kit_from_the_package(installed):
    python, venv, elsewhere = installed
    lib = site_packages(venv)
    for rel in ("grader/rubric.yaml", "grader/gradescope/setup.sh", "grader/grades/example/roster.csv",
                "grader/pipeline/templates/feedback.html", "grader/analytics/templates/report.html",
                "assignment_4/assignment4.py", "assignment_4/utils.py", "assignment_4/reference/assignment4.py",
                "slurm/assignment4.sbatch", "slurm/run-local.sh", "slurm/clusters/example.yaml", "lab/mlp.py"):
        assert (lib / rel).read_bytes() == (ROOT / rel).read_bytes(), rel
    assert os.access(lib / "slurm" / "run-local.sh", os.X_OK)
    done = run([python, "-c", "from grader import kit; print(kit.ROOT, kit.UTILS.is_file(), kit.RUBRIC.is_file())"],
               elsewhere)
    assert done.stdout.split() == [str(lib.resolve()), "True", "True"], done.stderr


@pytest.mark.timeout(300)
def test_pip_install_editable_runs_the_clone_it_was_installed_from(tmp_path):
    kit = kit_copy(tmp_path / "kit")
    python = fresh_venv(tmp_path / "venv")
    pip_install(python, "-e", str(kit))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run([python, "-c", "from grader import kit; print(kit.ROOT)"], elsewhere)
    assert done.stdout.strip() == str(kit.resolve()), done.stderr
    done = run([tmp_path / "venv" / "bin" / "a4", "--help"], elsewhere)
    assert done.returncode == 0 and "grade" in done.stdout, done.stderr


@pytest.mark.timeout(300)
def test_the_student_release_installs_the_same_way(tmp_path):
    from grader.instructor.release import build_release
    release = tmp_path / "release"
    build_release(release)
    python = fresh_venv(tmp_path / "venv")
    pip_install(python, str(release))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run([tmp_path / "venv" / "bin" / "a4", "--help"], elsewhere)
    assert done.returncode == 0, done.stderr
    assert "check" in done.stdout and "package" in done.stdout and "gradebook" not in done.stdout
    lib = site_packages(tmp_path / "venv")
    assert (lib / "grader" / "rubric-public.yaml").is_file() and (lib / "assignment_4" / "utils.py").is_file()
    assert not (lib / "assignment_4" / "reference").exists() and not (lib / "grader" / "rubric.yaml").exists()


@pytest.mark.timeout(600)
def test_a_hand_in_graded_by_the_installed_kit_cannot_read_its_rubric_or_reference(installed, reference_run,
                                                                                    tmp_path):
    """Installed, the kit lives in the site-packages the sandbox binds read-only for torch: the
    sandbox hides its folders, and the read_secrets attack, pointed at them, finds nothing."""
    python, venv, elsewhere = installed
    lib = site_packages(venv).resolve()
    out = tmp_path / "out"
    values = {"reference": str(lib / "assignment_4" / "reference" / "assignment4.py"),
              "rubric": str(lib / "grader" / "rubric.yaml"), "out": str(out), "port": 9}
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    write_zip(inbox / "read_secrets.zip", build("read_secrets", values, *reference_run))
    rubric = fast_rubric(tmp_path, checks=[{"name": "default"}])
    done = run([python, "-m", "grader", "grade", inbox, "--out", out, "--rubric", rubric, "--quiet"], elsewhere,
               timeout=500)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((out / "students" / "read_secrets" / "grading.json").read_text())
    assert "LEAK" not in json.dumps(result)
    assert result["isolation"]["sandbox"].startswith("bubblewrap"), result["isolation"]
    baseline = result["parts"]["baseline"]
    attack = ATTACKS["read_secrets"]
    assert baseline["status"] in attack.status and attack.words in baseline["message"], baseline["message"]
    assert {p: result["parts"][p]["status"] for p in CORE_PART_IDS if p != "baseline"} == \
        {p: "passed" for p in CORE_PART_IDS if p != "baseline"}
