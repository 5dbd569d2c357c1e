"""Judge what a parallel part's collectives carried: the values its algorithm moves, not only as many.

grader.verdict.comm holds every rank to the volume its part's algorithm moves with each collective,
and a scaled world to values that came from them. Neither says what the collectives carried: ranks
that all-reduce their slices of the batch (every rank then holds the whole batch and takes the
single-device step), or all-gather their targets' columns in place of the layer's output, move at
least the algorithm's volume, and their values do come from those calls. So where a part says what
each of its moves carries from each rank (its `carried`, grader.parts), the values that rank handed
its calls of that collective must hold it. They are recorded inside the rank before each call, up
to a budget (grader.parts.sent_budget): an all-reduce's tensors, an all-gather's shard, a
reduce-scatter's input. With e what the move carries from rank r (flattened), and v the values the
rank handed its calls of the move's collective, in call order and end to end:

    some run v[k : k + n] = c e, c != 0       within RTOL of c e (in norm)

found by normalized cross-correlation (an FFT over v), then checked. Any nonzero factor c: a
gradient of a summed or a mean loss, divided by the world size before or after the call, alike; e
as it is or transposed (a layer on nn.Linear holds [out, in]); or e the sum of 2 to MICRO_BATCHES calls
of one size, each holding its share at one place (a gradient all-reduced micro-batch by micro-batch,
with its loss or not), or e interleaved value by value with up to
INTERLEAVED - 1 other moves in one call (a softmax's sums and target logits fused as
`torch.stack((sums, logits), dim=-1)`: e is then a run of every q-th value). Where a move has several right forms (a sum of
exponentials shifted by each token's maximum or not, a target's logit less it or not, a slice of
the sequence batch-first or sequence-first), the part lists them and any one carried is enough; a
move made once per block lists what each of those calls carries, and every one must be found.
Where what the part's moves send is more than grader.parts.SENT_MAX values a rank (a transformer's
step), the rank keeps every s-th value it hands them, counted end to end (grader.parts.sent_stride),
and e is sought as every s-th of its values from each of its first s: the report stays small, and a
few thousand values still pin what a move carried (the sum of calls is then not tried).

The record is the rank's own word, as its counts are (grader.verdict.comm): a forged one can say
anything. It fails a part whose collectives carried something else; it never passes one.
"""

import dataclasses
import itertools

import torch

from grader.parts import BY_ID, MICRO_BATCHES, WHOLE_CALL, sent_budget, sent_stride
from grader.results import Status
from grader.verdict.comm import GATHERS, SAID, SCATTERS, SUMMING, failed_for, short_name
from grader.verdict.say import Say

CANDIDATES = 64   # runs of a move looked at in one record (every copy of it a rank handed, to a scaled world)
RTOL = 1e-3   # float32 on the rank's side, float64 here, sums in other orders: far below any other content
INTERLEAVED = 4   # moves fused in one call, value by value, that a move is still found among
FAMILIES = ("all_gather", "all_reduce", "reduce_scatter")   # the kinds of collective a scaled world changes


def _of(call: dict, collective: str) -> bool:
    """Whether a recorded call is one of `collective`'s (as grader.verdict.comm counts them)."""
    if collective == "all_reduce":
        return call.get("op") == "all_reduce" and call.get("reduce_op") in SUMMING
    return call.get("op") in (GATHERS if collective == "all_gather" else SCATTERS)


def _proportional(v: torch.Tensor, e: torch.Tensor):
    """The starts k of the runs v[k : k + n] that are nonzero multiples of `e` (both flat, float64):
    a list, empty where `e` is all zeros (nothing to find); None where there is none."""
    n, total = e.numel(), v.numel()
    ee = float(e @ e)
    if n == 0 or ee == 0.0:
        return [] if total >= n else None   # nothing to find: nothing a collective must carry
    if total < n:
        return None
    size = 1 << (total + n - 1).bit_length()
    corr = torch.fft.irfft(torch.fft.rfft(v, size) * torch.fft.rfft(e.flip(0), size), size)[n - 1:total]
    squares = torch.cat([v.new_zeros(1), torch.cumsum(v * v, 0)])
    # A run of zeros (a lookup's rows of tokens held elsewhere) has no energy but the rounding of the
    # sums and of the FFT, both of the whole's size: held at least at that, its score is none, not the largest
    energy = (squares[n:] - squares[:-n]).clamp_min(1e-12 * float(squares[-1]) + 1e-300)
    score = corr * corr / (energy * ee)
    found = []
    # The best few by score, each checked; then more copies while they check out. (The score's
    # energy is a difference of running sums, inexact where the run is small beside the rest: it
    # ranks the candidates, the check itself decides.)
    for i, k in enumerate(torch.topk(score, min(CANDIDATES, score.numel())).indices.tolist()):
        c = float(corr[k]) / ee
        if c != 0.0 and float(torch.linalg.vector_norm(v[k:k + n] - c * e)) <= RTOL * abs(c) * ee ** 0.5:
            found.append(k)
        elif i >= 2:
            break
    return found or None


class Summand(tuple):
    """A run (start, count, step) that is one of the calls whose sum is a move: each is needed."""


def _found(sent: list, want, stride: int = 1, every: bool = False, fused: bool = False):
    """Where the values a rank handed its calls (`sent`, flat tensors in call order, every
    `stride`-th of what it handed) carry `want` (see `holds`): runs (start, count, step) of those
    values end to end, [] where `want` asks for nothing, None where it was not carried. `every`:
    each of a move's right forms that was carried, not only the first; `fused`: a vector sought
    every q-th value too (moves fused value by value in one call), not only as a run."""
    if isinstance(want, (list, tuple)):
        found = []
        for w in want:
            found.append(_found(sent, w, stride, every, fused))
            if isinstance(want, tuple) and found[-1] is not None and not every:
                break   # a tuple: any one form is enough
        kept = [f for f in found if f is not None]
        if len(kept) < len(found) if isinstance(want, list) else not kept:
            return None   # a list: every one must be carried
        return [run for f in kept for run in f]
    if not sent:
        return None
    whole = torch.cat(sent)
    # Fused value by value with others, a vector is a run of every q-th value; sampled every
    # stride-th, the two are not told apart, so only an unsampled record is de-interleaved
    strands = [(0, 1)] + ([(first, q) for q in range(2, INTERLEAVED + 1) for first in range(q)]
                          if fused and want.dim() <= 1 else [])
    for e in (want, want.T) if want.dim() == 2 else (want,):
        flat = e.reshape(-1).to(torch.float64)
        for (first, q), offset in itertools.product(strands, range(min(stride, flat.numel()))):
            sought = flat[offset::stride]
            starts = _proportional(whole[first::q], sought)
            if starts is not None:
                return [(first + q * k, sought.numel(), q) for k in starts]
        summed = None if fused or stride != 1 else _summed(sent, flat)
        if summed:
            return summed
    return None


def _summed(sent: list, flat):
    """Where `flat` is the sum of several calls alike (2 to MICRO_BATCHES of them, of one size, each
    handing its share of the move at one place in it, beside what else it carries: a micro-batch's
    gradient, with its loss or not): a Summand run in each; None where no calls sum to it."""
    ends = list(itertools.accumulate(s.numel() for s in sent))
    by_size = {}
    for end, s in zip(ends, sent):
        if s.numel() >= flat.numel():
            by_size.setdefault(s.numel(), []).append((end - s.numel(), s))
    for alike in (calls for calls in by_size.values() if 1 < len(calls) <= MICRO_BATCHES):
        starts = _proportional(torch.stack([s for _, s in alike]).sum(0), flat)
        if starts is not None:
            return [Summand((start + starts[0], flat.numel(), 1)) for start, _ in alike]
    return None


def _carried(sent: list, want, stride: int = 1, every: bool = False):
    """_found; then, where that found nothing in an unsampled record, with vectors sought fused
    too (only code that fails pays for the search)."""
    found = _found(sent, want, stride, every)
    if found is None and stride == 1:
        found = _found(sent, want, stride, every, fused=True)
    return found


def holds(sent: list, want, stride: int = 1) -> bool:
    """Whether the values a rank handed its calls (`sent`, flat tensors in call order, every
    `stride`-th of what it handed) carry `want`: a tensor; a tuple of tensors, the move's right forms
    (any one of them carried is enough); or a list, what it carries at each of its calls (one per
    block: every one of them carried). Kept every `stride`-th, a run of `want` at an unknown place
    is every stride-th of its values, from one of `stride` first ones: each is tried."""
    return _carried(sent, want, stride) is not None


def uncarried(part_id: str, check, run, exp) -> list:
    """[(move, ranks)]: each move of the part at `check` that some ranks' calls did not carry."""
    part, p = BY_ID[part_id], check.world_size
    say_carried = part.carried.get(check.kind)
    mapping = dataclasses.asdict(check)
    if say_carried is None or p <= 1 or not sent_budget(part_id, mapping, p):
        return []
    stride = sent_stride(part_id, mapping, p)
    moves = [m for m in part.moves if m.kind == check.kind]
    missing = {}
    for rank, r in sorted(run.ranks.items()):
        for move, want in zip(moves, say_carried(exp, check, rank)):
            sent = [s for c, s in zip(r.comm, r.sent) if s is not None and _of(c, move.collective)]
            if want is not None and not holds(sent, want, stride):
                missing.setdefault(move, []).append(rank)
    return list(missing.items())


def _placed(into: dict, indexed: list, start: int, count: int, step: int) -> None:
    """Add to `into` (call index -> [[start, stop, step]]) where the run of `count` values every
    `step`-th from `start`, in the values of `indexed` ([(call index, its values)]) end to end, lies."""
    last, at = start + step * (count - 1), 0
    for index, values in indexed:
        low, high, at = at, at + values.numel(), at + values.numel()
        first = start + max(0, -(-(low - start) // step)) * step   # the run's first value at or past `low`
        if first < high and first <= last:
            into.setdefault(str(index), []).append([first - low, min(high - 1, last) - low + 1, step])


def targets(part_id: str, check, run, exp, only: int = None, summand: int = None):
    """Where each rank's calls carried the part's moves at `check`, for a world that multiplies only
    those values (grader.rerun.rank.hooks): {"families": the kinds of collective scaled only where
    they carried a move, "calls": {rank: {call index: [[start, stop, step], ...]}}}: an all-reduce's
    runs in the values the rank handed that call, end to end; every value of an all-gather's or a
    reduce-scatter's call that carried one (its result is laid out otherwise than what was handed).
    A rank whose calls carry its data beside its all-reduced move, or in calls that carry no move,
    then keeps it right. `only`: the index of one move, among the part's moves at the check's kind,
    to place alone (the others' calls are left as they are); `summand`: of a move found as the sum
    of several calls (micro-batches), the index of the one call to place. With "summands": the most
    calls a rank's move was the sum of (0: none). None where some move was not placed (a record
    sampled every s-th value, or none): every call is then scaled whole."""
    part, p = BY_ID[part_id], check.world_size
    say_carried = part.carried.get(check.kind)
    mapping = dataclasses.asdict(check)
    if say_carried is None or p <= 1 or not sent_budget(part_id, mapping, p) or sent_stride(part_id, mapping, p) != 1:
        return None
    moves = [m for m in part.moves if m.kind == check.kind]
    placed, summands = {}, 0
    for rank, r in sorted(run.ranks.items()):
        mine = placed.setdefault(str(rank), {})
        for j, (move, want) in enumerate(zip(moves, say_carried(exp, check, rank))):
            if only is not None and j != only:
                continue
            indexed = [(i, s) for i, (c, s) in enumerate(zip(r.comm, r.sent)) if s is not None and _of(c, move.collective)]
            found = None if want is None else _carried([s for _, s in indexed], want, every=True)
            if found is None:
                return None
            added = [run for run in found if isinstance(run, Summand)]
            summands = max(summands, len(added))
            if summand is not None and added:
                found = added[summand:summand + 1]
            into = mine if move.collective == "all_reduce" else {}
            for start, count, step in found:
                _placed(into, indexed, start, count, step)
            mine.update({index: WHOLE_CALL for index in into if into is not mine})
    return {"families": list(FAMILIES), "calls": placed, "summands": summands}


def move_targets(part_id: str, check, run, exp) -> list:
    """[(j, targets() of the part's j-th move at `check` alone)], for each move a rank handed (one
    of zeros changes nothing); a move found as the sum of several calls, once for each of them
    alone (data posing as one of them is then left as it was where another is changed); [] where
    some move was not placed (then one world scales every call whole)."""
    count = sum(m.kind == check.kind for m in BY_ID[part_id].moves)
    each = []
    for j in range(count):
        alone = targets(part_id, check, run, exp, only=j)
        if alone is None:
            return []
        summands = alone.pop("summands")
        each += [(j, alone)] if summands < 2 else \
            [(j, targets(part_id, check, run, exp, only=j, summand=i)) for i in range(summands)]
    for _, t in each:
        t.pop("summands", None)
    return [(j, t) for j, t in each if any(t["calls"].values())]


def hold(outcome, run, part_id: str, check, exp, say: Say = None):
    """`outcome` (a CheckOutcome), failed where its values were right but some move of the part was
    not carried by the collective that moves it."""
    if outcome.status != Status.PASSED or exp is None:
        return outcome
    missing = uncarried(part_id, check, run, exp)
    if not missing:
        return outcome
    say = say or Say(check)
    name = short_name(part_id)
    clauses = []
    for move, ranks in missing:
        _, verb, done = SAID[move.collective]
        clauses.append(f"{say.ranks(ranks, check.world_size)} {done} other values than {move.what}")
    verbs = " and ".join(dict.fromkeys(f"{SAID[m.collective][1]} {m.what}" for m, _ in missing))
    text = (f"{'; '.join(clauses)}: {name} must {verbs}, and values made right by collectives that carried "
            f"something else (the batch, the targets, the weights as handed) are not its algorithm and earn nothing")
    return failed_for(outcome, text, sorted({r for _, ranks in missing for r in ranks}))
