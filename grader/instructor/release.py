"""The student release: the tree students receive, and nothing they could turn into the answer.

    python -m grader release --out DIR

writes

    README.md, requirements.txt        from student/: what students do, in order; what to install
    pyproject.toml                     the kit's: `pip install .` installs the release as a package
    assignment_4/                      the skeleton, utils.py and the handout (never reference/)
    slurm/                             the job scripts and the launcher, whole
    lab/                               the lecture's lab, less the files that answer the assignment
                                       (grader.instructor.lab; `--lab-answers`: whole)
    grader/                            the shared modules, the rooms one hand-in's grading runs on
                                       (grader.kit.HANDIN_ROOMS) and student: folder copies, so its command
                                       line offers only check and package; rubric-public.yaml,
                                       derived from rubric.yaml (rubric.public_rubric), in its place

A course whose rubric leaves an optional part off (Part 5, grader.parts) gets a release without
it: the skeleton and the handout are written without the part's `BEGIN PART`/`END PART` blocks,
the public rubric has neither its points nor its settings, and the scan refuses a release in
which the skeleton, the handout, the README or the public rubric still names it.

The handout's points are written from the rubric (grader.instructor.handout): its points blocks
filled with the course's parts, re-run and log points, bonus and penalties.

It is refused (ReleaseError) when the committed skeleton is not what the reference generates, when
the reference's configuration, the rubric's default check and the handout disagree, when the
handout or the README states points outside the blocks the rubric fills, when the public rubric
cannot be derived (a public check that does not divide at one of `public_world_sizes`), or when a
scan of every file written (grader.instructor.leaks) finds solution text, a `reference/` path, a
hidden check's name or values, or the lab's answers. Every place is named, all in one refusal.

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
from grader.instructor import handout, skeleton
from grader.instructor.config import config_drift
from grader.instructor.lab import answered, without_answers, without_markers
from grader.instructor.leaks import find_leaks, rename_hint
from grader.parts import BY_ID, OPTIONAL_PART_IDS
from grader.rubric import DEFAULT_RUBRIC, PUBLIC_RUBRIC, Rubric, RubricError, load_rubric, public_rubric

ROOT = kit.ROOT
HANDOUT = ("assignment4.py", "utils.py", "README.md")
ROOMS = kit.HANDIN_ROOMS + ("student",)   # what check and package run on
JUNK = re.compile(r"(^|/)(__pycache__|\.pytest_cache|\.DS_Store)(/|$)|\.(pyc|log|err|zip)$")
GUIDES = ("assignment_4/README.md", "student/README.md")   # where students read what each part is worth


class ReleaseError(ValueError):
    """The release cannot be built as things are; the message says what to fix."""


@dataclass
class Release:
    out: Path
    files: list = field(default_factory=list)     # relative paths written
    rooms: list = field(default_factory=list)     # grader rooms shipped beside the shared modules
    lab_answers: dict = field(default_factory=dict)   # lab file -> the TODOs it answers
    lab_shipped: bool = False                          # ... and whether they were shipped (--lab-answers)


PUBLIC_HEADER = """\
# The public checks of Assignment 4: what `python -m grader check` and `python -m grader package`
# run on your hand-in, with the points, tolerance and log requirements your hand-in is graded with.
# When your hand-in is graded, hidden checks also run your code at other seeds, sizes and world
# sizes, so passing every check here does not promise full marks: hidden_summary says, part by
# part, what kinds of hidden check can still fail it and the re-run points they hold.
# (Written from the graders' rubric by `python -m grader release`; do not edit. Its checks are
# already at every public world size, so public_world_sizes is empty.)
"""


def parts_off(rubric: Rubric) -> tuple:
    """The optional parts `rubric` leaves off."""
    return tuple(p for p in OPTIONAL_PART_IDS if p not in rubric.parts)


def public_rubric_text(rubric: Rubric) -> str:
    """The public rubric of `rubric` as the YAML file the student release ships."""
    data = dataclasses.asdict(public_rubric(rubric))
    del data["gradescope"]
    for part in parts_off(rubric):
        for check in data["checks"]:
            for key in BY_ID[part].own_sizes:   # the check keys only a part that is off reads
                check.pop(key, None)
    return PUBLIC_HEADER + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=200)


def _copy(src: Path, dst: Path, written: list, out: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)
    written.append(dst.relative_to(out).as_posix())


def _is_release(folder: Path) -> bool:
    return (folder / "grader" / PUBLIC_RUBRIC.name).is_file() and (folder / "assignment_4").is_dir()


def _copy_text(src: Path, dst: Path, written: list, out: Path, without: tuple, rubric: Rubric = None) -> None:
    """Copy `src`, without its optional-part markers and the blocks of the parts in `without`, its
    points blocks written from `rubric`."""
    text = src.read_text()
    if "BEGIN PART" not in text and "BEGIN POINTS" not in text:
        return _copy(src, dst, written, out)
    text = skeleton.strip_parts(text, without, src.name)
    dst.parent.mkdir(parents=True, exist_ok=True)
    kit.atomic_write(dst, handout.fill(text, rubric, markers=False) if rubric else text)
    written.append(dst.relative_to(out).as_posix())


def _problems(root: Path, rubric: Rubric) -> list:
    """(title, [places]) of everything that disagrees before a file is written."""
    found = []
    if not skeleton.skeleton_is_current(root / "assignment_4" / "reference" / "assignment4.py",
                                        root / "assignment_4" / "assignment4.py"):
        found.append(("the skeleton is out of date", ["assignment_4/assignment4.py differs from what the reference "
                                                      "generates: run `make skeleton` and commit the result"]))
    found.append(("the configuration is said differently in different places; make them agree", config_drift(root)))
    found.append(("points are stated outside what the rubric writes",
                  [place for name in GUIDES if (root / name).is_file()
                   for place in handout.stray_points((root / name).read_text(), name)]))
    return [(title, places) for title, places in found if places]


def build_release(out, root: Path = ROOT, replace: bool = False, lab_answers: bool = False) -> Release:
    """Write the student release into `out` (a new or empty folder; with `replace`, also one that
    holds an earlier release); see the module docstring. `lab_answers` ships the lab whole."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (replace and _is_release(out)))):
        raise ReleaseError(f"{out} is not an empty folder" + (" nor a release" if replace else "")
                           + ": give a new folder" + ("" if replace else ", or --replace to replace a release"))
    rubric = load_rubric(root / "grader" / DEFAULT_RUBRIC.name)
    problems = _problems(root, rubric)
    try:
        public = public_rubric_text(rubric)
    except RubricError as e:
        public = None
        problems.append(("the public rubric cannot be derived", [f"grader/rubric.yaml: {e}"]))
    without = parts_off(rubric)
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = out.parent / f".{out.name}.new-{os.getpid()}"   # made as mkdir makes folders (the umask's mode)
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    try:
        release = _write(staged, root, public, without, rubric, lab_answers)
        leaks = find_leaks(staged, root, without, lab_answers)
        if leaks:
            problems.append(("the release would leak", leaks))
        if problems:
            raise ReleaseError(_refusal(problems, leaks))
        _swap(staged, out)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    release.out = out
    return release


def _refusal(problems: list, leaks: list) -> str:
    count = sum(len(places) for _, places in problems)
    return (f"nothing was written; {count} place(s) to fix, all of them:\n"
            + "\n".join(f"  {title}:\n" + "\n".join(f"    {place}" for place in places) for title, places in problems)
            + rename_hint(leaks))


def _swap(staged: Path, out: Path) -> None:
    """Put the complete release `staged` where `out` is; an earlier one goes only once it is in place."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        out.rename(old / "release")
    staged.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write(out: Path, root: Path, public, without: tuple, rubric: Rubric, lab_answers: bool) -> Release:
    release = Release(out=out, rooms=list(ROOMS), lab_answers=answered(rubric.parts), lab_shipped=lab_answers)
    written = release.files
    for name in ("README.md", "requirements.txt"):
        _copy_text(kit.top_file(f"student/{name}", root), out / name, written, out, without, rubric)
    _copy(kit.top_file("pyproject.toml", root), out / "pyproject.toml", written, out)
    reference = (root / "assignment_4" / "reference" / "assignment4.py").read_text()
    for name in HANDOUT:
        if name == "assignment4.py":   # the committed skeleton, less the parts the course leaves off
            kit.atomic_write(out / "assignment_4" / name, skeleton.make_skeleton(reference, "assignment4.py",
                                                                                 without=without))
            written.append(f"assignment_4/{name}")
        else:
            _copy_text(root / "assignment_4" / name, out / "assignment_4" / name, written, out, without, rubric)
    left_out = set() if lab_answers else set(release.lab_answers)
    for path in sorted([*(root / "slurm").rglob("*"), *(root / "lab").rglob("*")]):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not JUNK.search(rel) and rel not in left_out:
            _copy(path, out / rel, written, out)
    if (out / "lab" / "README.md").is_file():
        readme = (out / "lab" / "README.md").read_text()
        kit.atomic_write(out / "lab" / "README.md", without_markers(readme if lab_answers else without_answers(readme)))
    for rel in kit.grader_files(ROOMS):
        _copy(root / "grader" / rel, out / "grader" / rel, written, out)
    if public is not None:
        kit.atomic_write(out / "grader" / PUBLIC_RUBRIC.name, public)
        written.append(f"grader/{PUBLIC_RUBRIC.name}")
    return release
