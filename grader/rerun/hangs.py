"""Who waited for whom when a part hung or its ranks fell out of step, from each rank's collectives.

A rank that returned from a part sent its collectives with its result; a rank that did not left its
progress record (grader.rerun.rank.hooks: a JSON line before each collective). `hang_detail` lines
them up: which ranks returned, which waited in which collective, what the others called instead.
At a hidden check no size, no rank number and no count past 3 is said.
"""

import json

from grader.rerun.rank.collectives import COLLECTIVES
from grader.rerun.wire.hidden import Words
from grader.rerun.wire.protocol import WorldReport

REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")


def collective(call) -> dict:
    """A collective as a rank recorded it, held to the names and numbers a collective can have."""
    if not isinstance(call, dict):
        return None
    numel = call.get("numel")
    reduce_op = call.get("reduce_op")
    kept = {"op": call.get("op") if call.get("op") in COLLECTIVES else "other",
            "numel": numel if isinstance(numel, int) and not isinstance(numel, bool) and 0 <= numel < 1 << 40 else 0,
            "reduce_op": reduce_op if reduce_op in REDUCE_OPS else None}
    if call.get("raised") is True:   # the rank's call failed inside the collective (grader.rerun.rank.hooks)
        kept["raised"] = True
    return kept


def progress_calls(text: str, part: str) -> list:
    """The collectives a rank's progress record (grader.rerun.rank.hooks) lists for `part`, in order."""
    calls = []
    for line in (text or "").splitlines()[-1000:]:
        try:
            record = json.loads(line[:400])
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("part") == part and record.get("n") == len(calls) + 1:
            calls.append(collective(record))
    return calls


def _ordinal(n: int, words: Words) -> str:
    """"collective #2 of the part"; at a hidden check, a count past 3 is not said (it can be a hidden value)."""
    if words.hidden and n > 3:
        return "a later collective of the part (past the third)"
    return f"collective #{n} of the part"


def _what(call: dict, words: Words) -> str:
    """"all_reduce of 2048 elements"; the op alone at a hidden check (a size is a hidden value)."""
    return call["op"] if words.hidden else f"{call['op']} of {call['numel']} elements"


def hang_detail(calls: dict, returned: set, words: Words) -> str:
    """Who waited for whom, from each rank's collectives in the part (`calls`: rank -> list, in
    order; `returned`: the ranks that returned from the part): "rank 1 returned from the part
    without calling a collective; ranks 0, 2 and 3 waited in collective #1 of the part (all_reduce
    of 2048 elements), while rank 1 never called it"; ranks that did the same are named together
    ("ranks 1, 2 and 3 never called it"). Rank numbers, counts past 3 and sizes are not
    said at a hidden check. "" when no rank waited in a collective."""
    size = len(calls)
    waiting = {r: c for r, c in calls.items() if r not in returned and c}
    if not waiting:
        return ""
    n = min(len(c) for c in waiting.values())   # the earliest collective a rank is stuck in
    stuck = waiting[min(r for r, c in waiting.items() if len(c) == n)][n - 1]
    same = sorted(r for r, c in calls.items() if r not in returned and len(c) == n and c[n - 1] == stuck)
    said = []
    done = sorted(returned)
    if done:
        counts = sorted({len(calls[r]) for r in done})
        after = "" if words.hidden or len(counts) > 1 else " without calling a collective" if not counts[0] else \
            f" after {counts[0]} collective{'s' if counts[0] != 1 else ''}"
        said.append(f"{words.ranks(done, size)} returned from the part{after}")
    said.append(f"{words.ranks(same, size)} waited in {_ordinal(n, words)} ({_what(stuck, words)})")
    others = {}   # what the other ranks did -> those ranks: said once, for all of them
    for rank in sorted(set(calls) - set(same)):
        mine = calls[rank]
        if len(mine) >= n and mine[n - 1] != stuck:
            did = f"called {_what(mine[n - 1], words)} there instead"
        elif len(mine) < n and rank in returned:
            did = "never called it"
        elif len(mine) < n and mine:
            did = f"waited in an earlier one ({_what(mine[-1], words)})"
        elif not mine and rank not in returned:
            did = "called no collective at all in the part (still computing: a loop that does not end?)"
        else:
            continue
        others.setdefault(did, []).append(rank)
    others = [f"{words.ranks(ranks, 0, 'other ranks')} {did}" for did, ranks in others.items()]
    if others:
        said[-1] += ", while " + "; ".join(others)
    return "; ".join(said) + " (a rank that skips, adds or reorders a collective makes the others wait)"


def part_calls(part: str, ranks: dict, report: WorldReport) -> dict:
    """rank -> its collectives in `part`: from its result where it reported one, else from its progress record."""
    size = max([*ranks, *report.exit_codes, *report.progress, -1]) + 1
    return {r: ranks[r].comm if r in ranks else progress_calls(report.progress.get(r, ""), part)
            for r in range(size)}
