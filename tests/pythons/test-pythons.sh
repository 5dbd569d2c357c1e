#!/usr/bin/env bash
# make test-pythons: the kit under every Python from 3.10 to 3.13 this machine offers (pyenv's newest
# 3.X, else python3.X on PATH), each in a venv of its own under build/pythons/ with the torch-free
# requirements (requirements.txt without torch, and requirements-test.txt): every module of grader/, slurm/ and lab/ compiled
# and imported (tests/pythons/import_all.py), the torch-free tests run (the modules below, less
# the tests marked torch, and the instructor's changed copies make test-course builds), and a command
# that needs torch refused with a message that says so. Under A4_SUITE_PYTHON (the version make
# test runs under, which the Makefile passes) the torch-free tests are make test's and not run again.
#
# A Python that is not there is said and passed over; with A4_REQUIRE_PYTHONS=1 (CI) it is an error.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
read -r -a versions <<<"${A4_PYTHONS:-3.10 3.11 3.12 3.13}"   # A4_PYTHONS="3.12": only those
tests=(tests/test_logs.py tests/test_log_limits.py tests/test_course_rubric.py tests/test_gradebook.py
       tests/test_handin.py tests/test_download.py tests/test_report.py tests/test_integrity.py tests/test_cli.py
       tests/test_layout.py tests/test_docs.py tests/test_parse_bomb.py tests/test_lms_names.py
       tests/test_log_origin.py tests/test_lms_ids.py tests/test_integrity_framing.py)
export PYTHONDONTWRITEBYTECODE=1
unset PYTHONPATH

runs_as() {   # $1 is a Python that starts and is version $2 (a pyenv shim may name one it cannot run)
  [ -n "$1" ] && [ "$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$2" ]
}

find_python() {
  local version=$1 candidate pyenv_root
  pyenv_root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  for candidate in $(ls -d "$pyenv_root"/versions/"$version".*/bin/"python$version" 2>/dev/null | sort -rV) \
                   "$(command -v "python$version" || true)"; do
    if runs_as "$candidate" "$version"; then echo "$candidate"; return; fi
  done
}

missing=()
for version in "${versions[@]}"; do
  python=$(find_python "$version")
  if [ -z "$python" ]; then
    echo "test-pythons: no Python $version on this machine (PATH, pyenv)" >&2
    missing+=("$version")
    continue
  fi
  venv=build/pythons/$version
  echo "== Python $version: $python, venv $venv"
  mkdir -p build/pythons
  cat requirements.txt requirements-test.txt | grep -v '^torch==' > "$venv.requirements.txt"
  if ! cmp -s "$venv.requirements.txt" "$venv/.installed"; then    # (re)installed when they changed
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$venv.requirements.txt"
    cp "$venv.requirements.txt" "$venv/.installed"
  fi
  "$venv/bin/python" tests/pythons/import_all.py
  if [ "$version" = "${A4_SUITE_PYTHON:-}" ]; then
    # make test runs these tests, and every other, under this Python (with torch); they pass without
    # torch under each other version here.
    echo "== Python $version: the torch-free tests are make test's, which runs under this Python"
  else
    "$venv/bin/python" -m pytest -q -p no:cacheprovider -n "${TEST_PROCESSES:-2}" --dist loadfile \
        -m "not torch and not slurm and not course" "${tests[@]}"
  fi
  refused=$("$venv/bin/python" -m grader grade tests/data --out "$(mktemp -d)" 2>&1) && status=0 || status=$?
  if [ "$status" -ne 2 ] || ! grep -q "needs torch" <<<"$refused"; then
    echo "test-pythons: without torch, grade should be refused naming torch (status 2); it said ($status):" >&2
    echo "$refused" | tail -5 >&2
    exit 1
  fi
done

if [ "${#missing[@]}" -gt 0 ] && [ "${A4_REQUIRE_PYTHONS:-}" = 1 ]; then
  echo "test-pythons: A4_REQUIRE_PYTHONS=1, and no Python ${missing[*]} here: install it (pyenv install)" >&2
  exit 1
fi
echo "test-pythons: passed under Python ${versions[*]}${missing:+ (not here: ${missing[*]})}"
