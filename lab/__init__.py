"""The lecture's lab: its collective demos, a bandwidth benchmark, data, tensor and pipeline
parallelism on a deep MLP with their backward passes, and a tiny GPT in tensor, loss and sequence
parallel. Each file runs on its own (lab/README.md):

    torchrun --standalone --nproc-per-node 4 lab/run_all.py     # all of it, in one world
    torchrun --standalone --nproc-per-node 4 lab/collectives.py # one part; `python lab/<file>.py`: one rank

Import directions: every file imports `lab.common` and the kit's `assignment_4/utils.py`; the three
parallel MLPs import `lab.mlp` (their single-process ground truth); the transformer's files import
`lab.gpt` (its single-process ground truth), `lab.mappings` (the regions), `lab.vocab_parallel` and
`lab.gpt_parallel` in that order, `lab.transformer` runs them; `lab.run_all` imports them all
(those a students' copy holds: its release leaves out the files that answer the assignment).
Nothing here imports `grader/` or `slurm/` but the kit's plotting module (`grader/plots.py`, shared
with the grader's batch report, shipped with the student release), and nothing in the kit imports `lab/`.
"""
