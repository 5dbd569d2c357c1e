"""The Slurm side of the kit: cluster profiles and the submitit launcher (`python -m slurm.submit`).

The shell side lives next to it: assignment4.sbatch (and its CPU variant), common.sh (the log
header every run writes), and run-local.sh. The local
test cluster the Slurm tests run on is tests/slurm_cluster/, beside the other test assets.
"""
