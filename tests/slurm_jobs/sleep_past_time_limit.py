"""A run that sleeps far past any time limit the tests give it: Slurm must end it (TIMEOUT)."""
import os
import sys
import time

sys.stdout.write(f"[Rank {os.environ.get('RANK', '0')}] sleeping past the time limit\n")
sys.stdout.flush()
time.sleep(int(os.environ.get("A4_SLEEP_S", "600")))
