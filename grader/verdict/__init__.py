"""The verdicts on a re-run, judged in the grader's own process, each part at each kind of check
as its record names (judging): the weights against the closed form (compare) and what a wrong one
means (diagnose), the tensor-parallel layer's gradients (backward), the optional Part 5's block
(megatron), a check's numbers as a student may see them (say), and the points (score)."""
