"""Judge a parallel part's communication: right values and the collectives that make them right.

A parallel part's ranks must reach their values by the part's own algorithm, not only reach them:
ranks that leave each other their data by any other way (a file, a socket) and each compute the
whole step alone get the right weight with no collective at all. So at a check of p > 1 ranks, a
part that passed on its values passes only if every rank called the collectives its algorithm
calls (grader.parts: each part's `moves`) with at least the values the algorithm moves, per rank:

    all-reduce   the sum of the tensors' sizes of the rank's summing all_reduce calls (SUM, AVG,
                 PREMUL_SUM); one call of a flattened buffer or one per parameter alike
    all-gather   the sum of the shards the rank contributed: all_gather(list, shard),
                 all_gather_into_tensor(out, shard) and all_gather_object(list, obj) (the tensors
                 obj holds) are recorded as p * shard + shard values
    reduce-scatter  the sum of the shares of the sum the rank received: reduce_scatter(share, list)
                 and reduce_scatter_tensor(share, whole) are recorded as share + p * share values

A part may also cap a collective (its `at_most`): a rank that moved more with it than the moves
say fails too (sequence parallelism all-reduces its LayerNorms' gradients, and nothing else: an
all-reduce of the activations in place of its reduce-scatter gives the right values).

Totals, never exact counts: a barrier, a broadcast of the initial weight or a gradient reduced in
several pieces pass. A one-rank check needs no collective (it has no one to talk to).

Calls of the right sizes are not yet the exchange: ranks that swap their data some other way (the
process group's store, a socket) can call them on zeros for show. So the values must also come from
them. Once a part passed a check of several ranks of a kind (a step, a layer's backward), it runs
there once more in a world whose ranks change what each of its moving collectives returns, each
result multiplied by a factor of 1.25 to 2 as it returns (grader.rerun.rank.collectives: SCALES);
where the part's all-reduced moves were placed in the calls of the run it passed, only those values
(grader.verdict.carried.targets: data carried beside a move in one call, or a probe of known
values, comes back as it was). Values
that the collectives carried come out wrong there; values that still come out right did not come
from them (`independent`), and the part fails at that check and every later check of several ranks
of that kind. The test runs at the first such check of each kind and again at every hidden one (the
public check's seed and sizes are the students': code can do the parallel work there alone). A
scaled world that the code does not run through (a crash, a timeout) shows nothing: the part's right
values do not count at that check (`unshown`), and the next check of the kind tries again
(docs/grading.md).

Volumes and a scaled world do not say what the calls carried (the batch all-reduced in Part 3 moves
more than the gradient, and the values do come from it): grader.verdict.carried does, where a part
says what its moves carry.

The calls are the rank's own word (grader.rerun.rank.hooks records and scales them inside the rank's
process, where the hand-in's code also runs): they can fail a part that skipped its collectives,
called them on tensors too small to carry the data or only for show, but a hand-in that forges the
recorder, or tells a scaled world from another, can make them say anything. Nothing here passes a
part whose values are wrong.
"""

import itertools
import math
from dataclasses import dataclass

from grader.parts import BY_ID
from grader.parts.common import COLUMNS, ROWS, WHOLE
from grader.results import Status
from grader.verdict.say import Say

SUMMING = (None, "SUM", "AVG", "PREMUL_SUM")   # None: all_reduce's default, a sum
GATHERS = ("all_gather", "all_gather_into_tensor", "_all_gather_base", "all_gather_single", "all_gather_object")
SCATTERS = ("reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter_single")
SAID = {"all_reduce": ("an all-reduce", "all-reduce", "all-reduced"),   # (a noun, the verb, its participle)
        "all_gather": ("an all-gather", "all-gather", "all-gathered"),
        "reduce_scatter": ("a reduce-scatter", "reduce-scatter", "reduce-scattered")}


@dataclass
class Shortfall:
    """One rank's collective of a part that moved fewer values than the algorithm moves (or more,
    where the part caps it: `at_most`)."""
    collective: str    # "all_reduce", "all_gather" or "reduce_scatter"
    calls: int         # the rank's calls of that collective in the part
    moved: int         # the values they moved, in all
    needed: int        # the values the algorithm moves


def size(check, name: str) -> int:
    """A size of `check` by its name in grader.parts.Moves ("output_dim/world_size": shared)."""
    whole, _, shared = name.partition("/")
    value = getattr(check, whole)
    return value // getattr(check, shared) if shared else value


def needed(part_id: str, check) -> dict:
    """collective -> the values a rank's calls of it must move in all at `check` (none at one rank)."""
    if check.world_size <= 1:
        return {}
    needs = {}
    for move in BY_ID[part_id].moves:
        if move.kind == check.kind:
            volume = math.prod(size(check, name) for name in move.sizes)
            needs[move.collective] = needs.get(move.collective, 0) + volume
    return needs


def moved(calls: list, collective: str, world_size: int) -> tuple:
    """(calls of `collective`, values they moved) among a rank's recorded `calls`."""
    if collective == "all_reduce":
        mine = [c for c in calls if c.get("op") == "all_reduce" and c.get("reduce_op") in SUMMING]
        return len(mine), sum(c.get("numel", 0) for c in mine)
    mine = [c for c in calls if c.get("op") in (GATHERS if collective == "all_gather" else SCATTERS)]
    return len(mine), sum(c.get("numel", 0) for c in mine) // (world_size + 1)


def shortfalls(part_id: str, check, ranks: dict) -> dict:
    """collective -> {rank: Shortfall} for each collective of the part some rank fell short of (or
    went beyond, where the part caps it), in the order of the part's moves."""
    short, capped = {}, BY_ID[part_id].at_most
    needs = needed(part_id, check)
    if check.world_size > 1:
        needs.update({c: needs.get(c, 0) for c in capped})
    for collective, volume in needs.items():
        for rank, run in sorted(ranks.items()):
            calls, values = moved(run.comm, collective, check.world_size)
            if values < volume or (collective in capped and values > volume):
                short.setdefault(collective, {})[rank] = Shortfall(collective, calls, values, volume)
    return short


def _volume(move, check, say: Say) -> str:
    """"64 x 32 = 2048 values per rank"; at a hidden check the sizes' names only."""
    if say.hidden:
        return " x ".join(move.sizes) + " values per rank"
    values = [size(check, name) for name in move.sizes]
    return " x ".join(map(str, values)) + f" = {math.prod(values)} values per rank"


def _clause(part, check, short: dict, total: int, say: Say) -> str:
    """What the ranks in `short` (rank -> Shortfall, of one collective) did, and what the part must
    move with it: "rank 2 called no all-reduce: Part 3 must all-reduce the weight's gradient (64 x 32
    = 2048 values per rank)"."""
    first = short[min(short)]
    alike = sorted(r for r, s in short.items() if s == first)   # said once for the ranks alike
    noun, verb, done = SAID[first.collective]
    if first.moved > first.needed:
        return _beyond(part, check, first, say.ranks(alike, total), say)
    if not first.calls:
        said = "no rank called " + noun if len(alike) == total else f"{say.ranks(alike, total)} called no {verb}"
    elif say.hidden:
        said = f"{say.ranks(alike, total)} {done} too few values"
    else:
        said = f"{say.ranks(alike, total)} {done} only {first.moved} value{'s' if first.moved != 1 else ''} in all"
    moves = [m for m in part.moves if m.kind == check.kind and m.collective == first.collective]
    what = [f"{m.what} ({_volume(m, check, say)})" for m in moves]
    missing = _missing(moves, check, first.needed - first.moved) if first.calls else []
    lacking = "; what is missing is as much as " + ", or as ".join(
        " and ".join(m.what for m in subset) for subset in missing) + " moves" if missing else ""
    return f"{said}: {part.title.split(':')[0].split(' (')[0]} must {verb} {' and '.join(what)} across the ranks{lacking}"


def _missing(moves: list, check, short: int) -> list:
    """The sets of `moves` (at most three, the smallest) whose values add up to exactly `short`
    (what a rank moved too few): the moves its calls most likely left out; [] where none do."""
    volumes = [math.prod(size(check, name) for name in m.sizes) for m in moves]
    found = [subset for n in range(1, len(moves)) for subset in itertools.combinations(range(len(moves)), n)
             if sum(volumes[i] for i in subset) == short]
    return [[moves[i] for i in subset] for subset in found[:3]]


def _beyond(part, check, over: Shortfall, ranks: str, say: Say) -> str:
    """What ranks that moved more than the part allows with a capped collective did: "ranks 0-3
    all-reduced 384 values in all, where Part 8 must all-reduce only ..."."""
    noun, verb, done = SAID[over.collective]
    what = [f"{m.what} ({_volume(m, check, say)})" for m in part.moves
            if m.kind == check.kind and m.collective == over.collective]
    said = f"{ranks} {done} too many values" if say.hidden else f"{ranks} {done} {over.moved} values in all"
    name = part.title.split(':')[0].split(' (')[0]
    allowed = f"only {' and '.join(what)}" if what else f"nothing: it calls no {verb}"
    return f"{said}, where {name} must {verb} {allowed} (the part's other collectives in place of {noun})"


def explain(part_id: str, check, short: dict, total: int, say: Say) -> str:
    """Every collective the ranks fell short of (`short`, shortfalls'), one clause each, and why it counts."""
    part = BY_ID[part_id]
    clauses = [_clause(part, check, ranks, total, say) for ranks in short.values()]
    return "; ".join(clauses) + " (the part's points come with its algorithm's collectives, not with right values alone)"


def short_name(part_id: str) -> str:
    """A part as a failure names it: "Part 3", "Part 5"."""
    return BY_ID[part_id].title.split(':')[0].split(' (')[0]


def failed_for(outcome, text: str, ranks: list):
    """`outcome` (a CheckOutcome whose values were right) failed on its part's communication:
    `text` says why, `ranks` which ranks."""
    outcome.status, outcome.comm_ok, outcome.comm_message = Status.FAILED, False, text
    outcome.diagnosis, outcome.failing_ranks = text, ranks
    outcome.message = f"{outcome.message}, but {text}"
    return outcome


def hold(outcome, run, part_id: str, check, say: Say = None):
    """`outcome` (a CheckOutcome) failed where its values are right but a rank of `run` (the
    PartRun) did not call the part's collectives with the values they move; else as it was."""
    if outcome.status != Status.PASSED or not BY_ID[part_id].moves:
        return outcome
    say = say or Say(check)
    short = shortfalls(part_id, check, run.ranks)
    if not short:
        return outcome
    text = explain(part_id, check, short, len(run.ranks), say)
    return failed_for(outcome, text, sorted({r for ranks in short.values() for r in ranks}))


def independent(outcome, part_id: str, check, say: Say = None, shown_at: str = "", move: int = None):
    """`outcome` (a CheckOutcome whose values were right) failed: at a world whose collectives'
    results were scaled, the part's values came out right all the same. `shown_at`: where that was
    shown, when not at `check` itself (a later check of the same kind fails for it too); `move`:
    the index, among the part's moves at the check's kind, of the one move changed there alone."""
    say = say or Say(check)
    part = BY_ID[part_id]
    moves = [m for m in part.moves if m.kind == check.kind]
    name = short_name(part_id)
    where = f" at {shown_at}" if shown_at else ""
    if move is None:
        verbs = sorted({SAID[m.collective][1] for m in moves})
        changed = f"what its {' and '.join(v + 's' for v in verbs)} returned was changed (what carried the part's moves"
        own = "from those collectives"
    else:
        changed = (f"what its {SAID[moves[move].collective][1]}s returned for {moves[move].what} was changed "
                   f"(those values alone")
        own = f"from that {SAID[moves[move].collective][1]}, though they handed it {moves[move].what}"
    text = (f"{name}'s values came out right{where} even when {changed} multiplied by 1.25 to 2): its ranks did "
            f"not get their values {own} (right values without the part's collectives earn nothing)")
    return failed_for(outcome, text, list(range(check.world_size)))


def unshown(outcome, part_id: str, check, say: Say = None, why: str = ""):
    """`outcome` (a CheckOutcome whose values were right) failed: the world that scales what its
    collectives return did not run to the end (`why`: what it ended with), so nothing showed that its
    values came from them; the next check of the kind tries again."""
    text = (f"{short_name(part_id)} did not run to the end in a world that multiplied what its collectives "
            f"returned by 1.25 to 2 ({why or 'it stopped'}): right values count only where that world shows they "
            f"came from the collectives, and code that works checks neither their results nor the world it runs in")
    return failed_for(outcome, text, list(range(check.world_size)))


HANDED = ("broadcast", "scatter")   # one rank's tensors sent to the others


def handed_out(outcome, run, part_id: str, check, say: Say):
    """`outcome` (a CheckOutcome whose values are wrong), where a rank of `run` broadcast or scattered
    in a part that hands each rank its own share of the initial weights (Parts 5 to 8: every layout
    but Parts 3's and 4's steps, whose diagnoses name it), with why that gives wrong values."""
    own = BY_ID[part_id].layouts.get(check.kind) not in (WHOLE, ROWS, COLUMNS)
    if outcome.status != Status.FAILED or not outcome.comm_ok or check.world_size <= 1 or not own:
        return outcome
    sent = [c for r in run.ranks.values() for c in r.comm if c.get("op") in HANDED and c.get("numel", 0)]
    if sent:
        outcome.message += ("; its ranks broadcast (or scattered) tensors in the part: a re-run hands each rank its own "
                            "shards of the weights and data, real only where they are the rank's own, so one rank's copy "
                            "sent to the others gives them values that are not theirs; make them on every rank, as the "
                            "skeleton does")
    return outcome
