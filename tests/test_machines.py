"""Where the course runs, not only where the kit was built: with whichever torch runs these tests
(its CPU build or its CUDA build, which maps 3 GB at `import torch`), as an ordinary user on a
machine without user namespaces beside 200 idle threads of that user, under a tight `ulimit -u`,
with 32 threads asked of every pool, with a cluster's module Python (its libpython found through
LD_LIBRARY_PATH alone, torch through PYTHONPATH alone), and as root with --sandbox off on a Python
below a folder only root may pass (as /root is). Each configuration is made once per module and
grades one small batch through the real command line; correct code scores full marks in every one,
a rank whose two children each fill more than half the world's memory is stopped and named, and
where no world can run the messages give the cause with its numbers."""

import json
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from tests import tas
from tests.conftest import skip_unless_required
from tests.corpus import FULL, MUTANTS, REFERENCE, ROOT, Files, mutate, refingerprint, zip_bytes
from tests.hostile import LAZY_IMPORTS, inject

pytestmark = pytest.mark.configs   # make test-configs runs these, make test leaves them out

MEMORY_MB = 1024
# One public check of 4 ranks; timeouts a loaded machine cannot run out of (this is about what each
# machine allows, not about time); a world's memory small enough that two children can pass it.
RUBRIC = {"checks": [{"name": "default"}], "public_world_sizes": [4], "limits": {"memory_mb": MEMORY_MB},
          "timeouts": {"part": 60, "process_group": 20, "world_start": 60, "handin": 600}}
# Each child of rank 0 fills 60 % of the world's memory and waits. The kernel fills each mapping at
# once (MAP_POPULATE): the world passes its limit a fraction of a second into the part, well inside
# the part's clock on a slow machine too, rather than racing it page fault by page fault.
TWO_CHILDREN = f"""\
import mmap, os, time
if dist.get_rank() == 0:
    for _ in range(2):
        if os.fork() == 0:
            hog = mmap.mmap(-1, {int(MEMORY_MB * 0.6)} << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
            time.sleep(60)
            os._exit(0)
    time.sleep(60)
"""
# A student tuning for a GPU node: 32 threads, and a product big enough for them to start.
THIRTY_TWO = "torch.set_num_threads(32)\n_ = torch.randn(512, 512) @ torch.randn(512, 512)\n"
THREADS_ENV = {name: "32" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
# Code written for a GPU node, run where torch says a GPU is there: every "cuda" it asks for lands on the CPU.
CUDA_AVAILABLE = """\
torch.cuda.is_available = lambda: True
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() else device
torch.cuda.set_device(device)
_ = (torch.ones(2, device=device).cuda() + torch.zeros(2).to(device)).sum().item()
torch.cuda.synchronize()
"""


def _inbox(folder: Path, log: str, err: str, names) -> Path:
    """Hand-in zips named after what they do: reference, two_children, thirty_two, lazy_imports, cuda_available."""
    codes = {"reference": REFERENCE.read_text(), "two_children": inject(REFERENCE.read_text(), TWO_CHILDREN),
             "thirty_two": inject(REFERENCE.read_text(), THIRTY_TWO, everywhere=True),
             "cuda_available": inject(REFERENCE.read_text(), CUDA_AVAILABLE, everywhere=True),
             "lazy_imports": inject(REFERENCE.read_text(), LAZY_IMPORTS.format(planted="a4-none"), everywhere=True)}
    inbox = folder / "inbox"
    inbox.mkdir(parents=True)
    for name in names:
        code = codes[name]
        (inbox / f"{name}.zip").write_bytes(zip_bytes(Files(code=code, log=refingerprint(log, code), err=err)))
    (folder / "rubric.yaml").write_text(yaml.safe_dump(RUBRIC))
    return inbox


def _results(out: Path) -> dict:
    return {p.parent.name: json.loads(p.read_text()) for p in (out / "students").glob("*/grading.json")}


def _grade_args(inbox: Path, out: Path, *extra) -> list:
    return ["-m", "grader", "grade", str(inbox), "--out", str(out), "--rubric", str(inbox.parent / "rubric.yaml"),
            "--quiet", *extra]


def _stopped_and_named(result: dict) -> None:
    """The two children's world is out of memory at the part that forked them, saying why; the
    parts after it, in a world of their own, pass."""
    baseline = result["parts"]["baseline"]
    assert result["status"] == "graded" and baseline["status"] == "oom", (result["message"], baseline["message"])
    assert f"the ranks and their children used more than {MEMORY_MB} MB" in baseline["message"], baseline["message"]
    assert result["parts"]["tensor_parallel"]["status"] == "passed", result["parts"]["tensor_parallel"]["message"]


# ---- an ordinary user without user namespaces, beside 200 threads of that user ------------------

class NoNamespaces:
    """A TA (tests.tas, the system's Python) whose commands run where user namespaces are refused
    (tests.nouserns), each beside 200 idle threads of theirs, with 32 threads asked of every pool."""

    def __init__(self, ta):
        self.ta = ta
        entry = pwd.getpwnam(ta.user)
        self.ids = [str(entry.pw_uid), str(entry.pw_gid)]

    def run(self, args: list, nproc: int = 0, timeout: float = 600) -> subprocess.CompletedProcess:
        env = [f"HOME={self.ta.home}", "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8",
               *(f"{k}={v}" for k, v in THREADS_ENV.items())]
        launcher = [sys.executable, "-m", "tests.nouserns", *self.ids, "--threads", "200",
                    *(["--nproc", str(nproc)] if nproc else []), "--",
                    "env", "-i", f"--chdir={self.ta.kit}", *env, str(self.ta.python), *args]
        return subprocess.run(launcher, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def no_namespaces(reference_run, tmp_path_factory):
    missing = tas.available()
    if missing:
        skip_unless_required("A4_REQUIRE_TA_CONFIGS", f"no TA configuration here: {missing}")
    ta = tas.ta_setup("user")
    try:
        work = ta.home / "work"
        inbox = _inbox(work, *reference_run, ["reference", "two_children", "thirty_two"])
        subprocess.run(["chown", "-R", f"{ta.user}:{ta.user}", str(work)], check=True)
        runner = NoNamespaces(ta)
        graded = runner.run(_grade_args(inbox, work / "out", "--sandbox", "off"))
        yield dict(runner=runner, graded=graded, results=_results(work / "out"), inbox=inbox, work=work)
    finally:
        tas.remove(ta)


@pytest.mark.timeout(900)
def test_without_user_namespaces_beside_200_threads_and_32_per_pool_correct_code_scores_full(no_namespaces):
    graded, results = no_namespaces["graded"], no_namespaces["results"]
    assert graded.returncode == 0, graded.stdout + graded.stderr
    for name in ("reference", "thirty_two"):
        assert (results[name]["status"], results[name]["score"]) == ("graded", FULL), \
            (name, results[name]["message"], {p: v["message"] for p, v in results[name]["parts"].items()})
    isolation = results["reference"]["isolation"]
    assert isolation["mode"] == "off" and isolation["user"].startswith("the grader's own user")
    assert "counting the world's tasks" in isolation["tasks"] and "held by the watchdog" in isolation["memory"]


@pytest.mark.timeout(900)
def test_without_user_namespaces_two_children_past_the_worlds_memory_are_stopped_by_the_watchdog(no_namespaces):
    _stopped_and_named(no_namespaces["results"]["two_children"])


@pytest.mark.timeout(900)
def test_without_user_namespaces_check_passes_and_grade_refuses_saying_how_to_get_the_sandbox(no_namespaces):
    runner, inbox, work = no_namespaces["runner"], no_namespaces["inbox"], no_namespaces["work"]
    checked = runner.run(["-m", "grader", "check", str(inbox / "reference.zip")])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    lines = [line for line in checked.stdout.splitlines() if "without the grader's sandbox" in line]
    assert len(lines) == 1 and "ENOSPC" in lines[0], checked.stdout   # bwrap: a user namespace refused
    assert "own network" in lines[0] and "own files" in lines[0], lines[0]   # the layers it lacks
    refused = runner.run(_grade_args(inbox, work / "refused"))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    for words in ("ENOSPC", "user.max_user_namespaces", "A4_BWRAP=", "--sandbox off"):
        assert words in refused.stderr, refused.stderr


@pytest.mark.timeout(900)
def test_where_the_users_tasks_leave_no_room_for_a_world_doctor_and_check_say_so_with_the_numbers(no_namespaces):
    """A login node's `ulimit -u`: 40 tasks above the 200 threads beside, fewer than a world may need."""
    runner, inbox = no_namespaces["runner"], no_namespaces["inbox"]
    doctor = runner.run(["-m", "grader", "doctor", "--sandbox", "off"], nproc=240)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert "ulimit -u" in doctor.stdout and "240" in doctor.stdout and "limits.processes" in doctor.stdout, doctor.stdout
    checked = runner.run(["-m", "grader", "check", str(inbox / "reference.zip")], nproc=240)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    said = [line for line in checked.stdout.splitlines() if "could not run on this machine" in line]
    assert len(said) == 1 and "ulimit -u" in said[0] and "240" in said[0] and "try again" not in said[0], said


# ---- root, --sandbox off, a Python below a folder only root may pass -----------------------------

def python_below_private_folder(folder: Path) -> Path:
    """A copy of this Python's interpreter and standard library (hard links) in `folder`, made 0700
    (as /root is), and a venv of it that finds this Python's packages through a .pth file."""
    folder.mkdir(mode=0o700)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    base = folder / "python"
    (base / "bin").mkdir(parents=True)
    os.link(os.path.realpath(sys.executable), base / "bin" / version)
    tas.link_tree(Path(sysconfig.get_paths()["stdlib"]), base / "lib" / version,
                  ignore=shutil.ignore_patterns("site-packages", "dist-packages", "__pycache__", "test"))
    subprocess.run([str(base / "bin" / version), "-m", "venv", "--without-pip", str(folder / "venv")], check=True,
                   capture_output=True)
    site = folder / "venv" / "lib" / version / "site-packages"
    (site / "a4-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return folder / "venv" / "bin" / "python"


@pytest.fixture(scope="module")
def root_private_python(reference_run, tmp_path_factory):
    if os.geteuid() != 0:
        skip_unless_required("A4_REQUIRE_TA_CONFIGS", "grading as root needs root")
    folder = Path("/root") / f"a4-private-{os.getpid()}"
    work = tmp_path_factory.mktemp("root-private")
    try:
        python = python_below_private_folder(folder)
        inbox = _inbox(work, *reference_run, ["lazy_imports", "two_children", "thirty_two"])
        proc = subprocess.run([str(python), *_grade_args(inbox, work / "out", "--sandbox", "off")], cwd=ROOT,
                              capture_output=True, text=True, timeout=600, env=dict(os.environ, **THREADS_ENV))
        yield dict(proc=proc, results=_results(work / "out"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(900)
def test_as_root_without_the_sandbox_a_python_only_root_may_reach_still_imports_everything(root_private_python):
    """A correct hand-in that imports modules the helper never loaded (`decimal`, `csv` ...) inside
    every part: full marks (each world opens the folder to its ranks), never a 0."""
    proc, results = root_private_python["proc"], root_private_python["results"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = results["lazy_imports"]
    assert (r["status"], r["score"]) == ("graded", FULL), (r["message"], {p: v["message"] for p, v in r["parts"].items()})
    assert r["isolation"]["user"] == "an unprivileged user id of its own per world"


@pytest.mark.timeout(900)
def test_as_root_without_the_sandbox_32_threads_per_pool_score_full_and_two_children_are_stopped(root_private_python):
    results = root_private_python["results"]
    r = results["thirty_two"]
    assert (r["status"], r["score"]) == ("graded", FULL), (r["message"], {p: v["message"] for p, v in r["parts"].items()})
    _stopped_and_named(results["two_children"])


# ---- a cluster's module Python: libpython through LD_LIBRARY_PATH, torch through PYTHONPATH -------

def module_python(folder: Path) -> tuple:
    """(a copy of this interpreter that finds its shared libpython only through LD_LIBRARY_PATH, the
    environment a module system would set for it), or a reason it cannot be made here."""
    library = sysconfig.get_config_var("LIBDIR")
    if not sysconfig.get_config_var("Py_ENABLE_SHARED") or not library:
        return None, "this Python is not built with a shared libpython"
    binary = Path(os.path.realpath(sys.executable)).read_bytes()
    if binary.count(library.encode()) != 1:
        return None, f"this Python's binary does not name {library} once (its RUNPATH)"
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (folder / "bin").mkdir(parents=True)
    (folder / "lib").mkdir()
    python = folder / "bin" / version
    # Its RUNPATH now names a folder that is not there: as a module's Python built without one.
    python.write_bytes(binary.replace(library.encode(), b"/nonexistent".ljust(len(library), b"x")))
    python.chmod(0o755)
    (folder / "lib" / version).symlink_to(sysconfig.get_paths()["stdlib"])
    env = {"LD_LIBRARY_PATH": library, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    return (python, env), ""


@pytest.fixture(scope="module")
def module_grade(reference_run, tmp_path_factory):
    work = tmp_path_factory.mktemp("module-python")
    made, why = module_python(work / "module")
    if made is None:
        skip_unless_required("A4_REQUIRE_TA_CONFIGS", why)
    python, module_env = made
    bare = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"})
    assert bare.returncode != 0, "the copy starts without LD_LIBRARY_PATH: it tests nothing"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    env.update(module_env, **THREADS_ENV)
    inbox = _inbox(work, *reference_run, ["reference", "lazy_imports", "thirty_two", "cuda_available"])
    proc = subprocess.run([str(python), *_grade_args(inbox, work / "out")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)
    return dict(proc=proc, results=_results(work / "out"))


@pytest.mark.timeout(900)
def test_a_module_python_grades_in_the_sandbox_as_it_runs_outside(module_grade):
    """With 32 threads asked of every pool, and code that finds torch saying a GPU is there."""
    proc, results = module_grade["proc"], module_grade["results"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("reference", "lazy_imports", "thirty_two", "cuda_available"):
        r = results[name]
        assert (r["status"], r["score"]) == ("graded", FULL), \
            (name, r["message"], {p: v["message"] for p, v in r["parts"].items()})
        assert r["isolation"]["sandbox"].startswith("bubblewrap") and r["isolation"]["problems"] == []


# ---- this torch build: the demo, and a student's check ---------------------------------------------

@pytest.mark.timeout(900)
def test_with_this_torch_build_the_demo_scores_full_and_check_passes_and_fails_as_usual(reference_run_files, tmp_path):
    """What `make demo` does, with whichever torch runs the tests (`make test-cuda`: the CUDA build)."""
    log, _ = reference_run_files
    zipped = tmp_path / "demo-student.zip"
    packaged = subprocess.run([sys.executable, "-m", "grader", "package", "assignment_4/reference", "--log", str(log),
                               "-o", str(zipped)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert packaged.returncode == 0, packaged.stderr
    graded = subprocess.run([sys.executable, "-m", "grader", "grade", str(zipped), "--out", str(tmp_path / "out"),
                             "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=800)
    assert graded.returncode == 0, graded.stdout + graded.stderr
    r = _results(tmp_path / "out")["demo-student"]
    assert (r["status"], r["score"]) == ("graded", FULL), r["message"]
    from grader.student.check import check
    assert check(zipped).passed
    code = mutate("dp_summed")
    mutant = tmp_path / "mutant.zip"
    mutant.write_bytes(zip_bytes(Files(code=code, log=refingerprint(log.read_text(), code),
                                       err=log.with_suffix(".err").read_text())))
    report = check(mutant)
    rows = {row.part: row for row in report.rows}
    assert not report.passed and rows["data_parallel"].rerun.value == "failed"
    assert MUTANTS["dp_summed"].diagnosis in rows["data_parallel"].message, rows["data_parallel"].message
