"""What a students' release must not hold, found in every file written: `find_leaks`.

- solution text: a line of the reference's SOLUTION blocks that appears nowhere else in it, or a
  marker (BEGIN SOLUTION, REFERENCE ONLY), or a `reference/` path, or the graders' rubric;
- a hidden check: its name, or its values as a rubric or feedback would write them;
- a trace of an optional part the course leaves off, in the files students read;
- the lab's answers: a file of lab/ that answers a TODO of a part the course grades
  (grader.instructor.lab.ANSWERS), or any lab file whose code does (lab.answer_traces), unless
  the release ships the lab whole (`lab_answers`).
Each is one line, "path: what"; the release lists them all.
"""

import re
from pathlib import Path

from grader import kit
from grader.instructor.lab import answer_traces, answered
from grader.parts import BY_ID, number as part_number
from grader.rubric import DEFAULT_RUBRIC, PUBLIC_RUBRIC, load_rubric

ROOT = kit.ROOT
CONFIG = ("world_size", "seed", "global_batch_size", "input_dim", "output_dim", "accumulation_steps")


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
    """What names an optional part: its id, function, log prefix, scopes, number and the check keys
    only it reads (its `own_sizes`: left out of a public rubric whose course leaves it off)."""
    p = BY_ID[part]
    words = [p.id, p.function, p.log_prefix, *p.scopes, *p.own_sizes]
    number = part_number(part)
    return re.compile("|".join([rf"\b{re.escape(w)}\b" for w in words] + [rf"\bPart {number}\b"]))


def find_leaks(folder: Path, root: Path = ROOT, without=(), lab_answers: bool = False) -> list:
    """Every place in `folder` where the solution or a hidden check shows, where a student-facing
    file names an optional part in `without` (one the course leaves off), or, unless `lab_answers`,
    where the lab answers the assignment: ["path: what"]."""
    solution = solution_lines((root / "assignment_4" / "reference" / "assignment4.py").read_text())
    hidden = hidden_patterns(root / "grader" / DEFAULT_RUBRIC.name)
    traces = {part: part_traces(part) for part in without}
    leaks = [] if lab_answers else _lab_leaks(folder, load_rubric(root / "grader" / DEFAULT_RUBRIC.name).parts)
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


def rename_hint(leaks: list) -> str:
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




def _lab_leaks(folder: Path, parts) -> list:
    """The lab's answers in `folder`: the files ANSWERS names for the course's parts, and any other
    lab file whose code answers a TODO."""
    said = answered(parts)
    leaks = [f"{rel}: answers {what}: a students' release leaves it out (--lab-answers ships the lab whole)"
             for rel, what in said.items() if (folder / rel).is_file()]
    for path in sorted((folder / "lab").glob("*.py")) if (folder / "lab").is_dir() else []:
        rel = path.relative_to(folder).as_posix()
        if rel not in said:
            traces = answer_traces(path.read_text(errors="replace"))
            leaks += [f"{rel}: {trace}: leave it out of a students' release, or name it in "
                      f"grader/instructor/lab.py's ANSWERS" for trace in traces]
    return leaks
