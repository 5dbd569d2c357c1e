"""What a check is worth: a part's re-run points over its checks, the one-rank rule, the one rounding.

A part's `rerun` points are split over the checks that run it (C_P) by weight:

    share(P, c) = rerun_P * weight_c / sum over c' in C_P of weight_c'

and the part earns share(P, c) at each check c it passed, with one exception. A parallel part
(grader.parts: Parts 3-5, whose work is communication) needs no communication at one rank, so a
one-rank check shows its math and nothing of its parallel work: under the rubric's
`one_rank_needs_parallel` (on by default) its one-rank checks of a kind (step, backward) earn their
share only once the part passed a check of that kind with more than one rank. A data-parallel step
without its all-reduce, or a layer without f, so earns nothing at the checks it passes only
because one rank needs no collective; a part that communicates keeps what the one-rank checks
test (that the code also runs right at world size 1).

Scores are rounded once, here, to the rubric's `score_decimals` (`rounded`): a part's re-run points,
then its score (re-run and log points) and the hand-in's total only to shed float noise. Every
writer (grading.json, grades.csv, feedback, results.json, the LMS files) reads those numbers.

`hidden_summary` is what the students' check says of the hidden checks: for each part, what kinds
of hidden check run it (its step, its layer alone forward and backward) and how they differ from
the public ones (no public twin, several nodes, a world size no public check uses, other sizes,
another seed), and how many re-run points each holds; never a name or a value.
The student release carries it in its public rubric, which has no hidden checks to derive it from.
"""

from dataclasses import dataclass, field

from grader.parts import BY_ID, OWN_SIZES

SIZES = tuple(dict.fromkeys(("global_batch_size", "input_dim", "output_dim", "accumulation_steps", *OWN_SIZES)))
# How a hidden check differs from the public checks of its kind, in the order the students' check says it.
UNCHECKED, NODES, WORLD_SIZE, OTHER_SIZES, OTHER_SEED = (
    "which no public check runs", "laid out on several nodes", "at a world size no public check uses",
    "at other sizes", "at another seed")


@dataclass
class HiddenGroup:
    """Hidden checks of one part and kind that differ from the public checks in the same ways."""
    part: str                                   # the part id
    kind: str = "step"                          # the kind of check (grader.rubric.KINDS)
    what: list = field(default_factory=list)    # how they differ (UNCHECKED ... OTHER_SEED); [] none
    checks: int = 0                             # how many
    points: float = 0.0                         # of the part's re-run points, together


def kind_said(part: str, kind: str) -> str:
    """What a check of `kind` runs of `part`, for students: "the step", "MegatronMLP alone, ..."."""
    return BY_ID[part].kind_said(kind)


def runs(rubric, part: str) -> list:
    """The checks of `rubric` that run `part`, in order."""
    return [c for c in rubric.checks if part in rubric.parts_at(c)]


def share(rubric, part: str, check) -> float:
    """The part's re-run points at `check`, when passed (see the module docstring)."""
    checks = runs(rubric, part)
    total = sum(c.weight for c in checks) or 1.0
    return rubric.parts[part].rerun * check.weight / total if check in checks else 0.0


def rounded(rubric, value: float) -> float:
    """`value` to the rubric's score_decimals: the one rounding of a score."""
    return round(value, rubric.score_decimals) + 0.0   # + 0.0: never -0.0


def unearned(rubric, part: str, passed: set) -> set:
    """The names of the checks `part` passed (of `passed`) that earn nothing under the one-rank rule:
    one-rank checks of a kind at which no check of more ranks passed."""
    if not (rubric.one_rank_needs_parallel and BY_ID[part].parallel):
        return set()
    checks = {c.name: c for c in runs(rubric, part)}
    proven = {checks[n].kind for n in passed if n in checks and checks[n].world_size > 1}
    return {n for n in passed if n in checks and checks[n].world_size == 1 and checks[n].kind not in proven}


def earned(rubric, part: str, outcomes: list) -> dict:
    """Check name -> (points earned, points possible) of `part`'s outcomes (CheckOutcomes with
    .check and .status): the share of each passed check, but the one-rank checks `unearned` names."""
    checks = {c.name: c for c in runs(rubric, part)}
    passed = {o.check for o in outcomes if str(o.status) == "passed"}
    lost = unearned(rubric, part, passed)
    points = {}
    for o in outcomes:
        most = share(rubric, part, checks[o.check]) if o.check in checks else 0.0
        points[o.check] = (most if o.check in passed and o.check not in lost else 0.0, most)
    return points


def _differences(check, public: list, part: str) -> list:
    """How hidden `check` differs from the public checks of its kind that run `part`."""
    twins = [c for c in public if c.kind == check.kind]
    sizes = [k for k in SIZES if k not in OWN_SIZES or k in BY_ID[part].own_sizes]   # the sizes it reads
    said = [] if twins else [UNCHECKED]
    said += [NODES] if check.nodes > 1 else []
    said += [WORLD_SIZE] if check.world_size not in {c.world_size for c in twins} else []
    said += [OTHER_SIZES] if all(any(getattr(check, k) != getattr(c, k) for k in sizes) for c in twins) else []
    said += [OTHER_SEED] if check.seed not in {c.seed for c in twins} else []
    return said


def hidden_summary(rubric) -> list:
    """[HiddenGroup] of `rubric`'s hidden checks, part by part (see the module docstring)."""
    groups = []
    for part in rubric.part_ids:
        public = [c for c in runs(rubric, part) if not c.hidden]
        mine = {}
        for check in (c for c in runs(rubric, part) if c.hidden):
            what = _differences(check, public, part)
            group = mine.setdefault((check.kind, *what), HiddenGroup(part=part, kind=check.kind, what=what))
            group.checks += 1
            group.points += share(rubric, part, check)
        for group in mine.values():
            group.points = round(group.points, 6)
            groups.append(group)
    return groups
