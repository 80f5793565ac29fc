# Tidelog's developer commands. `make run` and `make test` work on a fresh
# machine: they create .venv and install what they need first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DATA_DIR ?= .tidelog

.PHONY: install run test test-unit test-integration soak bench bench-kafka lint format proto proto-check clean

install: $(STAMP)

# Reinstall only when the dependency list changes: `make install` is quick
# when nothing did.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Tidelog needs Python 3.11+, found " + sys.version' 
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

run: install
	$(BIN)/tidelog dev --data-dir $(DATA_DIR)

test: install proto-check lint
	$(BIN)/python -m pytest -q tests

test-unit: install
	$(BIN)/python -m pytest -q tests/unit

test-integration: install
	$(BIN)/python -m pytest -q tests/integration

# The long fault runs (kill -9 loops for minutes), left out of `make test`.
soak: install
	$(BIN)/python -m pytest -q -m soak tests/fault

# Throughput, latency and memory beside the same run's baselines, then the
# control plane's numbers (rebalance time, offset commits per second).
bench: install
	$(BIN)/python -m bench
	$(BIN)/python -m bench.group_bench

bench-kafka: install
	$(BIN)/python -m bench --with-kafka

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Regenerate the Python code and type stubs from protos/ (committed, never edited by hand).
proto: install
	PYTHON=$(BIN)/python tools/genproto.sh

# Fail when the committed generated code differs from what protos/ generate.
proto-check: install
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	  PYTHON=$(BIN)/python tools/genproto.sh $$tmp >/dev/null && \
	  for d in $$(cd $$tmp && find . -name '*_pb2*' -o -name '__init__.py' | sort); do \
	    cmp -s $$tmp/$$d sdk/$$d || { echo "generated code is stale: sdk/$$d differs; run 'make proto'"; exit 1; }; \
	  done && \
	  stale=$$(cd sdk && find tidelog/v1 tidelog/internal -name '*_pb2*' 2>/dev/null | while read f; do test -e $$tmp/$$f || echo $$f; done) && \
	  { test -z "$$stale" || { echo "generated files without a .proto: $$stale; run 'make proto'"; exit 1; }; }

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
