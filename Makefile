# trainscale — one-command entry points. GNU make; recipes are indented with tabs.
#
#   make setup          create .venv with the pinned stack (requirements.txt) + editable package
#   make test           the test suite without the tests marked slow or workflow, on every core (under 6 min on 2)
#   make test-all       the whole suite, slow and workflow tests included (what CI runs)
#   make figures        run every study (workflow/Snakefile) in full mode
#   make figures-quick  the same with small grids (what CI runs)
#   make sweeps         the plan and notebook sweeps of config/config.yaml (results/full/sweeps/)
#   make unlock         release the workflow's lock after a killed run (snakemake --unlock; safe when none runs)
#   make verify         check every study's paper comparison and figures on the committed datasets (< 1 min)
#   make gallery        rewrite the README's gallery and verdict counts from figures/*/comparison.csv
#   make docs           the documentation site -> results/docs/html (installs requirements-docs.txt; checked in
#                       headless Chromium when one is installed)
#   make bench          speed and accuracy benchmarks
#   make lab            JupyterLab on notebooks/ (installs requirements-lab.txt)
#   make lint           snakemake --lint and snakefmt --check on the workflow
#   make clean          remove quick results and the Numba cache (keeps .venv)

PYTHON3 ?= python3
VENV    ?= .venv
PY       = $(VENV)/bin/python
VENV_BIN = $(abspath $(VENV))/bin
STAMP    = $(VENV)/.installed
LAB_STAMP = $(VENV)/.lab-installed
DOCS_STAMP = $(VENV)/.docs-installed

# The Numba cache: the package decides (trainscale.kernels.cache_base: NUMBA_CACHE_DIR if set, else .numba_cache/
# of this checkout), so make, an activated venv, JupyterLab, papermill and SLURM jobs share what setup compiles.
# Every recipe finds the venv's tools (trainscale, snakemake, papermill, jupyter) first.
export PATH := $(VENV_BIN):$(PATH)

.PHONY: all setup test test-all figures figures-quick sweeps unlock verify gallery docs bench lab lint clean help
.DEFAULT_GOAL := help

help:
	@sed -n '3,18p' $(firstword $(MAKEFILE_LIST))

all: test

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@command -v $(PYTHON3) >/dev/null 2>&1 || { \
	  echo "error: '$(PYTHON3)' not found on PATH. Install Python >= 3.11, or run 'make PYTHON3=/path/to/python3.11 setup'." >&2; \
	  exit 1; }
	@$(PYTHON3) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || { \
	  echo "error: trainscale needs Python >= 3.11; '$(PYTHON3)' is $$($(PYTHON3) -V 2>&1). Run 'make PYTHON3=/path/to/python3.11 setup'." >&2; \
	  exit 1; }
	test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	@# --no-compile: pip byte-compiles one file after another (24 s of its 54 s on 2 cores); compileall does it
	@# below on every core, beside the Numba compile
	$(PY) -m pip install --no-compile -r requirements.txt
	$(PY) -m pip install --no-compile -e .
	$(PY) -m ipykernel install --sys-prefix --name python3
	@echo "compiling the Numba kernels into $$($(PY) -c 'import trainscale.kernels as k; print(k.cache_base())') (once; a first predict or search then answers in seconds)"
	@# predict and search compile side by side, one process each (the Numba cache takes concurrent writers:
	@# tests/test_kernels.py compiles one kernel in three processes); 40 s -> 28 s on 2 cores
	@# (a file compileall cannot compile, such as a package's template, is skipped as pip skips it)
	$(PY) -m compileall -q -j 0 $(VENV)/lib >/dev/null 2>&1 & pyc=$$!; \
	  $(VENV)/bin/trainscale predict examples/runs.yaml >/dev/null & predict=$$!; \
	  search=0; $(PY) -c "from trainscale.model import planner; planner.search('llama2-7b', 'dgx-h100', gpus=16, global_batch=32, top=1)" || search=$$?; \
	  wait $$pyc; wait $$predict && test $$search -eq 0
	touch $@

# The tests build the documentation site too, so they install its toolchain (requirements-docs.txt) first.
# make test spreads the files over every core (pytest-xdist; one file's tests stay on one worker, as their
# module fixtures expect) and leaves out the slow tests and the workflow ones (each runs Snakemake: the quick
# workflow of every study, the nothing-lost checks), which make test-all and CI run.
test: $(DOCS_STAMP)
	MPLBACKEND=Agg $(PY) -m pytest -m "not slow and not workflow" -n auto --dist loadfile

test-all: $(DOCS_STAMP)
	MPLBACKEND=Agg $(PY) -m pytest

# curtailment's paper setting replays the paper's own trace, which its repository does not license for
# redistribution: fetched once into external/ (git-ignored, checked by sha256); without it a full rerun of
# that study stops with the command to fetch it (the committed figures stay as they are).
figures: $(STAMP)
	@test -f external/curtail-llm/mci.csv || $(VENV)/bin/trainscale fetch-trace \
	  || echo "warning: could not fetch the curtailment trace (no network?); a full rerun of curtailment will stop"
	MPLBACKEND=Agg $(VENV)/bin/snakemake --cores all --snakefile workflow/Snakefile

figures-quick: $(STAMP)
	MPLBACKEND=Agg $(VENV)/bin/snakemake --cores all --snakefile workflow/Snakefile --config mode=quick

sweeps: $(STAMP)
	MPLBACKEND=Agg $(VENV)/bin/snakemake sweeps --cores all --snakefile workflow/Snakefile

# A run killed mid-way (SIGKILL, a lost node) leaves .snakemake/locks behind and the next run stops with
# "Directory cannot be locked"; --unlock removes the lock (it refuses nothing and runs no job). Stale
# temporary files of interrupted writes are removed by the next write of the same output (trainscale.common.io).
unlock: $(STAMP)
	$(VENV)/bin/snakemake --unlock --cores 1 --snakefile workflow/Snakefile

verify: $(STAMP)
	$(VENV)/bin/trainscale verify

gallery: $(STAMP)
	$(VENV)/bin/trainscale gallery --write README.md

$(DOCS_STAMP): requirements-docs.txt $(STAMP)
	$(PY) -m pip install -r requirements-docs.txt
	touch $@

# Built in a temporary folder, moved into results/docs/html only when Sphinx reports no warning; then every page
# is loaded in headless Chromium (no broken link or image, every figure captioned) where one is installed.
docs: $(DOCS_STAMP)
	MPLBACKEND=Agg $(VENV)/bin/trainscale docs --out results/docs/html \
	  $$(command -v chromium >/dev/null 2>&1 && echo --check || echo "no Chromium on PATH: the site is built, not checked in a browser" >&2)

bench: $(STAMP)
	$(PY) benchmarks/run.py

$(LAB_STAMP): requirements-lab.txt $(STAMP)
	$(PY) -m pip install -r requirements-lab.txt
	touch $@

# Inline plots in the lab (no Agg); --allow-root only where it must (root in a container).
lab: $(LAB_STAMP)
	$(VENV)/bin/jupyter lab notebooks/ $$([ "$$(id -u)" = 0 ] && echo --allow-root)

lint: $(STAMP)
	$(VENV)/bin/snakemake --lint --snakefile workflow/Snakefile
	$(VENV)/bin/snakefmt --check workflow

clean:
	rm -rf results/quick .numba_cache
