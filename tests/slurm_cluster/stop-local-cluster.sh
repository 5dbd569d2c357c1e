#!/usr/bin/env bash
# Stop the local test cluster that start-local-cluster.sh started, and remove what it made:
# its jobs, its daemons (each by the pid it recorded), its state folder, the /etc/slurm files it
# wrote and its /etc/hosts block. Installed packages stay. Safe to run when nothing is running.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/slurm_cluster/cluster.env
source "$here/cluster.env"
state=$A4_SLURM_STATE

[ "$(id -u)" -eq 0 ] || { echo "stop-local-cluster: needs root" >&2; exit 1; }
say() { echo "stop-local-cluster: $*"; }
ours() { [ -f "$1" ] && grep -q "$A4_SLURM_MARK" "$1"; }

# Jobs first, so that no job step outlives its slurmd.
if ours "$SLURM_CONF_FILE" && scontrol ping 2>/dev/null | grep -q UP; then
  jobs=$(squeue -h -o %i 2>/dev/null || true)
  if [ -n "$jobs" ]; then
    say "cancelling jobs $(echo $jobs)"
    # shellcheck disable=SC2086
    scancel $jobs 2>/dev/null || true
    deadline=$((SECONDS + 30))
    while [ -n "$(squeue -h -o %i 2>/dev/null)" ] && [ $SECONDS -lt $deadline ]; do sleep 0.5; done
  fi
fi

# Daemons: each pid file names one process; kill it only if it is still the daemon we started
# (a stale pid may belong to something else by now). They take seconds each to stop on SIGTERM,
# so signal them all, then wait.
pids=()
check() {  # check PIDFILE COMM: append the pid when the process is alive and has that name
  local file=$1 comm=$2 pid
  [ -f "$file" ] || return 0
  pid=$(tr -dc '0-9' <"$file")
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$comm" ] || return 0
  pids+=("$pid")
}
for f in "$state"/run/slurmd-*.pid; do check "$f" slurmd; done
check "$state/run/slurmctld.pid" slurmctld
check "$state/run/slurmdbd.pid" slurmdbd
check "$state/mysql/mariadbd.pid" mariadbd
check "$state/munge/munged.pid" munged

if [ ${#pids[@]} -gt 0 ]; then
  say "stopping ${#pids[@]} daemons (pids ${pids[*]})"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  deadline=$((SECONDS + 20))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && { say "pid $pid ignored SIGTERM; killing it"; kill -KILL "$pid" 2>/dev/null || true; }
  done
fi

# Files: only what carries our mark, so that a real cluster's configuration is never touched.
for f in "$SLURM_CONF_FILE" "$SLURMDBD_CONF_FILE" "$GRES_CONF_FILE"; do
  if ours "$f"; then rm -f "$f"; fi
done
a4_hosts_remove_block
rm -rf "$state"
say "stopped"
