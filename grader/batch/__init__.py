"""Grade a batch of hand-ins: on this machine, or as a Slurm job array; the gradebook."""

# The job array's shape: the defaults of grader.batch.array.grade_on_slurm and of `grade --executor slurm`.
ARRAY_PARALLELISM = 16   # tasks running at once
CHUNK = 10               # hand-ins per task
