#!/usr/bin/env bash
# make test-cuda: the kit with torch's CUDA build, the one `pip install torch` takes from PyPI on
# Linux and the one clusters bring, in a venv of its own (.venv-cuda; A4_CUDA_VENV names another):
#   1. the venv, (re)made when the requirements change: requirements.txt and requirements-test.txt
#      held to requirements-cuda.txt's pins, from the default index. This machine's pip
#      configuration (a mirror of CPU wheels, find-links, constraints) is ignored for it, and the
#      torch it gets must say torch.version.cuda, or the lane fails: it never passes on a CPU build;
#   2. the demo with that build: the reference run on 4 ranks as the Slurm job would, `check` (must
#      pass), `package`, and `grade` of the zip (must give full marks);
#   3. the grading, sandbox (as root and as a useradd user), self-check and machines'
#      configurations tests, and the pins of what the CUDA build brings.
# Needs no GPU: re-runs stay on the CPU. The download is about 4.7 GB the first time.
#   tests/cuda/test-cuda.sh --venv-only   step 1 alone: .ci/run makes the venv while other suites run.
set -euo pipefail
case "${1:-}" in
  ""|--venv-only) ;;
  *) echo "usage: tests/cuda/test-cuda.sh [--venv-only] (make test-cuda runs it)" >&2; exit 2 ;;
esac
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
python=${PYTHON:-python3}
venv=${A4_CUDA_VENV:-.venv-cuda}
demo=build/cuda-demo
started=$SECONDS
export PYTHONDONTWRITEBYTECODE=1
unset PYTHONPATH

want=$(cat requirements.txt requirements-test.txt requirements-cuda.txt)
if [ "$want" != "$(cat "$venv/.installed" 2>/dev/null)" ]; then
  echo "== test-cuda: making $venv with torch's CUDA build from the default index (about 4.7 GB)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_NO_INDEX -u PIP_CONSTRAINT \
      PIP_CONFIG_FILE=/dev/null "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      -r requirements.txt -r requirements-test.txt -c requirements-cuda.txt
  echo "$want" > "$venv/.installed"
  echo "== test-cuda: $venv made in $((SECONDS - started)) s"
fi
py=$venv/bin/python
if ! build=$("$py" -c 'import sys, torch; print(torch.__version__, torch.version.cuda); sys.exit(0 if torch.version.cuda else 1)'); then
  echo "test-cuda: $venv's torch ($build) is not torch's CUDA build (torch.version.cuda is not set): the" \
       "install took a CPU wheel; remove $venv and check that no pip configuration points it at CPU wheels" >&2
  exit 1
fi
echo "== test-cuda: torch $build (the CUDA build), $("$py" --version)"
if [ "${1:-}" = --venv-only ]; then
  exit 0
fi

# The demo, then the tests, each whatever the other gave: a failure of one hides nothing of the other.
demo() {
  rm -rf "$demo" && mkdir -p "$demo"
  PATH="$(cd "$venv" && pwd)/bin:$PATH" slurm/run-local.sh --nproc 4 --out "$demo" assignment_4/reference/assignment4.py || return 1
  local log full
  log=$(ls "$demo"/assignment4-*.log)
  "$py" -m grader check assignment_4/reference --log "$log" || { echo "test-cuda: check failed on the reference" >&2; return 1; }
  "$py" -m grader package assignment_4/reference --log "$log" -o "$demo/demo-student.zip" || return 1
  "$py" -m grader grade "$demo/demo-student.zip" --out "$demo/grades" --quiet || return 1
  full=$("$py" -c 'from grader.rubric import load_rubric; print(f"{sum(p.log + p.rerun for p in load_rubric().parts.values()):g}")')
  if ! grep -q "^demo-student,$full," "$demo/grades/grades.csv"; then
    echo "test-cuda: the demo's zip did not get full marks ($full) with the CUDA build:" >&2
    cat "$demo/grades/grades.csv" >&2
    return 1
  fi
  echo "== test-cuda: the demo checks and grades $full/$full with the CUDA build"
}

lane=$SECONDS
failed=()
demo || failed+=("the demo (check, package, grade)")
echo "== test-cuda: the demo took $((SECONDS - lane)) s"
# The sandbox's attacks as root and as an ordinary user with the build's libraries in a venv of
# theirs; a Python in that user's home is a matter of where the Python lies, the same for either
# build, and make test-configs runs it.
"$py" -m pytest -p no:cacheprovider -m "not slurm and not course" -k "not user_home" -n "${TEST_PROCESSES:-2}" \
    --dist loadfile tests/test_grader.py tests/test_sandbox.py tests/test_selfcheck.py tests/test_machines.py \
    "tests/test_install.py::test_every_dependency_is_pinned_at_the_version_installed_here" || failed+=("the tests")
if [ "${#failed[@]}" -gt 0 ]; then
  echo "test-cuda: FAILED with torch's CUDA build: $(IFS=';'; echo "${failed[*]}") ($((SECONDS - lane)) s)" >&2
  exit 1
fi
echo "test-cuda: passed in $((SECONDS - started)) s (the lane itself, without making the venv: $((SECONDS - lane)) s)"
