# a4: the Assignment 4 kit, its Slurm jobs and its grader.
#   make demo        run the reference on 4 CPU ranks as the Slurm job would, check it, package it, grade it
#   make test        the test suite (real gloo worlds, real torchrun)
#   make test-course the suite again in an instructor's changed copy of the kit (rubric, sizes, Part 5)
#   make test-slurm  the Slurm tests against a local 4-node cluster (root, Debian)
#   make test-pythons  under every Python 3.10-3.13 here: torch-free requirements, every module
#                    imported, the torch-free tests (tests/pythons/test-pythons.sh)
#   make bench       grading throughput: warm executor against torchrun, per-world floor, memory
#                    the integrity report over every pair of 500 hand-ins, the staff report's size and time
#   make skeleton    regenerate assignment_4/assignment4.py from the reference, and the handout's points from the rubric
#   make release     write the tree students receive into build/release
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The venv is (re)installed when requirements.txt changes, and only then.
STAMP := $(VENV)/.installed
# torch's CPU build, from PyTorch's own index when it answers within 3 s (PyPI's Linux torch is the
# CUDA build: GBs of libraries a CPU grader never uses); else at once from the default index.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
DEMO := build/demo
RELEASE := build/release

.PHONY: venv demo test test-course test-slurm test-pythons bench skeleton release clean

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if timeout 3 $(PY) -c "import urllib.request; urllib.request.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=3)" \
	    >/dev/null 2>&1; then \
	  echo "torch: the CPU build, from $(TORCH_CPU_INDEX)"; \
	  $(PY) -m pip install --quiet --disable-pip-version-check --no-deps --index-url $(TORCH_CPU_INDEX) \
	    "$$(grep -m1 '^torch==' requirements.txt | cut -d' ' -f1)"; \
	else \
	  echo "torch: $(TORCH_CPU_INDEX) did not answer within 3 s; torch from the default index (on Linux that may be the CUDA build)"; \
	fi
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

# Two processes, each taking whole test files (a file's module fixtures, the graded corpora, are
# made once), the longest files first (tests/conftest.py: LONGEST_FIRST): the waits on hangs and
# timeouts of one overlap the other's work, and both finish together.
TEST_PROCESSES ?= 2
test: $(STAMP)
	$(PY) -m pytest -m "not slurm and not course" -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder

# The kit's suite run again in an instructor's changed copy of the kit, Part 5 off and on
# (tests/test_course_rubric.py, marker course): one copy per process.
test-course: $(STAMP)
	$(PY) -m pytest -m course -n $(TEST_PROCESSES) --dist load

# Starts a local 4-node Slurm (installing Debian's packages if needed; root), runs the tests marked
# slurm against it, and stops it again, also when a test fails.
test-slurm: $(STAMP)
	PYTHON=$(PY) tests/slurm_cluster/test-slurm.sh

# No venv of its own needed: each Python gets one under build/pythons/.
test-pythons:
	tests/pythons/test-pythons.sh

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
