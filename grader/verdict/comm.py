"""Judge a parallel part's communication: right values and the collectives that make them right.

A parallel part's ranks must reach their values by the part's own algorithm, not only reach them:
ranks that leave each other their data by any other way (a file, a socket) and each compute the
whole step alone get the right weight with no collective at all. So at a check of p > 1 ranks, a
part that passed on its values passes only if every rank called the collectives its algorithm
calls (grader.parts: each part's `moves`) with at least the values the algorithm moves, per rank:

    all-reduce   the sum of the tensors' sizes of the rank's summing all_reduce calls (SUM, AVG,
                 PREMUL_SUM); one call of a flattened buffer or one per parameter alike
    all-gather   the sum of the shards the rank contributed: all_gather(list, shard) and
                 all_gather_into_tensor(out, shard) are recorded as p * shard + shard values

Totals, never exact counts: a barrier, a broadcast of the initial weight or a gradient reduced in
several pieces pass. A one-rank check needs no collective (it has no one to talk to).

The calls are the rank's own word (grader.rerun.hooks records them inside the rank's process, where
the hand-in's code also runs): they can fail a part that skipped its collectives, or called them on
tensors too small to carry the data, but a hand-in that forges the recorder can make them say
anything. Nothing here passes a part whose values are wrong.
"""

import math
from dataclasses import dataclass

from grader.parts import BY_ID
from grader.results import Status
from grader.verdict.say import Say

SUMMING = (None, "SUM", "AVG", "PREMUL_SUM")   # None: all_reduce's default, a sum
GATHERS = ("all_gather", "all_gather_into_tensor", "_all_gather_base")
SAID = {"all_reduce": ("an all-reduce", "all-reduce", "all-reduced"),   # (a noun, the verb, its participle)
        "all_gather": ("an all-gather", "all-gather", "all-gathered")}


@dataclass
class Shortfall:
    """One rank's collective of a part that moved fewer values than the algorithm moves."""
    collective: str    # "all_reduce" or "all_gather"
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
    mine = [c for c in calls if c.get("op") in GATHERS]
    return len(mine), sum(c.get("numel", 0) for c in mine) // (world_size + 1)


def shortfalls(part_id: str, check, ranks: dict) -> dict:
    """collective -> {rank: Shortfall} for each collective of the part some rank fell short of, in
    the order of the part's moves."""
    short = {}
    for collective, volume in needed(part_id, check).items():
        for rank, run in sorted(ranks.items()):
            calls, values = moved(run.comm, collective, check.world_size)
            if values < volume:
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
    if not first.calls:
        said = "no rank called " + noun if len(alike) == total else f"{say.ranks(alike, total)} called no {verb}"
    elif say.hidden:
        said = f"{say.ranks(alike, total)} {done} too few values"
    else:
        said = f"{say.ranks(alike, total)} {done} only {first.moved} value{'s' if first.moved != 1 else ''} in all"
    what = [f"{m.what} ({_volume(m, check, say)})" for m in part.moves
            if m.kind == check.kind and m.collective == first.collective]
    return f"{said}: {part.title.split(':')[0].split(' (')[0]} must {verb} {' and '.join(what)} across the ranks"


def explain(part_id: str, check, short: dict, total: int, say: Say) -> str:
    """Every collective the ranks fell short of (`short`, shortfalls'), one clause each, and why it counts."""
    part = BY_ID[part_id]
    clauses = [_clause(part, check, ranks, total, say) for ranks in short.values()]
    return "; ".join(clauses) + " (right values without the part's collectives earn nothing)"


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
    outcome.status, outcome.comm_ok, outcome.comm_message = Status.FAILED, False, text
    outcome.diagnosis, outcome.failing_ranks = text, sorted({r for ranks in short.values() for r in ranks})
    outcome.message = f"{outcome.message}, but {text}"
    return outcome
