# a4: the Assignment 4 kit, its Slurm jobs and its grader.
#   make demo        run the reference on 4 CPU ranks as the Slurm job would
#   make test        the test suite (real gloo worlds, real torchrun)
#   make test-slurm  the Slurm tests against a local 4-node cluster (root, Debian)
#   make bench       grading throughput: warm executor against torchrun, per-world floor, memory
#   make skeleton    regenerate assignment_4/assignment4.py from the reference
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The venv is (re)installed when requirements.txt changes, and only then.
STAMP := $(VENV)/.installed
DEMO := build/demo

.PHONY: venv demo test bench skeleton clean

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@cp requirements.txt $(STAMP)

venv: $(STAMP)

# The reference runs on 4 CPU ranks as the Slurm job would; its code, .log and .err are zipped as
# a student's hand-in and graded.
demo: $(STAMP)
	@rm -rf $(DEMO) && mkdir -p $(DEMO)/handin
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" slurm/run-local.sh --nproc 4 --out $(DEMO)/handin assignment_4/reference/assignment4.py
	cp assignment_4/reference/assignment4.py assignment_4/utils.py $(DEMO)/handin/
	$(PY) -m zipfile -c $(DEMO)/demo-student.zip $(DEMO)/handin/*
	$(PY) -m grader grade $(DEMO)/demo-student.zip --out $(DEMO)/grades
	@echo; cat $(DEMO)/grades/grades.csv; echo "feedback: $(DEMO)/grades/demo-student/feedback.md"

test: $(STAMP)
	$(PY) -m pytest -m "not slurm"

bench: $(STAMP)
	$(PY) benchmarks/grading_throughput.py

skeleton: $(STAMP)
	$(PY) -m grader skeleton

clean:
	rm -rf build .pytest_cache
