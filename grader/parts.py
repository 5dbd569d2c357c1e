"""The parts of the assignment: the names every stage of the grader uses for them.

Parts 1-4 are every course's. Part 5, Megatron's MLP block, is optional: a course turns it on by
giving it points in its rubric (`parts: megatron_mlp: {...}`); without them it is neither run nor
shown, and the student release carries no trace of it (grader.instructor.release).

A part is `parallel` when its work is communication (Parts 3-5): at one rank it needs none, so a
one-rank check shows its math and nothing of its parallel work (grader.worth says what such a
check is worth). A parallel part names the collectives its algorithm calls on every rank at each
kind of check, with the values each moves (`moves`: grader.verdict.comm holds the ranks' calls to
them at every check of more than one rank). Each part names the sizes it splits (`splits`): the
rubric refuses a check that runs the part where one does not divide (grader.feasible).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Moves:
    """A collective a parallel part's algorithm calls on every rank at one kind of check, and what
    it moves: per rank, the product of the check's `sizes` ("output_dim/world_size": that size
    shared over the ranks). For an all-gather that is the rank's own shard, what it contributes."""
    kind: str          # the kind of check ("step", "backward")
    collective: str    # "all_reduce" (a sum, or a mean) or "all_gather"
    what: str          # what it carries, for people: "the weight's gradient"
    sizes: tuple       # names of the check's sizes whose product is the values it moves per rank


B, OUT_SHARE, HIDDEN_SHARE = "global_batch_size", "output_dim/world_size", "hidden_dim/world_size"


@dataclass(frozen=True)
class Part:
    id: str            # column name in grades.csv, key in results and the rubric
    title: str         # for people
    log_prefix: str    # the "[Prefix]" of its comparison lines in our log format
    function: str      # the function of assignment4.py that runs it
    scopes: tuple      # top-level names of the reference whose solutions make up the part
    kinds: tuple = ("step",)   # the kinds of rubric check that run it (grader.rubric.KINDS)
    optional: bool = False     # run and shown only where the course's rubric gives it points
    splits: tuple = ()         # (size, by, what) of a check this part divides: size must divide by `by`
    parallel: bool = False     # its work is communication: a one-rank check needs none of it
    layer: str = ""            # the class a backward check runs alone (kinds with "backward")
    moves: tuple = ()          # Moves: the collectives a check of several ranks must see it call


PARTS = (
    Part("baseline", "Part 1: single-device baseline", "Baseline", "single_step", ("single_step",)),
    Part("grad_accumulation", "Part 2: gradient accumulation", "GradAccumulation",
         "single_step_with_grad_accumulation", ("single_step_with_grad_accumulation",),
         splits=(("global_batch_size", "accumulation_steps", "the batch into micro-batches"),)),
    Part("data_parallel", "Part 3: data parallel", "DataParallel", "data_parallel_single_step",
         ("data_parallel_single_step",), splits=(("global_batch_size", "world_size", "the batch over the ranks"),),
         parallel=True, moves=(Moves("step", "all_reduce", "the weight's gradient", ("input_dim", "output_dim")),)),
    Part("tensor_parallel", "Part 4: full column-parallel tensor parallel", "FullColumnParallel",
         "full_column_parallel_single_step", ("FullColumnParallelLinear", "full_column_parallel_single_step"),
         kinds=("step", "backward"), splits=(("output_dim", "world_size", "W's columns over the ranks"),),
         parallel=True, layer="FullColumnParallelLinear",
         moves=(Moves("step", "all_gather", "the layer's output columns in GatherParallel", (B, OUT_SHARE)),
                Moves("step", "all_gather", "the updated weight's columns", ("input_dim", OUT_SHARE)),
                Moves("backward", "all_gather", "the layer's output columns in GatherParallel", (B, OUT_SHARE)),
                Moves("backward", "all_reduce", "the gradient of X in BroadcastParallel's backward",
                      (B, "input_dim")))),
    Part("megatron_mlp", "Part 5 (optional): Megatron's MLP block", "MegatronMLP", "megatron_mlp_single_step",
         ("ReduceParallel", "ColumnParallelLinear", "RowParallelLinear", "MegatronMLP",
          "megatron_mlp_single_step"), kinds=("step", "backward"), optional=True,
         splits=(("hidden_dim", "world_size", "the hidden width over the ranks"),), parallel=True,
         layer="MegatronMLP",
         moves=(Moves("step", "all_reduce", "the partial outputs in g's forward", (B, "input_dim")),
                Moves("step", "all_gather", "W1's updated columns", ("input_dim", HIDDEN_SHARE)),
                Moves("step", "all_gather", "W2's updated rows", (HIDDEN_SHARE, "input_dim")),
                Moves("backward", "all_reduce", "the partial outputs in g's forward", (B, "input_dim")),
                Moves("backward", "all_reduce", "the gradient of X in BroadcastParallel's backward",
                      (B, "input_dim")))),
)
PART_IDS = tuple(p.id for p in PARTS)
CORE_PART_IDS = tuple(p.id for p in PARTS if not p.optional)   # every course's parts
OPTIONAL_PART_IDS = tuple(p.id for p in PARTS if p.optional)
PARALLEL_PART_IDS = tuple(p.id for p in PARTS if p.parallel)   # whose work is communication
BY_ID = {p.id: p for p in PARTS}
