# a4: the Assignment 4 kit, its Slurm jobs and its grader.
#   make demo        run the reference on 4 CPU ranks as the Slurm job would, check it, package it, grade it
#   make test        ruff (make lint), then the test suite (real gloo worlds, real torchrun) but for
#                    the long suites below, each its own target
#   make test-hostile  a hand-in's attacks, each graded in a real batch beside correct hand-ins
#   make test-scale  batches at scale and through failure: job arrays, a killed grader, hangs, --jobs
#   make test-student  the student's side: torchrun runs, the lab, check, package, the release
#   make test-lms    every LMS there and back: downloads, gradebook, import and feedback files, report
#   make test-optional  each optional part (5-8) graded in a batch with it on: the reference at every
#                    check, the skeleton, each mistake
#   make test-configs  where the course runs beyond this checkout and root: an ordinary user (useradd),
#                    no user namespaces, a tight ulimit -u, a module Python, the kit installed elsewhere,
#                    a student's fresh folder (marker configs)
#   make test-course the suite again in an instructor's changed copy of the kit (rubric, sizes, Parts 5-8)
#   make test-slurm  the Slurm tests against a local 4-node cluster (root, Debian)
#   make test-pythons  under every Python 3.10-3.13 here: torch-free requirements, every module
#                    imported, the torch-free tests (tests/pythons/test-pythons.sh)
#   make test-cuda   with torch's CUDA build (.venv-cuda): the demo's check and grade, the grading,
#                    sandbox, self-check and machines' tests (tests/cuda/test-cuda.sh; no GPU needed)
#   make bench       every benchmark of benchmarks/, its figures written into docs/figures.md with the
#                    date, the commit and the machine (benchmarks/figures.py; RUBRIC=benchmarks/part5.yaml:
#                    with Part 5 on)
#   make gpu-check   on a GPU machine, with the Python given (PYTHON=python3): NCCL runs, the lab, the
#                    demo and the throughput benchmark with torch's CUDA build, into docs/figures.md
#   make skeleton    regenerate assignment_4/assignment4.py from the reference, and the handout's points
#                    from the rubric
#   make release     write the tree students receive into build/release
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The venv: the kit's runtime pins and the test suite's, (re)installed when either file changes, and only then.
REQUIREMENTS := requirements.txt requirements-test.txt
STAMP := $(VENV)/.installed
# torch's CPU build, from PyTorch's own index when it answers within 3 s (PyPI's Linux torch is the
# CUDA build: GBs of libraries a CPU grader never uses); else at once from the default index.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
DEMO := build/demo
RELEASE := build/release

.PHONY: venv demo lint test test-hostile test-scale test-student test-lms test-optional test-configs test-course test-slurm test-pythons test-cuda bench gpu-check skeleton release clean

$(STAMP): $(REQUIREMENTS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if timeout 3 $(PY) -c "import urllib.request; urllib.request.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=3)" \
	    >/dev/null 2>&1; then \
	  echo "torch: the CPU build, from $(TORCH_CPU_INDEX)"; \
	  $(PY) -m pip install --quiet --disable-pip-version-check --no-deps --index-url $(TORCH_CPU_INDEX) \
	    "$$(grep -m1 '^torch==' requirements.txt | cut -d' ' -f1)"; \
	else \
	  echo "torch: $(TORCH_CPU_INDEX) did not answer within 3 s; torch from the default index (on Linux that may be the CUDA build)"; \
	fi
	$(PY) -m pip install --quiet --disable-pip-version-check $(addprefix -r ,$(REQUIREMENTS))
	@cat $(REQUIREMENTS) > $(STAMP)

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

# Every suite ends with one line, "suite TARGET took N s (M min)", whether it passed or not (its exit
# status stays the suite's): make runs a recipe line in one shell, whose EXIT trap prints it.
TIMED = t0=$$(date +%s); trap 'echo "suite $@ took $$(( $$(date +%s) - t0 )) s ($$(( ($$(date +%s) - t0) / 60 )) min)"' EXIT;

# Two processes, each taking whole test files (a file's module fixtures, the graded corpora, are
# made once), the longest files first (tests/conftest.py: LONGEST_FIRST): the waits on hangs and
# timeouts of one overlap the other's work, and both finish together.
TEST_PROCESSES ?= 2
# ruff over the kit's Python (pyproject.toml's [tool.ruff]: pyflakes, blind excepts, stale noqa);
# make test runs it first.
LINTED := grader slurm lab benchmarks assignment_4/reference tests
lint: $(STAMP)
	$(PY) -m ruff check $(LINTED)

# The suites with targets of their own (markers: tests/conftest.py's APART says what each holds),
# so that make test stays under ten minutes on two cores; .ci/run runs every one of them.
APART := slurm or course or configs or hostile or scale or student or lms or optional
PYTEST_FILES := $(PY) -m pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder

test: $(STAMP) lint
	@$(TIMED) $(PYTEST_FILES) -m "not ($(APART))"

# A hand-in's attacks (marker hostile): on the sandbox, the grader's files and processes, other
# hand-ins and the verdict (file swaps, forged logs, parse bombs, memory no Pss shows), each graded
# in a real batch beside correct hand-ins, as root (make test-configs: as an ordinary user).
test-hostile: $(STAMP)
	@$(TIMED) $(PYTEST_FILES) -m "hostile and not configs"

# Batches at scale and through failure (marker scale): job arrays, a grader killed mid-batch and
# resumed, hangs under a loaded machine, --jobs from the machine.
test-scale: $(STAMP)
	@$(TIMED) $(PYTEST_FILES) -m "scale and not configs"

# Every LMS there and back (marker lms): each LMS's download read and graded, the gradebook and its
# import and feedback files, the staff report, Gradescope's container.
test-lms: $(STAMP)
	@$(TIMED) $(PYTEST_FILES) -m "lms and not configs"

# Each optional part (Parts 5-8, marker optional) graded in a batch with it on: the reference at every
# check with its log and bonus, the skeleton, each of the part's mistakes with its diagnosis. Their
# math against the reference's stays in make test.
test-optional: $(STAMP)
	@$(TIMED) $(PYTEST_FILES) -m "optional and not configs"

# The student's side (marker student): torchrun runs on several ranks, the lab, check and package,
# the Slurm job run locally, the release followed from a fresh copy.
test-student: $(STAMP)
	@$(TIMED) $(PYTEST_FILES) -m "student and not configs"

# Where the course runs beyond this checkout and root (marker configs; run as root, as useradd is):
# the sandbox's attacks as an ordinary user made with useradd (the system's Python, and a Python in
# that user's home), the machines' configurations of tests/test_machines.py, the kit installed into
# a venv elsewhere (tests/test_install.py), and a student following the release from a fresh folder.
test-configs: $(STAMP)
	@$(TIMED) $(PYTEST_FILES) -m configs

# The releases of an instructor's changed copy of the kit, the optional parts off and all on, and the
# kit's suite run again in the second, on two processes
# (tests/test_course_rubric.py, marker course).
test-course: $(STAMP)
	@$(TIMED) TEST_PROCESSES=$(TEST_PROCESSES) $(PY) -m pytest -m course -n $(TEST_PROCESSES) --dist load

# Starts a local 4-node Slurm (installing Debian's packages if needed; root), runs the tests marked
# slurm against it, and stops it again, also when a test fails.
test-slurm: $(STAMP)
	@$(TIMED) PYTHON=$(PY) tests/slurm_cluster/test-slurm.sh

# No venv of its own needed: each Python gets one under build/pythons/. Under the Python make test's venv
# is made from (A4_SUITE_PYTHON), the torch-free tests are left to make test, which runs them there.
test-pythons:
	@$(TIMED) A4_SUITE_PYTHON=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])') tests/pythons/test-pythons.sh

# torch's CUDA build (PyPI's torch for Linux, what clusters bring) in a venv of its own, .venv-cuda,
# from the default index whatever this machine's pip configuration says: the demo's check and grade,
# the grading, sandbox, self-check and machines' configurations tests (tests/cuda/test-cuda.sh). Fails, never skips, where the
# CUDA build cannot be had. No GPU needed.
test-cuda:
	@$(TIMED) PYTHON=$(PYTHON) TEST_PROCESSES=$(TEST_PROCESSES) tests/cuda/test-cuda.sh

# Every benchmark of benchmarks/ (grading throughput against torchrun, as root and as a useradd user,
# with torch's CPU build and, where make test-cuda made .venv-cuda, its CUDA build; the integrity report
# over 500 hand-ins, the staff report's size and time, intake's memory on a 1 GB download), its figures written
# into docs/figures.md (benchmarks/figures.py). RUBRIC=FILE: the benchmarks that take a rubric read it on
# top of grader/rubric.yaml (benchmarks/part5.yaml turns Part 5 on). A benchmark that fails (the
# throughput benchmark, when a hand-in's result is not what its corpus expects) fails make bench.
RUBRIC ?=
bench: $(STAMP)
	$(PY) benchmarks/figures.py $(if $(RUBRIC),--rubric $(RUBRIC))

# On a machine with GPUs and torch's CUDA build, with the Python given (PYTHON=python3 make gpu-check;
# no venv is made, nothing installed): the reference and the skeleton on NCCL, several ranks on one
# GPU, the lab and its bandwidth table, the demo's check and grade, the throughput benchmark at
# --jobs = cores, and a summary table (benchmarks/gpu_check.py), written into docs/figures.md. Not part
# of .ci/run: CI has no GPU.
gpu-check:
	$(PYTHON) benchmarks/figures.py gpu_check

skeleton: $(STAMP)
	$(PY) -m grader skeleton

# The tree students receive: skeleton, utils, handout, Slurm jobs, check and package; no solution.
release: $(STAMP)
	$(PY) -m grader release --out $(RELEASE) --replace

clean:
	rm -rf build .pytest_cache
