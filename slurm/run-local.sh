#!/usr/bin/env bash
# Run the assignment on this machine the way the Slurm job runs it on the cluster, and leave the
# same two files: <name>-<id>.log (stdout) and <name>-<id>.err (stderr).
#
#   slurm/run-local.sh                                   # assignment_4/assignment4.py on 4 ranks
#   slurm/run-local.sh --nproc 2 --out runs path/to/assignment4.py
#
# Runs on the CPU with gloo unless every rank has a GPU. Exits with torchrun's exit status.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
nproc=4
out=.
script=assignment_4/assignment4.py
while [ $# -gt 0 ]; do
  case $1 in
    --nproc) nproc=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run-local.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
    *) script=$1; shift ;;
  esac
done
[ -f "$script" ] || { echo "run-local.sh: no such script: $script" >&2; exit 2; }
command -v torchrun >/dev/null || { echo "run-local.sh: torchrun not found; activate the environment you installed requirements.txt into (source .venv/bin/activate)" >&2; exit 2; }

# shellcheck source=slurm/common.sh
source "$here/common.sh"
name=${A4_JOB_NAME:-assignment4}
id=local-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
log="$out/$name-$id.log"
err="$out/$name-$id.err"

backend=gloo
if python -c "import sys, torch; sys.exit(0 if torch.cuda.device_count() >= $nproc else 1)" 2>/dev/null \
   && [ "${A4_BACKEND:-}" != gloo ]; then
  backend=nccl
fi

# How long a collective waits for a rank that skipped it before the run fails (utils.py's default).
export A4_TIMEOUT_S=${A4_TIMEOUT_S:-60}

status=0
{
  a4_job_header "$id" "$(hostname -s)" 1 "$nproc" "$backend"
  torchrun --standalone --nnodes=1 --nproc_per_node="$nproc" "$script" 2>"$err" || status=$?
  a4_job_footer "$status"
} >"$log"

echo "log: $log"
echo "err: $err"
grep -E '^\[[A-Za-z]+\]\[Rank [0-9]+\] (Tensors match|Not implemented)' "$log" || true
[ "$status" -eq 0 ] || echo "run-local.sh: torchrun exited with status $status; see $err" >&2
exit "$status"
