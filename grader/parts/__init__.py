"""The parts of the assignment: one module per part, each holding everything the grader knows of it.

Parts 1-4 are every course's. Part 5, Megatron's MLP block, Part 6, the vocabulary split over the
ranks, and Part 7, a transformer block on Part 5's layers, are optional: a course turns one on by
giving it points in its rubric (`parts: megatron_mlp: {...}`); without them it is neither run nor
shown, and the student release carries no trace of it (grader.instructor.release).

A part is a `Part` record, made in its own module of this package (grader/parts/baseline.py ...)
and registered below, in the order of the handout (Part 1 first). The record holds the part's
metadata (its id, title, function, log prefix), and its behaviour as data and hooks that every
room calls without ever asking which part it holds:

    rank side (grader.rerun)   how its data is drawn at each kind of check (`layouts`, a layout of
                               grader.rerun.wire.secret), what its function is called with (`arguments`),
                               what a rank runs and sends back at each kind (`runs`), how large a
                               tensor it may return (`room`, `should`: grader.rerun.wire.bounds)
    verdict (grader.verdict)   how each kind is judged (`judging`: a grader.verdict.judging.Judging
                               by name, since the verdict's code is not the ranks' to import), its
                               usual mistakes (`fixed`, `factors`, `mistakes`, `run_mistake`)
    the rest                   the rubric's sizes only it reads (`own_sizes`), the words of invented
                               log prefixes that name it (`aliases`), how the handout's run logs it
                               (`handout_log`), what of it the lecture's lab answers (`lab`)

A part is `parallel` when its work is communication (Parts 3-5): at one rank it needs none, so a
one-rank check shows its math and nothing of its parallel work (grader.worth says what such a
check is worth). A parallel part names the collectives its algorithm calls on every rank at each
kind of check, with the values each moves (`moves`: grader.verdict.comm holds the ranks' calls to
them at every check of more than one rank), and, where it can say it, what each carries from each
rank (`carried`: grader.verdict.carried finds it in what the ranks handed those calls). Each part names the sizes it splits (`splits`): the
rubric refuses a check that runs the part where one does not divide (grader.feasible), and the
parts whose code it builds on (`needs`): the rubric refuses it on where one of those is off.

The kinds of check are listed once, in `KINDS`: a check's kind travels to the ranks by its name
(the job's check mapping, `kind`). This package is shared: it imports no room and no torch at its
top (a hook that needs torch imports it when called: hooks run in a rank or in the verdict).
"""

from dataclasses import dataclass, field
from typing import Callable

STEP, BACKWARD = "step", "backward"


@dataclass(frozen=True)
class Kind:
    """A kind of rubric check: what a check of it runs of each part."""
    name: str          # a check's `kind` in the rubric and in the job its ranks run
    runs: str          # what it runs of a part, for students ("{layer}": the part's layer)
    label: str         # what a public check's label adds ("" for the step)


KIND_LIST = (Kind(STEP, "the step", ""),
             Kind(BACKWARD, "{layer} alone, forward and backward", ", the layer's backward"))
KINDS = tuple(k.name for k in KIND_LIST)
KIND_BY_NAME = {k.name: k for k in KIND_LIST}


def kind_of(check: dict) -> str:
    """The kind of a job's check mapping (the one the ranks are handed)."""
    return check.get("kind", STEP)


@dataclass(frozen=True)
class Moves:
    """A collective a parallel part's algorithm calls on every rank at one kind of check, and what
    it moves: per rank, the product of the check's `sizes` ("output_dim/world_size": that size
    shared over the ranks). For an all-gather that is the rank's own shard, what it contributes; for
    a reduce-scatter the rank's own share of the sum, what it receives."""
    kind: str          # the kind of check (KINDS)
    collective: str    # "all_reduce" (a sum, or a mean), "all_gather" or "reduce_scatter" (a sum)
    what: str          # what it carries, for people: "the weight's gradient"
    sizes: tuple       # names of the check's sizes whose product is the values it moves per rank


B, OUT_SHARE, HIDDEN_SHARE = "global_batch_size", "output_dim/world_size", "hidden_dim/world_size"


def move_values(move: Moves, size: Callable) -> int:
    """The values `move` moves per rank, `size(name)` giving the check's size of each name."""
    total = 1
    for name in move.sizes:
        whole, _, shared = name.partition("/")
        total *= size(whole) // size(shared) if shared else size(whole)
    return total


# In a scaled world's targets (grader.verdict.carried.targets, grader.rerun.rank.collectives.scale_placed):
# a call whose every returned value is scaled (an all-gather's or a reduce-scatter's that carried a move).
WHOLE_CALL = "whole"


def sent_budget(part_id: str, check: dict, world_size: int) -> dict:
    """How many of the values a rank hands its moving collectives in one part are read
    (grader.rerun.rank.hooks, for grader.verdict.carried), at a check mapping of a world of
    `world_size` ranks: for each collective the part's moves call at the check's kind
    ("all_reduce", "all_gather", "reduce_scatter"), twice what they send (a reduce-scatter sends p
    shares of what it moves) and a margin; a part's one all-reduced move up to MICRO_BATCHES times.
    None ({}) at one rank, or for a part that says nothing it carries."""
    part, kind, p = BY_ID[part_id], kind_of(check), world_size
    if p <= 1 or not part.carried.get(kind):
        return {}
    sizes = lambda name: p if name == "world_size" else int(check.get(name) or 0)   # noqa: E731 - a lookup
    sent = {}
    moves = [m for m in part.moves if m.kind == kind]
    for m in moves:
        sent[m.collective] = sent.get(m.collective, 0) + move_values(m, sizes) * (p if m.collective == "reduce_scatter" else 1)
    budget = {collective: 2 * values + SENT_MARGIN for collective, values in sent.items()}
    if [m.collective for m in moves] == ["all_reduce"]:   # a gradient, perhaps reduced micro-batch by micro-batch
        budget["all_reduce"] = max(budget["all_reduce"], min(SENT_MAX, MICRO_BATCHES * sent["all_reduce"] + SENT_MARGIN))
    return budget


def sent_stride(part_id: str, check: dict, world_size: int) -> int:
    """Every how many of the values read (sent_budget) the rank keeps one: 1 where they fit SENT_MAX,
    else the fewest that keeps them under it (a transformer block's step moves hundreds of
    thousands of values a rank; every tenth of them still pins what each move carried)."""
    return max(1, -(-sum(sent_budget(part_id, check, world_size).values()) // SENT_MAX))


SENT_MAX, SENT_MARGIN = 1 << 16, 4096
# A part's one all-reduced move is read whole in up to this many calls (a gradient all-reduced
# micro-batch by micro-batch), within SENT_MAX: the sum of the calls of its size is then its sum.
MICRO_BATCHES = 16
# How the handout's run logs a part unprefixed on rank 0 (`handout_log`): the initial and the updated
# weight compared (they must differ), or the updated weight against the expected one.
CHANGED, MATCHES = "changed", "matches"


def _none(*_args, **_kwargs):
    return None


def _nothing(*_args, **_kwargs) -> list:
    return []


@dataclass(frozen=True, eq=False)
class Part:
    id: str            # column name in grades.csv, key in results and the rubric
    title: str         # for people
    log_prefix: str    # the "[Prefix]" of its comparison lines in our log format
    function: str      # the function of assignment4.py that runs it
    scopes: tuple      # top-level names of the reference whose solutions make up the part
    layouts: dict      # kind -> how its data is drawn (grader.rerun.wire.secret: WHOLE, ROWS, COLUMNS ...)
    runs: dict         # kind -> the rank's run: (module, call, check, data) -> {name: tensor}, its answer
                       # first (`call` calls the part's function with its arguments); grader.parts.common
    judging: dict      # kind -> "module:NAME": the Judging NAME of a module of grader.verdict (judging)
    room: Callable     # (check mapping, kind) -> the most values one tensor it returns holds
    should: Callable   # (check mapping, kind, hidden) -> what it should return, said in a refusal
    kinds: tuple = (STEP,)     # the kinds of rubric check that run it (KINDS)
    optional: bool = False     # run and shown only where the course's rubric gives it points
    splits: tuple = ()         # (size, by, what) of a check this part divides: size must divide by `by`
    needs: tuple = ()          # ids of the parts whose code it builds on: on only with them (grader.feasible)
    parallel: bool = False     # its work is communication: a one-rank check needs none of it
    layer: str = ""            # the class a check of a kind other than the step runs alone
    moves: tuple = ()          # Moves: the collectives a check of several ranks must see it call
    carried: dict = field(default_factory=dict)   # kind -> (exp, check, rank) -> what each of its moves of that
                               # kind carries from rank `rank`, in their order (exp: its Judging's expected): a
                               # tensor each, a tuple of its right forms (any one), a list of what each of its
                               # calls carries (one per block: every one), or None (not said); grader.verdict.carried
    at_most: tuple = ()        # collectives it must not call beyond what its `moves` say (none, where they
                               # say none): a check of several ranks fails a rank that moved more with them
    arguments: tuple = ()      # keys of the check its function is called with by name (beside seed, device)
    own_sizes: tuple = ()      # keys of a check only this part reads (left out where it is off)
    fixed: tuple = ()          # (key, what): `what` divided by a number written into the code, not by
                               # the check's `key`, is told apart (grader.verdict.diagnose)
    factors: Callable = _nothing    # (check, say) -> [(k, sentence)]: an update k times the reference's
    mistakes: Callable = _none      # (got, exp, check, rank, tol, say, weights, passed) -> a sentence or None
    run_mistake: Callable = _none   # (run, failing, say) -> a sentence or None: seen in every rank's weights
    aliases: tuple = ()        # words of an invented "[Prefix]" that name it (evidence.logtext)
    alias_rank: int = 0        # aliases are tried lowest rank first (a prefix with two parts' words)
    handout_log: str = ""      # CHANGED or MATCHES: the handout's run logs it unprefixed on rank 0; "" prefixed
    lab: dict = field(default_factory=dict)   # lab file -> what of this part's TODOs it shows

    def kind_said(self, kind: str) -> str:
        """What a check of `kind` runs of this part, for students: "the step", "MegatronMLP alone, ..."."""
        return KIND_BY_NAME[kind].runs.format(layer=self.layer)


HOOKS = ("layouts", "runs", "judging")   # per kind: every kind a part runs needs each


def register(*modules) -> tuple:
    """The parts of `modules` (each a module of this package with its PART), in the handout's order,
    each checked whole: a hook for every kind it runs, no id twice."""
    parts = tuple(m.PART for m in modules)
    for part in parts:
        for hook in HOOKS:
            missing = set(part.kinds) - set(getattr(part, hook))
            assert not missing, f"{part.id}: no {hook} for the kinds {sorted(missing)}"
        assert set(part.kinds) <= set(KINDS), f"{part.id}: kinds {part.kinds}, known {KINDS}"
        known = {p.id for p in parts[:parts.index(part)]}
        assert set(part.needs) <= known, f"{part.id}: needs {part.needs}, registered before it {sorted(known)}"
    assert len({p.id for p in parts}) == len(parts), "a part id registered twice"
    return parts


from grader.parts import (baseline, data_parallel, grad_accumulation, megatron_mlp,  # noqa: E402 - they use Part
                          sequence_parallel, tensor_parallel, transformer_block,
                          vocab_parallel)

PARTS = register(baseline, grad_accumulation, data_parallel, tensor_parallel, megatron_mlp, vocab_parallel,
                 transformer_block, sequence_parallel)
PART_IDS = tuple(p.id for p in PARTS)
CORE_PART_IDS = tuple(p.id for p in PARTS if not p.optional)   # every course's parts
OPTIONAL_PART_IDS = tuple(p.id for p in PARTS if p.optional)
PARALLEL_PART_IDS = tuple(p.id for p in PARTS if p.parallel)   # whose work is communication
BY_ID = {p.id: p for p in PARTS}
OWN_SIZES = tuple(dict.fromkeys(s for p in PARTS for s in p.own_sizes))   # keys some part alone reads


def number(part_id: str) -> int:
    """The part's number in the handout ("Part 5")."""
    return 1 + PART_IDS.index(part_id)
