#!/usr/bin/env bash
# Start a real Slurm cluster of 4 emulated nodes on this machine, for the Slurm tests.
#
#   sudo tests/slurm_cluster/start-local-cluster.sh     # idempotent: a running cluster is left as it is
#   sudo tests/slurm_cluster/stop-local-cluster.sh      # stops and removes everything this script made
#
# Debian (or Ubuntu) and root only. Installs Debian's packages when they are missing (slurmctld,
# slurmd, slurm-client, slurmdbd, munge, mariadb-server), then starts, each by hand and with its
# own files under $A4_SLURM_STATE: munged, MariaDB, slurmdbd (job accounting: without it sacct,
# and so submitit, never learns that a job was cancelled or timed out), slurmctld and one slurmd
# per node (node1..node4, all on 127.0.0.1, each in its own UTS namespace so that `hostname`
# inside a job prints the node's name). Partition `debug` holds the 4 nodes; account `a4course`
# exists for the submitting user.
#
# Outside $A4_SLURM_STATE it writes only /etc/slurm/{slurm,slurmdbd,gres}.conf (refusing to
# replace files it did not write) and a marked block in /etc/hosts; the stop script removes both.
#
# Exit status: 0 running, 1 failed (the log of the daemon that failed is printed),
# 3 cannot run here (not root, no apt-get, a foreign Slurm configuration): tests then skip.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/slurm_cluster/cluster.env
source "$here/cluster.env"

say() { echo "start-local-cluster: $*"; }
cannot() { echo "start-local-cluster: cannot start a local Slurm here: $*" >&2; exit 3; }
die() { echo "start-local-cluster: $*" >&2; exit 1; }
# A failed start leaves its daemons and logs for a look; the stop script removes them.
trap 'rc=$?; [ $rc -eq 1 ] && echo "start-local-cluster: failed; logs in $A4_SLURM_STATE/log, clean up with tests/slurm_cluster/stop-local-cluster.sh" >&2; exit $rc' EXIT

[ "$(id -u)" -eq 0 ] || cannot "it needs root (to install packages, run the daemons, edit /etc/hosts)"
command -v apt-get >/dev/null || cannot "it needs apt-get (Debian or Ubuntu)"
unshare --uts true 2>/dev/null \
  || cannot "it needs unshare --uts (util-linux, CAP_SYS_ADMIN) to give each emulated node its hostname"

# --- packages -------------------------------------------------------------------------------
# faketime: an array task on a node whose clock is off (tests/test_slurm.py)
packages=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server faketime)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  apt_log=$(mktemp)
  # Keep the packages' own services from starting (they would hold the default ports and
  # sockets); ours start below. A policy-rc.d already in place is left as it is.
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# %s: only while it installs packages\nexit 101\n' "$A4_SLURM_MARK" >"$policy"
    chmod 0755 "$policy"
  fi
  install_packages() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$apt_log" 2>&1
  }
  ok=1
  install_packages || { DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$apt_log" 2>&1; install_packages; } || ok=0
  if grep -qs "$A4_SLURM_MARK" "$policy"; then rm -f "$policy"; fi
  [ $ok -eq 1 ] || { tail -n 20 "$apt_log" >&2; rm -f "$apt_log"; cannot "apt-get install ${missing[*]} failed"; }
  rm -f "$apt_log"
fi

# --- already running? -----------------------------------------------------------------------
ours() { [ -f "$1" ] && grep -q "$A4_SLURM_MARK" "$1"; }
if ours "$SLURM_CONF_FILE" && a4_cluster_up; then
  say "already running ($A4_SLURM_NODES nodes up); stop it with tests/slurm_cluster/stop-local-cluster.sh"
  exit 0
fi
for f in "$SLURM_CONF_FILE" "$SLURMDBD_CONF_FILE" "$GRES_CONF_FILE"; do
  if [ -e "$f" ] && ! ours "$f"; then
    cannot "$f exists and was not written by this script (is this a real cluster?); not replacing it"
  fi
done
# Leftovers of a half-started or killed cluster: stop them first, then start from nothing.
if [ -d "$A4_SLURM_STATE" ] || ours "$SLURM_CONF_FILE"; then
  say "cleaning up what a previous start left"
  "$here/stop-local-cluster.sh" >/dev/null
fi

state=$A4_SLURM_STATE
# Each daemon writes under a folder its own user owns; MariaDB keeps its pid and log in its datadir.
mkdir -p "$state"/{run,log,ctld,spool,munge,mysql,dev}
chmod 0755 "$state" "$state/run" "$state/log"
chown slurm:slurm "$state/run" "$state/log" "$state/ctld" "$state/spool"
chown munge:munge "$state/munge"
chown mysql:mysql "$state/mysql"
# munged wants a world-searchable socket folder, and a private key it owns.
chmod 0755 "$state/munge"

# --- configuration --------------------------------------------------------------------------
ctld_host=$(hostname -s)
# Every node declares this host's memory: a grading array task asks for what a world may use at the
# rubric's limits (grader.limits.slurm_task), as on a real cluster's node. Memory is not a consumable
# resource here (CR_Core), so the nodes' shares of one host are not counted against each other.
real_mb=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 - 512 ))
nodes=""
for i in $(seq 1 "$A4_SLURM_NODES"); do
  nodes+="NodeName=node$i NodeAddr=127.0.0.1 Port=$((A4_SLURMD_PORT_BASE + i)) CPUs=$A4_SLURM_CPUS"
  nodes+=" RealMemory=$real_mb Gres=gpu:$A4_SLURM_FAKE_GPUS State=UNKNOWN"$'\n'
done

mkdir -p "$(dirname "$SLURM_CONF_FILE")"
cat >"$SLURM_CONF_FILE" <<EOF
# $A4_SLURM_MARK: the a4 local test cluster; stop-local-cluster.sh removes this file.
ClusterName=$A4_SLURM_CLUSTER
SlurmctldHost=$ctld_host(127.0.0.1)
SlurmctldPort=$A4_SLURMCTLD_PORT
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$state/munge/munge.socket
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool/%n
SlurmctldPidFile=$state/run/slurmctld.pid
SlurmdPidFile=$state/run/slurmd-%n.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd-%n.log
# No cgroups here: track processes by parentage, and bind no cores (the nodes advertise more
# CPUs than the machine has, which config_overrides allows).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=600
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$A4_SLURMDBD_PORT
# With a munge socket other than the default, slurmctld reaches slurmdbd through this one.
AccountingStoragePass=$state/munge/munge.socket
# Count-only GPUs: lets the GPU job script's --gpus-per-node be scheduled here (torch stays on CPU).
GresTypes=gpu
${nodes}PartitionName=debug Nodes=node[1-$A4_SLURM_NODES] Default=YES MaxTime=60 State=UP
EOF

cat >"$GRES_CONF_FILE" <<EOF
# $A4_SLURM_MARK: the a4 local test cluster; stop-local-cluster.sh removes this file.
NodeName=node[1-$A4_SLURM_NODES] Name=gpu File=$state/dev/nvidia[0-$((A4_SLURM_FAKE_GPUS - 1))]
EOF
# Stand-ins for device files: Slurm only numbers them (CUDA_VISIBLE_DEVICES=0,1); torch stays on CPU.
for g in $(seq 0 $((A4_SLURM_FAKE_GPUS - 1))); do : >"$state/dev/nvidia$g"; done

cat >"$SLURMDBD_CONF_FILE" <<EOF
# $A4_SLURM_MARK: the a4 local test cluster; stop-local-cluster.sh removes this file.
AuthType=auth/munge
AuthInfo=socket=$state/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$A4_SLURMDBD_PORT
SlurmUser=slurm
PidFile=$state/run/slurmdbd.pid
LogFile=$state/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$A4_MARIADB_PORT
StorageUser=slurm
StoragePass=$A4_MARIADB_PASS
StorageLoc=a4_slurm_acct_db
EOF
# slurmdbd refuses a configuration (it holds a password) that others can read.
chown slurm:slurm "$SLURMDBD_CONF_FILE"
chmod 0600 "$SLURMDBD_CONF_FILE"

# Node names resolve to this machine, inside a marked block that stop-local-cluster.sh removes.
# /etc/hosts is often a bind mount: rewrite it in place, never replace the file.
hosts_block=$(printf '%s\n127.0.0.1 %s\n%s\n' "$A4_HOSTS_BEGIN" \
  "$(seq -f 'node%g' -s ' ' 1 "$A4_SLURM_NODES")" "$A4_HOSTS_END")
a4_hosts_remove_block
printf '%s\n' "$hosts_block" >>/etc/hosts

# --- daemons --------------------------------------------------------------------------------
wait_for() {  # wait_for SECONDS LOGFILE WHAT COMMAND...
  local limit=$1 logfile=$2 what=$3; shift 3
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "start-local-cluster: $what did not come up in ${limit}s; the end of $logfile:" >&2
      tail -n 30 "$logfile" >&2 2>/dev/null || true
      exit 1
    fi
    sleep 0.2
  done
}

say "munge"
dd if=/dev/urandom of="$state/munge/munge.key" bs=1024 count=1 status=none
chown munge:munge "$state/munge/munge.key"
chmod 0400 "$state/munge/munge.key"
runuser -u munge -- munged --socket="$state/munge/munge.socket" --key-file="$state/munge/munge.key" \
  --pid-file="$state/munge/munged.pid" --log-file="$state/munge/munged.log" \
  --seed-file="$state/munge/munged.seed" </dev/null
wait_for 20 "$state/munge/munged.log" munged munge -n -S "$state/munge/munge.socket"

say "mariadb"
mariadb-install-db --no-defaults --user=mysql --datadir="$state/mysql" --skip-test-db \
  --auth-root-authentication-method=socket >"$state/log/mariadb-install.log" 2>&1 \
  || { tail -n 30 "$state/log/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
setsid mariadbd --no-defaults --user=mysql --datadir="$state/mysql" \
  --socket="$state/mysql/mysqld.sock" --pid-file="$state/mysql/mariadbd.pid" \
  --bind-address=127.0.0.1 --port="$A4_MARIADB_PORT" --skip-name-resolve \
  --log-error="$state/mysql/mariadbd.log" --innodb-buffer-pool-size=32M </dev/null >/dev/null 2>&1 &
wait_for 60 "$state/mysql/mariadbd.log" mariadbd \
  mariadb-admin --no-defaults --socket="$state/mysql/mysqld.sock" -u root ping
mariadb --no-defaults --socket="$state/mysql/mysqld.sock" -u root <<EOF
CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$A4_MARIADB_PASS';
GRANT ALL ON a4_slurm_acct_db.* TO 'slurm'@'127.0.0.1';
EOF

say "slurmdbd"
slurmdbd </dev/null >>"$state/log/slurmdbd.log" 2>&1
wait_for 60 "$state/log/slurmdbd.log" slurmdbd sacctmgr -n list cluster
sacctmgr -i -Q add cluster "$A4_SLURM_CLUSTER" >/dev/null
sacctmgr -i -Q add account a4course Description="a4 test course" Organization=a4 >/dev/null
for user in root ${SUDO_USER:-}; do
  sacctmgr -i -Q add user "$user" Account=a4course DefaultAccount=a4course >/dev/null
done

say "slurmctld"
slurmctld </dev/null >>"$state/log/slurmctld.log" 2>&1
wait_for 60 "$state/log/slurmctld.log" slurmctld scontrol ping

say "slurmd on node1..node$A4_SLURM_NODES"
for i in $(seq 1 "$A4_SLURM_NODES"); do
  install -d -o slurm -g slurm "$state/spool/node$i"
  # A UTS namespace of its own: jobs on this node see the hostname node$i.
  unshare --uts sh -c 'hostname "$1" && exec slurmd -N "$1"' sh "node$i" \
    </dev/null >>"$state/log/slurmd-node$i.log" 2>&1
done
wait_for 90 "$state/log/slurmctld.log" "$A4_SLURM_NODES idle nodes" a4_cluster_ready
sinfo
say "running; stop it with tests/slurm_cluster/stop-local-cluster.sh"
