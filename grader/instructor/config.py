"""The assignment's configuration, said in three places, checked to agree before a release.

The reference's constants (`global_batch_size = 128` ... at the top of
assignment_4/reference/assignment4.py, and so of the skeleton generated from it), the rubric's
`default` check (the public configuration every hand-in is re-run at, and the run its `.log` is
held against) and the handout's numbers (assignment_4/README.md: the shapes of W and of the
batch, and the numbers it tells students never to assume). An instructor who changes one and not
the others would grade students against numbers they were never given. The account the handout
and the release's README give of `python -m grader check` (the world sizes it runs at, the ranks
a log needs) is held against the public rubric the same way.
"""

import ast
import re
from pathlib import Path

from grader import kit
from grader.feasible import counts
from grader.rubric import Check, load_rubric, public_rubric

KEYS = tuple(dict.fromkeys(("global_batch_size", "input_dim", "output_dim", "seed", "accumulation_steps",
                           *counts(Check))))   # and each optional part's own sizes that count something
# What the handout says, by pattern: each group is the value of the key beside it.
HANDOUT = (
    (r"\[input_dim, output_dim\] = \[(\d+), (\d+)\]", ("input_dim", "output_dim")),
    (r"\[B, input_dim\] = \[(\d+), (\d+)\]", ("global_batch_size", "input_dim")),
    (r"never assume the numbers (\d+), (\d+), (\d+) or (\d+)",
     ("global_batch_size", "input_dim", "output_dim", "accumulation_steps")),
)
# What the handout says of the students' check: the world sizes it runs at, the ranks a log needs.
PUBLIC_SIZES = r"in worlds of ((?:\d+, )*\d+(?: and \d+)?) ranks"
LOG_RANKS = r"did it have at least (\d+) ranks"


def reference_constants(path: Path) -> dict:
    """The module-level `name = <number>` assignments of the reference for KEYS and learning_rate."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, (int, float)):
            if node.targets[0].id in KEYS + ("learning_rate",):
                found[node.targets[0].id] = node.value.value
    return found


def handout_numbers(path: Path) -> list:
    """(key, value, the sentence it comes from) for every number the handout states."""
    text = " ".join(path.read_text().split())
    found = []
    for pattern, keys in HANDOUT:
        for match in re.finditer(pattern, text):
            found += [(key, int(value), match.group(0)) for key, value in zip(keys, match.groups())]
    return found


def config_drift(root: Path) -> list:
    """Where the reference, the rubric's default check and the handout disagree: one sentence per
    disagreement, naming the file and the values; [] when they agree."""
    reference_path = root / "assignment_4" / "reference" / "assignment4.py"
    handout_path = root / "assignment_4" / "README.md"
    rubric = load_rubric(root / "grader" / "rubric.yaml")
    reference = reference_constants(reference_path)
    default = rubric.default_check
    drift = [f"{reference_path.relative_to(root)} sets no `{key} = <number>` at its top" for key in KEYS
             if key not in reference]
    for key in KEYS:
        if key in reference and getattr(default, key) != reference[key]:
            drift.append(f"{reference_path.relative_to(root)} sets {key} = {reference[key]} but grader/rubric.yaml's "
                         f"check '{default.name}' has {key}: {getattr(default, key)}")
    if "learning_rate" in reference and reference["learning_rate"] != rubric.learning_rate:
        drift.append(f"{reference_path.relative_to(root)} sets learning_rate = {reference['learning_rate']} but "
                     f"grader/rubric.yaml has learning_rate: {rubric.learning_rate}")
    stated = handout_numbers(handout_path)
    if not stated:
        drift.append(f"{handout_path.relative_to(root)} states none of the configuration's numbers the release "
                     f"checks (the shapes of W and of the batch)")
    for key, value, sentence in stated:
        if key in reference and value != reference[key]:
            drift.append(f"{handout_path.relative_to(root)} says {key} is {value} (\"{sentence}\") but "
                         f"{reference_path.relative_to(root)} sets {key} = {reference[key]}")
    for guide in (handout_path, kit.top_file("student/README.md", root)):
        if guide.is_file():
            drift += _check_drift(guide, root, rubric)
    return drift


def _check_drift(guide: Path, root: Path, rubric) -> list:
    """Where a student guide's account of the students' check disagrees with the public rubric."""
    text, name = " ".join(guide.read_text().split()), guide.relative_to(root)
    drift = []
    sizes = list(dict.fromkeys(c.world_size for c in public_rubric(rubric).checks))   # each kind runs at them all
    for match in re.finditer(PUBLIC_SIZES, text):
        said = [int(n) for n in re.findall(r"\d+", match.group(1))]
        if said != sizes:
            drift.append(f"{name} says the check runs \"{match.group(0)}\" but the public rubric's checks run at world "
                         f"sizes {', '.join(map(str, sizes))} (grader/rubric.yaml: public_world_sizes)")
    for match in re.finditer(LOG_RANKS, text):
        if int(match.group(1)) != rubric.log_min_world_size:
            drift.append(f"{name} says a log needs \"{match.group(0)}\" but grader/rubric.yaml has "
                         f"log_min_world_size: {rubric.log_min_world_size}")
    return drift
