# The README's commands. `make train` and `make test` do all the set-up on a fresh Debian machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Installed: bigbatch and PyTorch, what `make train` needs; then the tests' and linter's tools.
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
FASHION_MNIST := /usr/share/datasets/fashion-mnist

.PHONY: setup setup-dev data train test test-slurm test-cluster test-fast bench lint docs clean

setup: $(STAMP)
setup-dev: $(DEV_STAMP)

# setup.py and the C sources: the LARS and LAMB kernels are rebuilt by the editable install.
KERNELS := $(addprefix src/bigbatch/optim/,_lars_kernel.c _lamb_kernel.c _chunked_sums.h)
$(STAMP): pyproject.toml setup.py $(KERNELS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install --quiet -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(DEV_STAMP)

# Debian ships Fashion-MNIST; elsewhere `bigbatch` downloads it (checksums verified).
data:
	@if [ ! -d $(FASHION_MNIST) ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist; fi

train: setup data
	$(BIN)/bigbatch train

# BIGBATCH_REQUIRE_DATA=1: a test that needs Fashion-MNIST fails without it instead of skipping.
# The SLURM tests are left to `make test-slurm`: they start a cluster as root and wait out SLURM's
# hold on a requeued job (about 15 minutes).
# TEST_WORKERS pytest processes (pytest-xdist), each test module whole on one of them, so that a
# module's shared runs (its module-scoped fixtures) are made once; the longest modules first
# (tests/conftest.py), not xdist's order by test count. Most of the suite's time is
# other processes starting (torch's import) and small single-threaded work, which two workers
# overlap on two cores (docs/results/make_test.log). More workers than cores slow the
# multi-process tests.
TEST_WORKERS ?= 2
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder
test: setup-dev data
	BIGBATCH_REQUIRE_DATA=1 $(BIN)/python -m pytest -q $(PYTEST_PARALLEL) -m "not slurm and not cluster"

test-slurm: setup-dev data
	BIGBATCH_REQUIRE_DATA=1 $(BIN)/python -m pytest -q -m slurm

# The fault matrix on network-namespace nodes (tests/test_cluster.py; root and iproute2): links
# cut, shaped and restored, nodes frozen, killed and joining; about 10 minutes.
test-cluster: setup-dev data
	@if ! command -v tc >/dev/null && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		apt-get install -y -qq iproute2; fi
	BIGBATCH_REQUIRE_DATA=1 $(BIN)/python -m pytest -q -m cluster

test-fast: setup-dev
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) -m "not slow"

# The results tables of README.md and docs/*.md, drawn afresh from docs/results (standard library
# only); tests/test_docs_render.py fails when they differ.
docs:
	$(PYTHON) benchmarks/render_docs.py

lint: setup-dev
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
