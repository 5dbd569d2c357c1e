"""What a wrong weight looks like: each usual mistake's weight, computed and compared in turn.

The mistakes of every step are here (a wrong shape, no step, the sign, a sum for a mean); each
part's own are its record's (grader.parts: `fixed`, `factors`, `mistakes`), computed in its module.
Each mistake's weight is computed on the data every rank was handed (compare.Expected's views:
in Part 3 a rank holds the real rows of its own slice only, in Part 4 the real targets of its own
columns only), so a mistake that uses data a rank does not own is told by its weight.

`diagnose` returns one sentence that states what the weight is (the transpose, one rank's shard,
the step of one micro-batch, an update k times the reference's) and, where the weight leaves no
doubt, the line of code that makes it. Numbers go through grader.verdict.say, so a hidden
check's values are never said. `passed` are the checks this part already passed: a number that
was right there and is wrong here (a 4 written where world_size belongs) is told apart from a
mistake that would have failed there too.
"""

import torch

from grader.names import listed
from grader.parts import BY_ID
from grader.parts.common import close
from grader.verdict.say import Say


def _shape(got, want, say) -> str:
    shown = "" if say.hidden else f" {list(got.shape)},"
    if got.shape == want.T.shape:
        return f"wrong shape:{shown} the transpose of [input_dim, output_dim]"
    if got.dim() == 2 and got.shape[0] == want.shape[0] and want.shape[1] % max(got.shape[1], 1) == 0:
        return (f"wrong shape:{shown} one rank's shard of the columns; the full weight [input_dim, output_dim] "
                f"must be gathered from every rank")
    return f"wrong shape:{shown} expected [input_dim, output_dim]" + ("" if say.hidden else f" = {list(want.shape)}")


def _fixed_number(k, part, check, say, passed):
    """An update k times the reference's that a number written into the code explains."""
    if not BY_ID[part].fixed:
        return None
    key, what = BY_ID[part].fixed
    here = getattr(check, key)
    for p in passed:
        c = getattr(p, key)
        if c > 1 and c != here and abs(k - here / c) <= 1e-3 * max(1.0, here / c):
            # The checks passed so far with that number, as examples: later checks may pass too
            # (the list under the message says which), so the sentence never says "only there".
            alike = [q for q in passed if getattr(q, key) == c]
            public = [f"'{q.name}'" for q in alike if not q.hidden]
            hidden = len(alike) - len(public)
            shown = f"{c}" if public else "a fixed number"
            where = public + ([f"{hidden} hidden check{'s' if hidden > 1 else ''}"] if hidden else [])
            where[0] = (f"check{'s' if len(public) > 1 else ''} " if public else "") + where[0]
            here_is = "" if say.hidden else f" ({here} at this check)"
            return (f"{what} was divided by {shown} written into the code, not by {key}{here_is}; "
                    f"it is right where {key} is {c if public else 'that number'}, as at {listed(where)}")
    return None


def _factor(k, part, check, say, passed) -> str:
    fixed = _fixed_number(k, part, check, say, passed)
    if fixed:
        return fixed
    b, o = check.global_batch_size, check.output_dim
    known = [(-1.0, "the step has the wrong sign: the weight moved up the gradient"),
             (float(b * o), "the loss is a sum, not a mean (reduction='sum'): the update is B*O times too large"),
             (float(o), "the loss is summed over the outputs: the update is output_dim times too large"),
             (float(b), "the loss is summed over the batch: the update is batch-size times too large")]
    known += BY_ID[part].factors(check, say)
    for factor, message in known:
        if abs(k - factor) <= 1e-3 * max(1.0, abs(factor)):
            return message
    if abs(k - 1.0) < NEARLY:   # its length right to a few parts in a thousand: rounded, not scaled
        return ("the update is the reference's but for rounding past the tolerance (values made in lower "
                "precision on the way: a gradient cast to float16 or bfloat16 for its collective, say)")
    if say.hidden:
        return "the update points the right way but is the wrong length (a constant factor off the reference's)"
    return f"the update points the right way but is {k:.4g} times the reference's"


NEARLY = 5e-3


def diagnose(got, exp, part: str, check, rank: int, tol, say: Say = None, passed=(), weights=None) -> str:
    """What `got` (rank `rank`'s weight; `weights`: every rank's) looks like next to the reference
    (`exp`): one sentence, or a plain difference."""
    say = say or Say(check)
    want = exp.w1
    if got.shape != want.shape:
        return _shape(got, want, say)
    if not torch.isfinite(got).all():
        return "the weight contains NaN or inf"
    if close(got, exp.w0, tol):
        return "the weight did not change: no optimizer step was taken (or the gradient was zero)"
    update, ref = got - exp.w0, want - exp.w0
    k = float((update * ref).sum() / (ref * ref).sum())
    # The residual is measured against the update itself: against the reference's, a large k (B*O
    # at a big batch) would scale the reference's float32 rounding past the threshold.
    if float((update - k * ref).norm() / update.norm().clamp_min(1e-30)) < 1e-3:
        return _factor(k, part, check, say, passed)
    found = BY_ID[part].mistakes(got, exp, check, rank, tol, say, weights, passed)   # the part's own
    if found:
        return found
    if say.hidden:
        return "differs from the reference by more than the tolerance"
    diff = (got - want).abs()
    return f"differs from the reference by up to {diff.max():.3e} (mean {diff.mean():.3e})"
