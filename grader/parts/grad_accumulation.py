"""Part 2, gradient accumulation: the step of Part 1 taken over `accumulation_steps` micro-batches.

Its data is Part 1's (WHOLE); its function is also called with `accumulation_steps`. Its usual
mistakes, each told by the weight it makes (grader.verdict.diagnose calls them):

    the micro-batch losses not divided by the number of them (or divided twice): a factor
    a number written where accumulation_steps belongs: right only where they agree (`fixed`)
    every step on the same micro-batch; a gradient replaced, not added; the loop left early
"""

from grader.parts import MATCHES, STEP, Part
from grader.parts.common import WHOLE, close, one_weight, weight_room, weight_should


def factors(check, say) -> list:
    """Updates k times the reference's that a mistake of the micro-batches explains."""
    steps = check.accumulation_steps
    if steps <= 1:
        return []
    return [(float(steps), f"the micro-batch losses were not divided by {say.eq(steps, 'accumulation_steps')}: "
                           f"the update is {say.num(steps, 'accumulation_steps')} times too large"),
            (1.0 / steps, f"the loss was divided by {say.eq(steps, 'accumulation_steps')} once too often")]


def mistakes(got, exp, check, rank, tol, say, weights, passed):
    """The micro-batch that every step used, or the gradient that replaced the others."""
    steps = check.accumulation_steps
    if steps <= 1:
        return None
    micro = check.global_batch_size // steps
    rows = [slice(i * micro, (i + 1) * micro) for i in range(steps)]
    for i in (0, steps - 1) + tuple(range(1, steps - 1)):
        if close(got, exp.step(rows[i]), tol):
            which = "first" if i == 0 else "last" if i == steps - 1 else "same"
            return (f"every accumulation step used the {which} micro-batch: the rows taken do not move with "
                    f"the loop index (micro-batch i starts at row i * micro_batch_size)")
    if close(got, exp.step(rows[-1], 1.0 / steps), tol):
        return ("only the last micro-batch's gradient made it into the step: each backward() replaced the "
                "gradient instead of adding to it (zero_grad() inside the loop?)")
    if close(got, exp.step(rows[0], 1.0 / steps), tol):
        return ("only the first micro-batch's gradient made it into the step: the later micro-batches "
                "never reached backward() (a break or return inside the loop?)")
    return None


PART = Part(
    "grad_accumulation", "Part 2: gradient accumulation", "GradAccumulation",
    "single_step_with_grad_accumulation", ("single_step_with_grad_accumulation",),
    layouts={STEP: WHOLE}, runs={STEP: one_weight}, judging={STEP: "grader.verdict.compare:STEP_JUDGING"},
    room=weight_room, should=weight_should,
    splits=(("global_batch_size", "accumulation_steps", "the batch into micro-batches"),),
    arguments=("accumulation_steps",), fixed=("accumulation_steps", "each micro-batch loss"),
    factors=factors, mistakes=mistakes, aliases=("accum", "micro"), alias_rank=0, handout_log=MATCHES,
    lab={"lab/pipeline_parallel.py": "each micro-batch's loss divided by the number of micro-batches "
                                     "before backward()"})
