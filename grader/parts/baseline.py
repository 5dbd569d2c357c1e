"""Part 1, the single-device baseline: one SGD step of a linear layer on the whole batch.

Every rank runs it alone on the same real data (WHOLE) and returns W [input_dim, output_dim],
judged against the closed form (grader.verdict.compare). Its mistakes are those of every step
(grader.verdict.diagnose: the sign, a sum for a mean, a transposed weight), none of its own. The
handout's run logs it unprefixed on rank 0, comparing the initial weight with the updated one.
"""

from grader.parts import CHANGED, STEP, Part
from grader.parts.common import WHOLE, one_weight, weight_room, weight_should

PART = Part(
    "baseline", "Part 1: single-device baseline", "Baseline", "single_step", ("single_step",),
    layouts={STEP: WHOLE}, runs={STEP: one_weight}, judging={STEP: "grader.verdict.compare:STEP_JUDGING"},
    room=weight_room, should=weight_should,
    aliases=("baseline", "single", "reference"), alias_rank=3, handout_log=CHANGED)
