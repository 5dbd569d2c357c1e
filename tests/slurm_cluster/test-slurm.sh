#!/usr/bin/env bash
# make test-slurm: start the local test cluster, run the tests marked `slurm`, stop the cluster,
# also when the tests fail or are interrupted. Arguments go to pytest.
#
# Where the cluster cannot start at all (not root, no apt-get), the tests run anyway and skip,
# each saying why (with A4_REQUIRE_SLURM=1, as in CI, this fails instead); where it starts and
# then fails, this fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
python=${PYTHON:-.venv/bin/python}

errors=$(mktemp)
cleanup() {
  if [ "${started:-0}" -eq 1 ]; then tests/slurm_cluster/stop-local-cluster.sh || true; fi
  rm -f "$errors"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rc=0
started=1   # from here on, whatever start leaves behind is stopped on exit
tests/slurm_cluster/start-local-cluster.sh 2>"$errors" || rc=$?
cat "$errors" >&2
if [ "$rc" -eq 3 ] && [ "${A4_REQUIRE_SLURM:-}" = 1 ]; then
  echo "test-slurm: A4_REQUIRE_SLURM=1, and the local cluster cannot start here (above)" >&2
  exit 1
elif [ "$rc" -eq 3 ]; then
  started=0
  A4_SLURM_SKIP_REASON=$(grep -m1 'cannot start' "$errors" | sed 's/^start-local-cluster: //')
  export A4_SLURM_SKIP_REASON
elif [ "$rc" -ne 0 ]; then
  echo "test-slurm: the local cluster did not start (status $rc)" >&2
  exit "$rc"
fi

"$python" -m pytest -m slurm "$@"
