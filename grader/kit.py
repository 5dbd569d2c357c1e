"""The kit's own files, where they are, and how the grader writes files.

Every path of the kit is named here once; every other module imports it from here. `source_digest`
is what a cached result is held against, with the rubric's digest and the isolation mode: a result
graded by other grading code, against another `utils.py` or under another torch is graded again; a
change anywhere else (integrity/, the gradebook, README) regrades nothing. What is written for a hand-in is
bounded here (`fit`, `fit_text`): a hand-in never decides how much is written.
"""

import contextlib
import hashlib
import importlib.metadata
import json
import os
import re
import tempfile
from functools import lru_cache
from pathlib import Path

# The kit's top folder, found from this package wherever it is imported from: a clone, the student
# release, the Gradescope bundle, or site-packages after `pip install .` (where the kit's packages
# sit beside every other package, and ROOT holds no requirements.txt or tests).
ROOT = Path(__file__).resolve().parent.parent
GRADER = ROOT / "grader"
ASSIGNMENT = ROOT / "assignment_4"
REFERENCE = ASSIGNMENT / "reference" / "assignment4.py"   # never shipped, never in a sandbox
SKELETON = ASSIGNMENT / "assignment4.py"                   # generated from REFERENCE
UTILS = ASSIGNMENT / "utils.py"                            # the provided copy: re-runs always use it
RUBRIC = GRADER / "rubric.yaml"                            # the graders': public and hidden checks
PUBLIC_RUBRIC = GRADER / "rubric-public.yaml"              # the release's, written from RUBRIC
# The kit's top-level files that commands read (the release, the Gradescope bundle). In a clone they
# are at ROOT; a wheel (`pip install .`) carries copies in grader/top/ (setup.py), as site-packages
# has no top folder of the kit: `top_file` finds each where it is.
TOP_FILES = ("pyproject.toml", "requirements.txt", "requirements-test.txt", "student/README.md",
             "student/requirements.txt")
WHEEL_TOP = "top"   # the folder of grader/ that holds a wheel's copies of TOP_FILES
# Where Gradescope's container puts a submission and its metadata, and where it reads the results
# (grader.gradescope.run.grade_submission's defaults, and the command line's).
GRADESCOPE_SUBMISSION = "/autograder/submission"
GRADESCOPE_RESULTS = "/autograder/results/results.json"
GRADESCOPE_METADATA = "/autograder/submission_metadata.json"
# The batch's shape (grader.batch.run.grade_batch's defaults, grader.batch.array.grade_on_slurm's, and
# the command line's).
JOBS = None              # hand-ins graded at once on this machine: None, as many as it holds (grader.limits.default_jobs)
TASK_JOBS = 1            # in each array task, unless --jobs says (what a task asks Slurm for depends on it)
ARRAY_PARALLELISM = 16   # tasks running at once
ARRAY_CHUNK = 10         # hand-ins per task
# The kit's own folders under ROOT: what a sandbox hides when ROOT is a site-packages it binds.
FOLDERS = (GRADER, ASSIGNMENT, ROOT / "slurm", ROOT / "lab")

# The shared vocabulary every room may import (grader/__init__.py has the map; a folder: a shared
# package, every Python file in it), and the rooms.
SHARED = ("__init__.py", "__main__.py", "cli.py", "feasible.py", "kit.py", "limits.py", "lmss.py", "names.py",
          "outline.py", "parts", "plots.py", "results.py", "rubric.py", "typed.py", "worth.py")
ROOMS = ("rerun", "evidence", "intake", "verdict", "pipeline", "batch", "student", "gradescope", "instructor",
         "integrity", "grades", "analytics")


def _read_umask() -> int:
    # Read once, at import: setting it to read it is not safe once grading threads are running.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


# The rooms one hand-in's grading runs on (with the shared modules): the engine, the hand-in's
# intake, its logs as evidence, the verdicts and the pipeline that strings them together. The
# student release and the Gradescope bundle ship these whole, each with its own room beside.
HANDIN_ROOMS = ("rerun", "evidence", "intake", "verdict", "pipeline")
# The rooms whose code decides a hand-in's result: those, and the batch that runs them. Not
# integrity, grades, instructor, student or gradescope: they read results or build trees, and never
# change a grading.json.
GRADING_ROOMS = HANDIN_ROOMS + ("batch",)


def top_file(rel: str, root: Path = None) -> Path:
    """The kit's top-level file `rel` (one of TOP_FILES) of the kit at `root` (default ROOT): the
    copy an installed wheel carries in grader/top/, else the file in `root` itself."""
    assert rel in TOP_FILES, f"{rel} is not one of grader.kit.TOP_FILES"
    root = ROOT if root is None else Path(root)
    shipped = root / "grader" / WHEEL_TOP / rel
    return shipped if shipped.is_file() else root / rel


REQUIREMENTS = top_file("requirements.txt")


def torch_version() -> str:
    """The installed torch's version (without importing it: shared modules import no torch)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "no torch"


def source_digest(grader: Path = GRADER, utils: Path = UTILS, torch: str = None) -> str:
    """sha256 over what grading depends on besides the rubric and the isolation mode (each held
    against on its own): the files of the shared modules and GRADING_ROOMS (names and bytes), the
    provided utils.py and the torch version (`torch`, default the installed one).

    Computed over whatever of those this tree holds (the release and the Gradescope bundle hold
    less), so a result is reused only by the very code that graded it.
    """
    digest = hashlib.sha256()
    for rel in grader_files(GRADING_ROOMS, grader):
        if (grader / rel).is_file():
            digest.update(rel.as_posix().encode() + b"\0" + hashlib.sha256((grader / rel).read_bytes()).digest())
    if utils.is_file():
        digest.update(b"utils.py\0" + hashlib.sha256(utils.read_bytes()).digest())
    digest.update(b"torch\0" + (torch or torch_version()).encode())
    return digest.hexdigest()


def grader_files(rooms, grader: Path = GRADER) -> list:
    """The grader's files a tree with `rooms` holds: the shared modules and every file of each room
    (its scripts and data too), as paths relative to the grader folder. Never the rubrics: each
    tree ships the one it needs."""
    unknown = sorted(set(rooms) - set(ROOMS))
    assert not unknown, f"no room {unknown}"
    files = []
    for name in SHARED:
        folder = grader / name
        files += sorted(p.relative_to(grader) for p in folder.glob("*.py")) if folder.is_dir() else [Path(name)]
    for room in rooms:
        files += sorted(p.relative_to(grader) for p in (grader / room).rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    return files


def read_yaml(path: Path, what: str, error: type):
    """The YAML document at `path` (a rubric, a policy, ...); `error` naming the file when it cannot
    be read or parsed."""
    import yaml
    try:
        return yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise error(f"{path}: cannot read the {what} ({e.strerror})") from e
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML ({e})") from e


CUT = "... (cut)"
FILE_BYTES = 256 << 10   # each file written for a hand-in
# (characters of one text, items of one list or mapping), tried in turn until the file fits.
LEVELS = ((32_000, 1000), (2000, 100), (200, 20))


def bounded(value, chars: int, items: int):
    """JSON data with each text at most `chars` characters and each list or mapping at most `items`
    items; a cut text ends with CUT, a cut list of texts with a last text saying how many are left out."""
    if isinstance(value, str):
        return value if len(value) <= chars else value[:chars] + CUT
    if isinstance(value, dict):
        return {bounded(k, chars, items): bounded(v, chars, items) for k, v in list(value.items())[:items]}
    if isinstance(value, (list, tuple)):
        kept = [bounded(v, chars, items) for v in value[:items]]
        if len(value) > items and all(isinstance(v, str) for v in value[:items]):
            kept.append(f"{CUT} ({len(value) - items} more)")
        return kept
    return value


def fit(data: dict) -> dict:
    """`data` bounded at the loosest of LEVELS whose JSON fits in FILE_BYTES (else the tightest)."""
    for chars, items in LEVELS:
        kept = bounded(data, chars, items)
        if len(json.dumps(kept, indent=1).encode()) <= FILE_BYTES:
            break
    return kept


def fit_text(text: str) -> str:
    """A text file's content cut to FILE_BYTES."""
    data = text.encode("utf-8", "replace")
    return text if len(data) <= FILE_BYTES else data[:FILE_BYTES].decode("utf-8", "ignore") + "\n\n" + CUT + "\n"


def atomic_write(path: Path, text) -> None:
    """Write `text` (str, or bytes written as they are) to `path` through a temporary file and a
    rename: a reader sees the old file or the new one, never half of one. The file gets the mode the
    user's umask gives new files, so a shared grading folder stays readable to the other TAs. Text
    is written as UTF-8, a lone surrogate as "?" (a file name's undecodable byte, or a hand-in's
    exception text, must not stop a page from being written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with (os.fdopen(fd, "wb") if isinstance(text, bytes) else os.fdopen(fd, "w", encoding="utf-8", errors="replace", newline="")) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


UNFINISHED = re.compile(r"^\.(.+)\.[a-z0-9_]{8}$")   # mkstemp's name for atomic_write's temporary file


def unfinished_writes(folder: Path) -> list:
    """The temporary files `atomic_write` and `atomic_path` left in `folder` when their process was
    killed mid-write (SIGKILL runs no cleanup): for the run that writes that folder again to remove."""
    folder = Path(folder)
    return sorted(p for p in folder.iterdir() if UNFINISHED.match(p.name) and p.is_file()) if folder.is_dir() else []


@contextlib.contextmanager
def atomic_path(path: Path):
    """A temporary path beside `path` for a writer that needs a file name (a zip): renamed to `path`
    when the block ends, removed when it raises, so a command that fails leaves no half-written file
    and an earlier `path` stays as it was. The file gets the mode the user's umask gives new files."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        try:
            os.fchmod(fd, 0o666 & ~_UMASK)
        finally:
            os.close(fd)
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: Path, data, sort_keys: bool = False) -> None:
    """`data` as indented JSON, written atomically."""
    atomic_write(path, json.dumps(data, indent=1, sort_keys=sort_keys) + "\n")


@lru_cache(maxsize=None)
def page_template(path: Path):
    """The Jinja2 template at `path` (a room's templates/ file), every value it shows escaped
    (autoescape) and every name it uses required (StrictUndefined). Jinja2 is loaded only here."""
    import jinja2
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(path).parent), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env.get_template(Path(path).name)
