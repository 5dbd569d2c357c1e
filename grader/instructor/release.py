"""The student release: the tree students receive, and nothing they could turn into the answer.

    python -m grader release --out DIR

writes

    README.md, requirements.txt        from student/: what students do, in order; what to install
    pyproject.toml                     the kit's: `pip install .` installs the release as a package
    assignment_4/                      the skeleton, utils.py and the handout (never reference/)
    slurm/                             the job scripts and the launcher, whole
    lab/                               the lecture's lab, whole
    grader/                            the shared modules, the rooms one hand-in's grading runs on
                                       (grader.kit.HANDIN_ROOMS) and student: folder copies, so its command
                                       line offers only check and package; rubric-public.yaml,
                                       derived from rubric.yaml (rubric.public_rubric), in its place

A course whose rubric leaves an optional part off (Part 5, grader.parts) gets a release without
it: the skeleton and the handout are written without the part's `BEGIN PART`/`END PART` blocks,
the public rubric has neither its points nor its settings, and the scan refuses a release in
which the skeleton, the handout, the README or the public rubric still names it.

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
from grader.parts import BY_ID, OPTIONAL_PART_IDS, PART_IDS
from grader.instructor.config import config_drift
from grader.rubric import DEFAULT_RUBRIC, PUBLIC_RUBRIC, Rubric, load_rubric, public_rubric

ROOT = kit.ROOT
HANDOUT = ("assignment4.py", "utils.py", "README.md")
ROOMS = kit.HANDIN_ROOMS + ("student",)   # what check and package run on
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
# sizes, so passing every check here does not promise full marks: hidden_summary says, part by
# part, what kinds of hidden check can still fail it and the re-run points they hold.
# (Written from the graders' rubric by `python -m grader release`; do not edit. Its checks are
# already at every public world size, so public_world_sizes is empty.)
"""


# Check keys only an optional part reads: left out of a public rubric whose course leaves it off.
PART_KEYS = {"megatron_mlp": ("hidden_dim",)}


def parts_off(rubric: Rubric) -> tuple:
    """The optional parts `rubric` leaves off."""
    return tuple(p for p in OPTIONAL_PART_IDS if p not in rubric.parts)


def public_rubric_text(rubric: Rubric) -> str:
    """The public rubric of `rubric` as the YAML file the student release ships."""
    data = dataclasses.asdict(public_rubric(rubric))
    del data["gradescope"]
    for part in parts_off(rubric):
        for check in data["checks"]:
            for key in PART_KEYS.get(part, ()):
                check.pop(key, None)
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


# Where students read about the assignment: what must not name a part the course leaves off.
STUDENT_FACING = ("README.md", "assignment_4/assignment4.py", "assignment_4/README.md", f"grader/{PUBLIC_RUBRIC.name}")


def part_traces(part: str) -> re.Pattern:
    """What names an optional part: its id, function, log prefix, scopes, number and keys."""
    p = BY_ID[part]
    words = [p.id, p.function, p.log_prefix, *p.scopes, *PART_KEYS.get(part, ())]
    number = 1 + PART_IDS.index(part)
    return re.compile("|".join([rf"\b{re.escape(w)}\b" for w in words] + [rf"\bPart {number}\b"]))


def find_leaks(folder: Path, root: Path = ROOT, without=()) -> list:
    """Every place in `folder` where the solution or a hidden check shows, or where a student-facing
    file names an optional part in `without` (one the course leaves off): ["path: what"]."""
    solution = solution_lines((root / "assignment_4" / "reference" / "assignment4.py").read_text())
    hidden = hidden_patterns(root / "grader" / "rubric.yaml")
    traces = {part: part_traces(part) for part in without}
    leaks = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel in STUDENT_FACING:
            text = path.read_bytes().decode("utf-8", "replace")
            leaks += [f"{rel}: names {BY_ID[part].title}, which this course leaves off ({m.group(0)!r})"
                      for part, pattern in traces.items() if (m := pattern.search(text))]
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


def _copy_text(src: Path, dst: Path, written: list, out: Path, without: tuple) -> None:
    """Copy `src`, without its optional-part markers and the blocks of the parts in `without`."""
    text = src.read_text()
    if "BEGIN PART" not in text:
        return _copy(src, dst, written, out)
    dst.parent.mkdir(parents=True, exist_ok=True)
    kit.atomic_write(dst, skeleton.strip_parts(text, without, src.name))
    written.append(dst.relative_to(out).as_posix())


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
    rubric = load_rubric(root / "grader" / DEFAULT_RUBRIC.name)
    public = public_rubric_text(rubric)
    without = parts_off(rubric)
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = out.parent / f".{out.name}.new-{os.getpid()}"   # made as mkdir makes folders (the umask's mode)
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    try:
        release = _write(staged, root, public, without)
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


def _write(out: Path, root: Path, public: str, without: tuple) -> Release:
    release = Release(out=out, rooms=list(ROOMS))
    written = release.files
    for name in ("README.md", "requirements.txt"):
        _copy_text(kit.top_file(f"student/{name}", root), out / name, written, out, without)
    _copy(kit.top_file("pyproject.toml", root), out / "pyproject.toml", written, out)
    reference = (root / "assignment_4" / "reference" / "assignment4.py").read_text()
    for name in HANDOUT:
        if name == "assignment4.py":   # the committed skeleton, less the parts the course leaves off
            kit.atomic_write(out / "assignment_4" / name, skeleton.make_skeleton(reference, "assignment4.py",
                                                                                 without=without))
            written.append(f"assignment_4/{name}")
        else:
            _copy_text(root / "assignment_4" / name, out / "assignment_4" / name, written, out, without)
    for path in sorted([*(root / "slurm").rglob("*"), *(root / "lab").rglob("*")]):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not JUNK.search(rel):
            _copy(path, out / rel, written, out)
    for rel in kit.grader_files(ROOMS):
        _copy(root / "grader" / rel, out / "grader" / rel, written, out)
    kit.atomic_write(out / "grader" / PUBLIC_RUBRIC.name, public)
    written.append(f"grader/{PUBLIC_RUBRIC.name}")
    leaks = find_leaks(out, root, without)
    if leaks:
        raise ReleaseError("the release would leak (nothing was left written):\n  " + "\n  ".join(leaks)
                           + _rename_hint(leaks))
    return release
