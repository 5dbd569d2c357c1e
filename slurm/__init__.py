"""The Slurm side of the kit: cluster profiles and the submitit launcher (`python -m slurm.submit`).

The shell side lives next to it: assignment4.sbatch (and its CPU variant), common.sh (the log
header every run writes), and run-local.sh.
Everything in this folder ships to students as it is.
"""
