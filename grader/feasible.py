"""Whether the kit can run a rubric's checks: every number a part splits, against what splits it.

A part splits sizes of a check (grader.parts: `splits`): Part 2 the batch into micro-batches, Part
3 the batch over the ranks, Part 4 W's columns over the ranks, Part 5 its hidden width over the
ranks. A check that runs a part where one does not divide cannot be run (the reference itself
refuses it), so the rubric is refused when it is read, naming the check, the part and the
numbers, and saying what to change, before a batch (or a student's check) runs anything. So are
a public world size at which a public check cannot run (`public_world_sizes`), and a parallel
part that no check of a kind runs on more than one rank (its work would never be needed, and its
one-rank checks never earn, grader.worth). (grader.rubric refuses values no check can have: a
size below 1, nodes that do not divide world_size, an unknown kind.)

`problem(rubric, source)` returns the first such problem as one line, or "" when there is none;
grader.rubric raises it as a RubricError.
"""

from grader.parts import BY_ID


def where(source: str, i: int, check) -> str:
    """A check as a message names it: the rubric file, its place in the list, its name."""
    return f"{source}.checks[{i}] ({check.name})"


def _nearby(size: int, by: int) -> str:
    """Values near `size` that `by` divides, as advice: "126 or 129"."""
    below = size - size % by
    return " or ".join(str(v) for v in dict.fromkeys(v for v in (below, below + by) if v >= by))


def _split(check, part: str, whose: str) -> str:
    """Why `check` cannot run `part` (a size it splits does not divide), or ""."""
    for size, by, what in BY_ID[part].splits:
        total, parts = getattr(check, size), getattr(check, by)
        if total % parts:
            return (f"{BY_ID[part].title} splits {what}, but {size} ({total}) is not divisible by "
                    f"{by} ({parts}): set {whose} {size} to a multiple of {parts} (e.g. {_nearby(total, parts)})"
                    + (", or leave the part off" if BY_ID[part].optional else ""))
    return ""


def check_problem(rubric, check, whose: str = "the check's") -> str:
    """Why the kit cannot run `check` as `rubric` grades it, or "" (`whose`: how the advice names it)."""
    for part in rubric.parts_at(check):
        said = _split(check, part, whose)
        if said:
            return said
    return ""


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


def problem(rubric, source: str, derived: dict = None) -> str:
    """The first reason the kit cannot run `rubric` (read from `source`), or "". `derived`: check name
    -> the public check it was derived from at a public world size (grader.rubric.at_public_world_sizes)."""
    derived = derived or {}
    for i, check in enumerate(rubric.checks):
        origin = derived.get(check.name)
        said = check_problem(rubric, check, "the check's" if origin is None else "the public check's")
        if not said:
            continue
        if origin is not None:
            return (f"{source}.public_world_sizes: {check.world_size} runs the public check '{origin}' at "
                    f"{check.world_size} rank{'s' if check.world_size > 1 else ''} (as '{check.name}'), "
                    f"where {said}; or leave {check.world_size} out of public_world_sizes")
        return f"{where(source, i, check)}: {said}"
    if rubric.hidden_summary and any(c.hidden for c in rubric.checks):
        return (f"{source}.hidden_summary: is derived from the hidden checks (the student release's public "
                f"rubric carries it); remove it from a rubric that has hidden checks")
    # A public rubric (it carries what its hidden checks hold) was held to this with them.
    return "" if rubric.hidden_summary else _parallel_problem(rubric, source)
