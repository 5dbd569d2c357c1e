"""The student release: the tree students receive, and nothing they could turn into the answer.

    python -m grader release --out DIR

writes

    README.md, requirements.txt        from student/: what students do, in order; what to install
    assignment_4/                      the skeleton, utils.py and the handout (never reference/)
    slurm/                             the job scripts, without slurm/dev/
    grader/                            the student tools (check, package): the grader modules they
                                       import and nothing else, a __main__.py that offers only
                                       them, and rubric-public.yaml in place of rubric.yaml

It is refused (ReleaseError) when the committed skeleton is not what the reference generates,
when the public rubric disagrees with the graders' or holds a hidden check, or when a scan of
every file written finds solution text, a `reference/` path, or a hidden check's name or values.
"""

import ast
import dataclasses
import re
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from grader import __version__, skeleton
from grader.rubric import DEFAULT_RUBRIC, PUBLIC_RUBRIC, load_rubric

ROOT = Path(__file__).resolve().parent.parent
HANDOUT = ("assignment4.py", "utils.py", "README.md")
ENTRY = "student_cli"                      # the student tools' command line; its imports make the list
JUNK = re.compile(r"(^|/)(__pycache__|\.pytest_cache|\.DS_Store)(/|$)|\.(pyc|log|err|zip)$")
MAIN = '''"""python -m grader: the student tools (see README.md at the top of the kit)."""

from grader.student_cli import main

raise SystemExit(main())
'''
CONFIG = ("world_size", "seed", "global_batch_size", "input_dim", "output_dim", "accumulation_steps")


class ReleaseError(ValueError):
    """The release cannot be built as things are; the message says what to fix."""


@dataclass
class Release:
    out: Path
    files: list = field(default_factory=list)     # relative paths written
    modules: list = field(default_factory=list)   # grader modules shipped


def modules_needed(grader_dir: Path = ROOT / "grader", entry: str = ENTRY) -> list:
    """The grader modules `entry` imports, directly or not (imports inside functions too)."""
    todo, seen = [entry], set()
    while todo:
        name = todo.pop()
        if name in seen or not (grader_dir / f"{name}.py").is_file():
            continue
        seen.add(name)
        tree = ast.parse((grader_dir / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "grader":
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("grader."):
                todo.append(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                todo += [a.name.split(".")[1] for a in node.names if a.name.startswith("grader.")]
    return sorted(seen | {"__init__"})


def public_rubric_drift(ta_path=DEFAULT_RUBRIC, public_path=PUBLIC_RUBRIC) -> list:
    """How the public rubric differs from what the graders' one implies; [] when it agrees.

    The public rubric must have the graders' points, tolerance, learning rate, log world size and
    file limits, no hidden check, and exactly the graders' public checks, each at world sizes 4, 1
    and 2 (in that order after the check's own world size): the first is the one the log is held
    against.
    """
    ta, public = load_rubric(ta_path), load_rubric(public_path)
    drift = [f"{key} differs" for key in ("parts", "tolerance", "learning_rate", "log_min_world_size")
             if getattr(ta, key) != getattr(public, key)]
    files = [dataclasses.replace(r.files, student_id_pattern="") for r in (ta, public)]
    if files[0] != files[1]:
        drift.append("files differs")
    drift += [f"check '{c.name}' is hidden" for c in public.checks if c.hidden]
    want = []
    for check in (c for c in ta.checks if not c.hidden):
        for size in dict.fromkeys((check.world_size, 4, 1, 2)):
            want.append(tuple(getattr(dataclasses.replace(check, world_size=size), k) for k in CONFIG))
    have = [tuple(getattr(c, k) for k in CONFIG) for c in public.checks]
    if have != want:
        drift.append(f"checks ({', '.join(CONFIG)}) are {have}; the graders' public checks make {want}")
    return drift


def solution_lines(reference: str) -> set:
    """The stripped lines inside the reference's SOLUTION blocks that appear nowhere else in it."""
    inside, given, solution = False, set(), set()
    for line in reference.splitlines():
        text = line.strip()
        if text.startswith("# BEGIN SOLUTION"):
            inside = True
        elif text == "# END SOLUTION":
            inside = False
        elif text:
            (solution if inside else given).add(text)
    return solution - given


def hidden_patterns(rubric_path=DEFAULT_RUBRIC) -> dict:
    """A regex per hidden check: its name, and its values as a rubric or feedback would write them."""
    rubric = load_rubric(rubric_path)
    default = next(c for c in rubric.checks if not c.hidden)
    patterns = {}
    for c in (c for c in rubric.checks if c.hidden):
        alternatives = [rf"(?<![\w-]){re.escape(c.name)}(?![\w-])", rf"\b{c.input_dim}x{c.output_dim}\b"]
        for key in CONFIG[1:]:
            if getattr(c, key) != getattr(default, key):
                word = {"global_batch_size": "(?:global_batch_size|batch)"}.get(key, key)
                alternatives.append(rf"\b{word}\W{{0,3}}{getattr(c, key)}\b")
        patterns[c.name] = re.compile("|".join(alternatives))
    return patterns


def find_leaks(folder: Path, root: Path = ROOT) -> list:
    """Every place in `folder` where the solution or a hidden check shows: ["path: what"]."""
    solution = solution_lines((root / "assignment_4" / "reference" / "assignment4.py").read_text())
    hidden = hidden_patterns(root / "grader" / "rubric.yaml")
    leaks = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if "reference" in path.relative_to(folder).parts or rel == "grader/rubric.yaml":
            leaks.append(f"{rel}: must not be in a release")
        text = path.read_bytes().decode("utf-8", "replace")
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "REFERENCE ONLY"):
            if marker in text:
                leaks.append(f"{rel}: has the marker '{marker}'")
        leaks += [f"{rel}: has the solution line {line!r}" for line in sorted(solution) if line in text]
        leaks += [f"{rel}: names hidden check '{name}' or its values" for name, p in hidden.items() if p.search(text)]
    return leaks


def _copy(src: Path, dst: Path, written: list, out: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)
    written.append(dst.relative_to(out).as_posix())


def build_release(out, root: Path = ROOT) -> Release:
    """Write the student release into `out` (a new or empty folder); see the module docstring."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ReleaseError(f"{out} is not an empty folder: give a new folder, or empty it first")
    if not skeleton.skeleton_is_current(root / "assignment_4" / "reference" / "assignment4.py",
                                        root / "assignment_4" / "assignment4.py"):
        raise ReleaseError("assignment_4/assignment4.py differs from what the reference generates: run "
                           "`make skeleton` and commit the result")
    drift = public_rubric_drift(root / "grader" / DEFAULT_RUBRIC.name, root / "grader" / PUBLIC_RUBRIC.name)
    if drift:
        raise ReleaseError("grader/rubric-public.yaml does not match grader/rubric.yaml: " + "; ".join(drift))
    release = Release(out=out, modules=modules_needed(root / "grader"))
    written = release.files
    out.mkdir(parents=True, exist_ok=True)
    for name in ("README.md", "requirements.txt"):
        _copy(root / "student" / name, out / name, written, out)
    for name in HANDOUT:
        _copy(root / "assignment_4" / name, out / "assignment_4" / name, written, out)
    for path in sorted((root / "slurm").rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not rel.startswith("slurm/dev/") and not JUNK.search(rel):
            _copy(path, out / rel, written, out)
    for module in release.modules:
        _copy(root / "grader" / f"{module}.py", out / "grader" / f"{module}.py", written, out)
    (out / "grader" / "__main__.py").write_text(MAIN)
    written.append("grader/__main__.py")
    _copy(root / "grader" / PUBLIC_RUBRIC.name, out / "grader" / PUBLIC_RUBRIC.name, written, out)
    leaks = find_leaks(out, root)
    if leaks:
        shutil.rmtree(out)
        raise ReleaseError("the release would leak (nothing was left written):\n  " + "\n  ".join(leaks))
    return release


# ---- the Gradescope autograder bundle ------------------------------------------------------------

SETUP_SH = """#!/usr/bin/env bash
# Runs once, when Gradescope builds the autograder image (Ubuntu).
set -euo pipefail
apt-get update -q
apt-get install -y -q --no-install-recommends python3 python3-pip python3-venv
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install -q --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
/autograder/venv/bin/pip install -q -r /autograder/source/requirements-gradescope.txt
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Runs for every submission.
cd /autograder/source
exec /autograder/venv/bin/python -m grader gradescope
"""

REQUIREMENTS = "numpy==2.4.6\nPyYAML==6.0.3\n"

BUNDLE_MAIN = '''"""python -m grader: the autograder's grading of one Gradescope submission."""

from grader.gradescope import main

raise SystemExit(main())
'''


def build_bundle(out="autograder.zip", rubric_path=None) -> Path:
    """The autograder zip: setup.sh, run_autograder, the grader modules grading needs (found by
    following imports from this one), utils.py and the rubric."""
    out = Path(out)
    rubric = Path(rubric_path) if rubric_path else ROOT / "grader" / "rubric.yaml"
    load_rubric(rubric)  # refuse to bundle a rubric that does not load
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in (("setup.sh", SETUP_SH), ("run_autograder", RUN_AUTOGRADER)):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16
            z.writestr(info, text)
        z.writestr("requirements-gradescope.txt", REQUIREMENTS)
        for name in modules_needed(ROOT / "grader", "gradescope"):
            z.write(ROOT / "grader" / f"{name}.py", f"grader/{name}.py")
        z.writestr("grader/__main__.py", BUNDLE_MAIN)
        z.write(rubric, "grader/rubric.yaml")
        z.write(ROOT / "assignment_4" / "utils.py", "assignment_4/utils.py")
        z.writestr("VERSION", f"a4 grader {__version__}\n")
    return out
