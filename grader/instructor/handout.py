"""The points the handout states, written from the rubric: never typed, so never out of date.

assignment_4/README.md holds its points between markers, on lines of their own:

    <!-- BEGIN POINTS -->              the table of every part the rubric grades: re-run, log, in all,
    ...                                a bonus part's points on top, the penalties for missing files
    <!-- END POINTS -->
    <!-- BEGIN POINTS megatron_mlp --> one part's sentence (Part 5's section says what it is worth)
    ...
    <!-- END POINTS megatron_mlp -->

`fill` writes each block from a rubric: `python -m grader skeleton` keeps the committed handout's
blocks those of grader/rubric.yaml, and `python -m grader release` writes the course's into the
release and drops the markers. A number of points said anywhere else in the handout or the
students' README ("2 for the log", "10 bonus points") is a place that can disagree with the
rubric: `stray_points` names each, and the release refuses them.
"""

import re
from pathlib import Path

from grader import kit
from grader.parts import BY_ID, PART_IDS

HANDOUT = kit.ASSIGNMENT / "README.md"
BLOCK = re.compile(r"^<!-- BEGIN POINTS(?: (?P<part>\w+))? -->\n(?P<body>.*?)^<!-- END POINTS(?: (?P=part))? -->\n",
                   re.S | re.M)
# A number of points, said in words: "8 points", "10 bonus points", "2 for the log", "8 for the re-run".
STRAY = re.compile(r"\b\d+(?:\.\d+)?\s+(?:bonus\s+)?points?\b|\b\d+(?:\.\d+)?\s+for\s+the\s+(?:log|re-?run)\b", re.I)
PENALTIES = {"penalty_missing_err": "a hand-in without the run's `.err`",
             "penalty_missing_log": "a hand-in without the run's `.log`",
             "penalty_missing_utils": "a hand-in without `utils.py`",
             "penalty_modified_utils": "a `utils.py` that differs from the one handed out"}


def _n(x: float) -> str:
    return f"{x:g}"


def points_table(rubric) -> str:
    """The points of every part `rubric` grades, as a Markdown table and the penalties under it."""
    lines = ["| part | your code re-run by the grader | your run's log | in all |", "| --- | ---: | ---: | ---: |"]
    bonus = 0.0
    for part_id in rubric.part_ids:
        p = rubric.parts[part_id]
        title = BY_ID[part_id].title + (", a bonus" if p.bonus else "")
        lines.append(f"| {title} | {_n(p.rerun)} | {_n(p.log)} | {_n(p.rerun + p.log)} |")
        bonus += (p.rerun + p.log) if p.bonus else 0.0
    total = f"**{_n(rubric.max_score)}**" + (f", and {_n(bonus)} bonus on top" if bonus else "")
    lines += [f"| **all parts** | | | {total} |", "",
              "The re-run's points are split over the checks the grader runs your code at: the public ones "
              "(`python -m grader check` runs them) and hidden ones at other seeds, sizes and world sizes. The "
              "log's points count when your run's `.log` shows the part matching on every rank."]
    penalties = [f"{what} costs {_n(getattr(rubric.files, key))} point{'s' if getattr(rubric.files, key) != 1 else ''}"
                 for key, what in PENALTIES.items() if getattr(rubric.files, key)]
    if penalties:
        lines += ["", "Taken off the total: " + "; ".join(penalties) + "."]
    return "\n".join(lines) + "\n"


def part_points(rubric, part_id: str) -> str:
    """The sentence of one optional part's section: what it is worth in `rubric`."""
    p = rubric.parts.get(part_id)
    if p is None:
        return ("This part is off in this course's rubric (grader/rubric.yaml): a course turns it on by giving it "
                "points there, and then this section and its points are in the students' release.\n")
    split = f"({_n(p.log)} for the log and {_n(p.rerun)} for the re-run)"
    if p.bonus:
        return (f"This part is optional: it earns {_n(p.rerun + p.log)} bonus points on top of "
                f"Parts 1-{PART_IDS.index(part_id)} {split}, and leaving it as a `TODO` costs nothing.\n")
    return f"This part counts toward your grade as the others do: {_n(p.rerun + p.log)} points {split}.\n"


def fill(text: str, rubric, markers: bool = True) -> str:
    """`text` with every points block written from `rubric` (without the markers unless `markers`)."""
    def block(m: re.Match) -> str:
        part = m["part"]
        body = points_table(rubric) if part is None else part_points(rubric, part)
        if not markers:
            return body
        name = f" {part}" if part else ""
        return f"<!-- BEGIN POINTS{name} -->\n{body}<!-- END POINTS{name} -->\n"
    return BLOCK.sub(block, text)


def stray_points(text: str, name: str) -> list:
    """Every number of points `text` says outside its points blocks: ["name: says '...'"]."""
    outside = BLOCK.sub("", text)
    return [f"{name} says {' '.join(m.group(0).split())!r} outside the points the release writes from the rubric: "
            f"say it through the table (<!-- BEGIN POINTS --> ... <!-- END POINTS -->)"
            for m in STRAY.finditer(outside)]


def points_are_current(rubric, path: Path = HANDOUT) -> bool:
    text = path.read_text()
    return BLOCK.search(text) is not None and fill(text, rubric) == text


def write_points(rubric, path: Path = HANDOUT) -> bool:
    """Rewrite the points blocks of `path` from `rubric`; return whether the file changed."""
    text = path.read_text()
    new = fill(text, rubric)
    if new != text:
        kit.atomic_write(path, new)
    return new != text
