# a4: the Assignment 4 kit, its Slurm jobs and its grader.
#   make demo        run the reference on 4 CPU ranks as the Slurm job would
#   make test        the test suite (real gloo worlds, real torchrun)
#   make test-slurm  the Slurm tests against a local 4-node cluster (root, Debian)
#   make skeleton    regenerate assignment_4/assignment4.py from the reference
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The venv is (re)installed when requirements.txt changes, and only then.
STAMP := $(VENV)/.installed
DEMO := build/demo

.PHONY: venv demo test test-slurm skeleton clean

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@cp requirements.txt $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	@rm -rf $(DEMO) && mkdir -p $(DEMO)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" slurm/run-local.sh --nproc 4 --out $(DEMO) assignment_4/reference/assignment4.py

test: $(STAMP)
	$(PY) -m pytest -m "not slurm"

# Starts a local 4-node Slurm (installing Debian's packages if needed; root), runs the tests marked
# slurm against it, and stops it again, also when a test fails.
test-slurm: $(STAMP)
	PYTHON=$(PY) slurm/dev/test-slurm.sh

skeleton: $(STAMP)
	$(PY) -m grader skeleton

clean:
	rm -rf build .pytest_cache
