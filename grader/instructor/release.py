"""The student release: the tree students receive, and nothing they could turn into the answer.

    python -m grader release --out DIR

writes

    README.md, requirements.txt        from student/: what students do, in order; what to install
    pyproject.toml                     the kit's: `pip install .` installs the release as a package
    assignment_4/                      the skeleton, utils.py and the handout (never reference/)
    slurm/                             the job scripts and the launcher, whole
    lab/                               the lecture's lab, whole
    grader/                            the shared modules and the rooms the student tools need
                                       (rerun, pipeline, student): folder copies, so its command
                                       line offers only check and package; rubric-public.yaml,
                                       derived from rubric.yaml (rubric.public_rubric), in its place

It is refused (ReleaseError) when the committed skeleton is not what the reference generates, when
the reference's configuration, the rubric's default check and the handout disagree,
when the public rubric cannot be derived (a public check that does not divide at one of
`public_world_sizes`), or when a scan of
every file written finds solution text, a `reference/` path, or a hidden check's name or values.

The release is built in a new folder beside DIR and moved into place only when it is complete and
clean: a refused release leaves DIR as it was (with `--replace`, a previous release in DIR stays
until the new one takes its place).
"""

import dataclasses
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from grader import kit
from grader.instructor import skeleton
from grader.instructor.config import config_drift
from grader.rubric import DEFAULT_RUBRIC, PUBLIC_RUBRIC, Rubric, load_rubric, public_rubric

ROOT = kit.ROOT
HANDOUT = ("assignment4.py", "utils.py", "README.md")
ROOMS = ("rerun", "pipeline", "student")   # what check and package run on
JUNK = re.compile(r"(^|/)(__pycache__|\.pytest_cache|\.DS_Store)(/|$)|\.(pyc|log|err|zip)$")
CONFIG = ("world_size", "seed", "global_batch_size", "input_dim", "output_dim", "accumulation_steps")


class ReleaseError(ValueError):
    """The release cannot be built as things are; the message says what to fix."""


@dataclass
class Release:
    out: Path
    files: list = field(default_factory=list)     # relative paths written
    rooms: list = field(default_factory=list)     # grader rooms shipped beside the shared modules


PUBLIC_HEADER = """\
# The public checks of Assignment 4: what `python -m grader check` and `python -m grader package`
# run on your hand-in, with the points, tolerance and log requirements your hand-in is graded with.
# When your hand-in is graded, hidden checks also run your code at other seeds, sizes and world
# sizes, so passing every check here does not promise full marks.
# (Written from the graders' rubric by `python -m grader release`; do not edit. Its checks are
# already at every public world size, so public_world_sizes is empty.)
"""


def public_rubric_text(rubric: Rubric) -> str:
    """The public rubric of `rubric` as the YAML file the student release ships."""
    data = dataclasses.asdict(public_rubric(rubric))
    del data["gradescope"]
    return PUBLIC_HEADER + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=200)


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
    default = rubric.default_check
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


def _rename_hint(leaks: list) -> str:
    """A hidden check whose name turns up in several files is most likely named with a common word."""
    counts = {}
    for leak in leaks:
        if ": names hidden check '" in leak:
            name = leak.split(": names hidden check '", 1)[1].split("'", 1)[0]
            counts[name] = counts.get(name, 0) + 1
    common = sorted(name for name, n in counts.items() if n >= 3)
    return "".join(f"\nhidden check '{name}' is named in {counts[name]} files: if '{name}' is a common word, "
                   f"rename the check in grader/rubric.yaml (a name nothing else uses, e.g. 'hidden-{name}-1')"
                   for name in common)


def _copy(src: Path, dst: Path, written: list, out: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)
    written.append(dst.relative_to(out).as_posix())


def _is_release(folder: Path) -> bool:
    return (folder / "grader" / PUBLIC_RUBRIC.name).is_file() and (folder / "assignment_4").is_dir()


def build_release(out, root: Path = ROOT, replace: bool = False) -> Release:
    """Write the student release into `out` (a new or empty folder; with `replace`, also one that
    holds an earlier release); see the module docstring."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (replace and _is_release(out)))):
        raise ReleaseError(f"{out} is not an empty folder" + (" nor a release" if replace else "")
                           + ": give a new folder" + ("" if replace else ", or --replace to replace a release"))
    if not skeleton.skeleton_is_current(root / "assignment_4" / "reference" / "assignment4.py",
                                        root / "assignment_4" / "assignment4.py"):
        raise ReleaseError("assignment_4/assignment4.py differs from what the reference generates: run "
                           "`make skeleton` and commit the result")
    mismatched = config_drift(root)
    if mismatched:
        raise ReleaseError("the configuration is said differently in different places; make them agree:\n  "
                           + "\n  ".join(mismatched))
    public = public_rubric_text(load_rubric(root / "grader" / DEFAULT_RUBRIC.name))
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = out.parent / f".{out.name}.new-{os.getpid()}"   # made as mkdir makes folders (the umask's mode)
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    try:
        release = _write(staged, root, public)
        _swap(staged, out)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    release.out = out
    return release


def _swap(staged: Path, out: Path) -> None:
    """Put the complete release `staged` where `out` is; an earlier one goes only once it is in place."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        out.rename(old / "release")
    staged.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write(out: Path, root: Path, public: str) -> Release:
    release = Release(out=out, rooms=list(ROOMS))
    written = release.files
    for name in ("README.md", "requirements.txt"):
        _copy(root / "student" / name, out / name, written, out)
    _copy(root / "pyproject.toml", out / "pyproject.toml", written, out)
    for name in HANDOUT:
        _copy(root / "assignment_4" / name, out / "assignment_4" / name, written, out)
    for path in sorted([*(root / "slurm").rglob("*"), *(root / "lab").rglob("*")]):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not JUNK.search(rel):
            _copy(path, out / rel, written, out)
    for rel in kit.grader_files(ROOMS):
        _copy(root / "grader" / rel, out / "grader" / rel, written, out)
    kit.atomic_write(out / "grader" / PUBLIC_RUBRIC.name, public)
    written.append(f"grader/{PUBLIC_RUBRIC.name}")
    leaks = find_leaks(out, root)
    if leaks:
        raise ReleaseError("the release would leak (nothing was left written):\n  " + "\n  ".join(leaks)
                           + _rename_hint(leaks))
    return release
