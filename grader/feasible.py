"""Whether the kit can run a rubric's checks: every number a part splits, against what splits it.

A part splits sizes of a check (grader.parts: `splits`): Part 2 the batch into micro-batches, Part
3 the batch over the ranks, Part 4 W's columns over the ranks, Part 5 its hidden width over the
ranks. A check that runs a part where one does not divide cannot be run (the reference itself
refuses it), so the rubric is refused when it is read, naming the check, the part and the
numbers, and saying what to change, before a batch (or a student's check) runs anything. So are
a public world size at which a public check cannot run (`public_world_sizes`), and a parallel
part that no check of a kind runs on more than one rank (its work would never be needed, and its
one-rank checks never earn, grader.worth). The values no check or rubric can have (a size below 1,
nodes that do not divide world_size, an unknown kind, a timeout of 0) are here too
(value_problems, rubric_problems), so grader.rubric can refuse all of a rubric's problems at once.

`problems(rubric, source, derived)` returns every such problem, one line each, so that one
refusal lists every fix. A size is judged against all it must divide by at once: a public check's
batch at world size 3, 4 micro-batches and public world sizes [4, 1, 2] must be a multiple of
lcm(3, 4, 1, 2) = 12, and the advice names multiples of that, never a value the next rule refuses.
grader.rubric raises them together as one RubricError (`refusal`).
"""

import dataclasses
import math

from grader.names import listed
from grader.parts import BY_ID, OWN_SIZES, PARTS

OWN = "the check's"   # how advice names a check's own size

# The sizes some part splits: global_batch_size, output_dim, hidden_dim.
SIZES = tuple(dict.fromkeys(size for part in PARTS for size, _, _ in part.splits))


def where(source: str, i: int, check) -> str:
    """A check as a message names it: the rubric file, its place in the list, its name."""
    return f"{source}.checks[{i}] ({check.name})"


def _nearby(size: int, by: int) -> str:
    """Values near `size` that `by` divides, as advice: "126 or 129"."""
    below = size - size % by
    return " or ".join(str(v) for v in dict.fromkeys(v for v in (below, below + by) if v >= by))


def _splits(rubric, copy, size: str) -> list:
    """(copy, part, by, value) for each part `copy` runs that splits its `size` by `by` (= value)."""
    return [(copy, part, by, getattr(copy, by)) for part in rubric.parts_at(copy)
            for split, by, _ in BY_ID[part].splits if split == size]


def _clause(entry, original, size: str, total: int, at_own: bool) -> str:
    """One broken split: "Part 3: data parallel splits the batch over the ranks, but ... (3)"."""
    copy, part, by, value = entry
    what = next(w for s, b, w in BY_ID[part].splits if (s, b) == (size, by))
    at = "" if copy is original or not at_own else f" at {copy.world_size} rank{'s' if copy.world_size > 1 else ''} (as '{copy.name}')"
    return f"{BY_ID[part].title} splits {what}, but {size} ({total}) is not divisible by {by} ({value}){at}"


def _fix(size: str, total: int, entries: list, broken: list, original, whose: str) -> str:
    """Set `size` to a multiple of every divisor's least common multiple, saying which divide it."""
    step = math.lcm(*(value for *_, value in entries))
    own, public = {}, {}
    for copy, _, by, value in entries:
        if value > 1 and value not in own:
            if copy is original or by != "world_size":
                own[value] = f"{by} ({value})"
            else:
                public[value] = str(value)
    public = {v: w for v, w in public.items() if v not in own}
    labels = list(own.values()) + ([f"the public world size{'s' if len(public) > 1 else ''} {listed(list(public.values()))}"]
                                   if public else [])
    which = "" if len(own) + len(public) < 2 else f", which {listed(labels)} {'both' if len(own) + len(public) == 2 else 'all'} divide"
    off = ", or leave the part off" if all(BY_ID[part].optional for _, part, _, _ in broken) else ""
    return f"set {whose} {size} to a multiple of {step} (e.g. {_nearby(total, step)}){which}{off}"


def _size_problem(source: str, i: int, group: list, size: str, rubric) -> str:
    """Why the check `group[0]` (with its copies at public world sizes) cannot have its `size`, or ""."""
    original, total = group[0], getattr(group[0], size)
    entries = [e for copy in group for e in _splits(rubric, copy, size)]
    broken = {}
    for copy, part, by, value in entries:
        if total % value:   # the check itself first: a copy breaks what it breaks only at its own size
            broken.setdefault((part, by, value), (copy, part, by, value))
    broken = list(broken.values())
    if not broken:
        return ""
    at_own = any(copy is original for copy, *_ in broken)
    said = "; and ".join(_clause(e, original, size, total, at_own) for e in broken)
    if at_own:
        return f"{where(source, i, original)}: {said}: {_fix(size, total, entries, broken, original, OWN)}"
    sizes = listed([str(c.world_size) for c, *_ in broken])
    many = len(broken) > 1
    fix = _fix(size, total, entries, broken, original, "the public check's")
    return (f"{source}.public_world_sizes: {sizes} run{'' if many else 's'} the public check '{original.name}' "
            f"at {'those world sizes' if many else _ranks(broken[0][0])}"
            f"{'' if many else f' (as {broken[0][0].name!r})'}, where {said}: {fix}; or leave {sizes} out of "
            f"public_world_sizes")


def _ranks(check) -> str:
    return f"{check.world_size} rank{'s' if check.world_size > 1 else ''}"


def _groups(rubric, derived: dict) -> list:
    """(i, [check, its copies at public world sizes...]): i is the check's place in the rubric file."""
    groups, by_name = [], {}
    for check in rubric.checks:
        if check.name in derived and derived[check.name] in by_name:
            by_name[derived[check.name]][1].append(check)
        else:
            by_name[check.name] = (len(groups), [check])
            groups.append(by_name[check.name])
    return groups


def refusal(source: str, problems: list) -> str:
    """One message for every problem of a rubric: each on its own line, so that one edit fixes all."""
    if len(problems) == 1:
        return problems[0]
    return (f"{source}: {len(problems)} problems; fix them all before reading it again:\n"
            + "\n".join(f"  - {p}" for p in problems))


def counts(check) -> list:
    """The optional parts' own sizes of a check (or of its class) that count something (a whole
    number, at least 1 unless given): a width, a number of heads; not a switch, a shift or a count of
    padding (0 by default)."""
    defaults = {f.name: f.default for f in dataclasses.fields(check)}
    return [k for k in OWN_SIZES if type(defaults.get(k)) is int and defaults[k] >= 1]


def value_problems(checks: list, source: str, kinds: tuple) -> list:
    """Every value no check can have (a size below 1, a name used twice, nodes that do not divide
    world_size, an unknown kind), one line each."""
    said, names = [], [c.name for c in checks]
    for i, check in enumerate(checks):
        at = where(source, i, check)
        if names.count(check.name) > 1 and names.index(check.name) < i:
            said.append(f"{at}: the check name '{check.name}' is used twice; names must be unique")
        for key in ("world_size", "global_batch_size", "input_dim", "output_dim", "accumulation_steps",
                    *counts(check)):
            if getattr(check, key) < 1:
                said.append(f"{at}.{key}: must be at least 1")
        if check.weight <= 0:
            said.append(f"{at}.weight: must be positive")
        if check.nodes < 1 or check.world_size % check.nodes:
            said.append(f"{at}.nodes: must be at least 1 and divide world_size ({check.world_size}); "
                        f"each node runs world_size / nodes ranks")
        if check.kind not in kinds:
            said.append(f"{at}.kind: '{check.kind}' is not a kind of check; valid kinds: {', '.join(kinds)}")
    return said


def name_problems(checks: list, derived: dict, source: str) -> list:
    """A public check's copy at a public world size named as another check is."""
    names = [c.name for c in checks]
    return [f"{source}.public_world_sizes: the public check '{derived[c.name]}' at {c.world_size} rank"
            f"{'s' if c.world_size > 1 else ''} is named '{c.name}', which another check is named too: rename "
            f"that check" for c in checks if c.name in derived and names.count(c.name) > 1]


def sizes_problem(rubric, source: str) -> str:
    """What is wrong with public_world_sizes, or ""."""
    sizes = rubric.public_world_sizes
    if not isinstance(sizes, list) or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
        return (f"{source}.public_world_sizes: expected a list of world sizes (whole numbers, at least 1), "
                f"got {sizes!r}")
    return ""


def rubric_problems(rubric, source: str) -> list:
    """Every value of the rubric's own keys it cannot have, one line each."""
    said = []
    if not 0 <= rubric.score_decimals <= 6:
        said.append(f"{source}.score_decimals: {rubric.score_decimals} is not a number of decimals from 0 to 6")
    if rubric.log_min_world_size < 1 or rubric.log_min_nodes < 1:
        said.append(f"{source}.log_min_world_size, log_min_nodes: must be at least 1")
    if not any(not c.hidden and c.kind == "step" for c in rubric.checks):
        said.append(f"{source}.checks: at least one check must be public (hidden: false) and of "
                    f"kind step (the .log is held against the first)")
    for section in ("timeouts", "limits"):
        for key, value in dataclasses.asdict(getattr(rubric, section)).items():
            if value <= 0:
                said.append(f"{source}.{section}.{key}: must be positive")
    for key, value in dataclasses.asdict(rubric.gradescope).items():
        if value < 0:
            said.append(f"{source}.gradescope.{key}: must be 0 (no limit) or more")
    return said


def _parallel_problem(rubric, source: str) -> str:
    """A parallel part with a kind of check that never runs it on more than one rank."""
    for part in rubric.part_ids:
        if not BY_ID[part].parallel:
            continue
        for kind in BY_ID[part].kinds:
            sizes = {c.world_size for c in rubric.checks if c.kind == kind and part in rubric.parts_at(c)}
            if sizes == {1}:
                return (f"{source}.checks: {BY_ID[part].title} is communication, but every check of kind {kind} "
                        f"that runs it has world_size 1, where no communication is needed: give one of them "
                        f"world_size 2 or more (or public_world_sizes a size above 1)")
    return ""


def needs_problems(rubric, source: str) -> list:
    """A part the rubric turns on whose code builds on a part it leaves off (grader.parts: `needs`)."""
    said = []
    for part in rubric.part_ids:
        off = [BY_ID[n] for n in BY_ID[part].needs if n not in rubric.part_ids]
        if off:
            said.append(f"{source}.parts: {BY_ID[part].title} builds on the code of "
                        f"{listed([n.title for n in off])}, which the rubric leaves off: turn "
                        f"{listed([n.id for n in off])} on too, or leave {part} off")
    return said


def problems(rubric, source: str, derived: dict = None) -> list:
    """Every reason the kit cannot run `rubric` (read from `source`), one line each; [] when none.
    `derived`: check name -> the public check it was derived from at a public world size
    (grader.rubric.at_public_world_sizes). Checks with a size below 1 are left to grader.rubric."""
    said = needs_problems(rubric, source)
    for i, group in _groups(rubric, derived or {}):
        if all(getattr(c, key) >= 1 for c in group for key in (*SIZES, "world_size", "accumulation_steps")):
            said += [text for size in SIZES if (text := _size_problem(source, i, group, size, rubric))]
    if rubric.hidden_summary and any(c.hidden for c in rubric.checks):
        said.append(f"{source}.hidden_summary: is derived from the hidden checks (the student release's public "
                    f"rubric carries it); remove it from a rubric that has hidden checks")
    # A public rubric (it carries what its hidden checks hold) was held to this with them.
    if not rubric.hidden_summary and (text := _parallel_problem(rubric, source)):
        said.append(text)
    return said
