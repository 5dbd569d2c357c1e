"""The four parts of the assignment: the names every stage of the grader uses for them."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    id: str            # column name in grades.csv, key in results and the rubric
    title: str         # for people
    log_prefix: str    # the "[Prefix]" of its comparison lines in our log format
    function: str      # the function of assignment4.py that runs it
    scopes: tuple      # top-level names of the reference whose solutions make up the part


PARTS = (
    Part("baseline", "Part 1: single-device baseline", "Baseline", "single_step", ("single_step",)),
    Part("grad_accumulation", "Part 2: gradient accumulation", "GradAccumulation",
         "single_step_with_grad_accumulation", ("single_step_with_grad_accumulation",)),
    Part("data_parallel", "Part 3: data parallel", "DataParallel", "data_parallel_single_step",
         ("data_parallel_single_step",)),
    Part("tensor_parallel", "Part 4: full column-parallel tensor parallel", "FullColumnParallel",
         "full_column_parallel_single_step", ("FullColumnParallelLinear", "full_column_parallel_single_step")),
)
PART_IDS = tuple(p.id for p in PARTS)
BY_ID = {p.id: p for p in PARTS}
