# Shared by the sbatch job and the local runner, so that both write the same log header.
# Source it; it defines functions only.

# a4_python ARGS...
# The job's python: inside the container named by A4_EXEC (e.g. "apptainer exec --nv a4.sif")
# when it is set, from PATH otherwise.
a4_python() {
  # shellcheck disable=SC2086
  ${A4_EXEC:-} python "$@"
}

# a4_job_header ID NODES NNODES NPROC_PER_NODE BACKEND
# Prints the "[Job]" lines that open every run's .log; the grader reads them.
a4_job_header() {
  local id=$1 nodes=$2 nnodes=$3 nproc=$4 backend=$5 versions
  versions=$(a4_python - <<'PY' 2>/dev/null || echo "torch=unavailable nccl=unavailable"
import torch
nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "none"
print(f"torch={torch.__version__} nccl={nccl}")
PY
)
  echo "[Job] id=${id} name=${A4_JOB_NAME:-assignment4} started=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "[Job] nodes=${nodes} nnodes=${nnodes} nproc_per_node=${nproc} world_size=$((nnodes * nproc)) backend=${backend}"
  echo "[Job] ${versions} python=$(a4_python -c 'import platform; print(platform.python_version())')"
}

# a4_job_footer STATUS
# The last line of every run's .log; a log without it belongs to a run that was killed.
a4_job_footer() {
  echo "[Job] finished status=$1 at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
}
