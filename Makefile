# a4: the Assignment 4 kit, its Slurm jobs and its grader.
#   make demo        run the reference on 4 CPU ranks as the Slurm job would, check it, package it, grade it
#   make test        the test suite (real gloo worlds, real torchrun)
#   make test-slurm  the Slurm tests against a local 4-node cluster (root, Debian)
#   make bench       grading throughput: warm executor against torchrun, per-world floor, memory
#                    the integrity report over every pair of 500 hand-ins, the staff report's size and time
#   make skeleton    regenerate assignment_4/assignment4.py from the reference
#   make release     write the tree students receive into build/release
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The venv is (re)installed when requirements.txt changes, and only then.
STAMP := $(VENV)/.installed
DEMO := build/demo
RELEASE := build/release

.PHONY: venv demo test test-slurm bench skeleton release clean

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@cp requirements.txt $(STAMP)

venv: $(STAMP)

# A student's story, told with the reference solution: run it on 4 CPU ranks as the Slurm job
# would (leaving assignment4-<id>.log and .err), check it, package it into the hand-in zip (which
# checks the zip again), grade that zip as a TA would, and end with the final gradebook under the
# example course policy (grader/grades/example/: a hand-in 2 hours late, a student who handed in nothing).
demo: $(STAMP)
	@rm -rf $(DEMO) && mkdir -p $(DEMO)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" slurm/run-local.sh --nproc 4 --out $(DEMO) assignment_4/reference/assignment4.py
	$(PY) -m grader check assignment_4/reference --log $(DEMO)/assignment4-*.log
	$(PY) -m grader package assignment_4/reference --log $(DEMO)/assignment4-*.log -o $(DEMO)/demo-student.zip
	$(PY) -m grader grade $(DEMO)/demo-student.zip --out $(DEMO)/grades
	@echo; cat $(DEMO)/grades/grades.csv; echo "feedback: $(DEMO)/grades/students/demo-student/feedback.md"; echo
	$(PY) -m grader gradebook $(DEMO)/grades --policy grader/grades/example/policy.yaml -o $(DEMO)/final.csv
	@echo; cat $(DEMO)/final.csv
	@echo; echo "staff report (open it in a browser): $(DEMO)/grades/report.html"

test: $(STAMP)
	$(PY) -m pytest -m "not slurm"

# Starts a local 4-node Slurm (installing Debian's packages if needed; root), runs the tests marked
# slurm against it, and stops it again, also when a test fails.
test-slurm: $(STAMP)
	PYTHON=$(PY) tests/slurm_cluster/test-slurm.sh

bench: $(STAMP)
	$(PY) benchmarks/grading_throughput.py
	$(PY) benchmarks/integrity_pairs.py
	$(PY) benchmarks/report_size.py

skeleton: $(STAMP)
	$(PY) -m grader skeleton

# The tree students receive: skeleton, utils, handout, Slurm jobs, check and package; no solution.
release: $(STAMP)
	$(PY) -m grader release --out $(RELEASE) --replace

clean:
	rm -rf build .pytest_cache
