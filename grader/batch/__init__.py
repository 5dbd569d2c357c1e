"""Grade a batch of hand-ins: on this machine, or as a Slurm job array; its grades.csv, summary.md and staff report."""
