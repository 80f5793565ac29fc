# Tidelog's developer commands. `make run` and `make test` work on a fresh
# machine: they create .venv and install what they need first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DATA_DIR ?= .tidelog

.PHONY: install run test test-unit test-integration soak bench bench-kafka bench-baseline lint format proto proto-check go-tools examples clean

install: $(STAMP)

# One distribution per part, each with its own pyproject.toml; all installed
# editable into .venv with the developer tools.
PARTS := sdk services/common services/broker services/coordinator services/gateway

# Reinstall only when a dependency list changes: `make install` is quick when
# nothing did.
$(STAMP): $(addsuffix /pyproject.toml,$(PARTS)) requirements-dev.txt
	@tools/check-prereqs.sh $(PYTHON)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(addprefix -e ,$(PARTS)) -r requirements-dev.txt
	@touch $(STAMP)

run: install
	$(BIN)/tidelog dev --data-dir $(DATA_DIR)

test: install proto-check lint go-tools
	$(BIN)/python -m pytest -q tests

# grpcurl and the Go protoc plugins at pinned versions, built once into
# .cache/go-bin (docs/any-language.md and the Go example use them). Without Go
# installed this says so and carries on: the tests that need them are skipped
# with that reason.
go-tools:
	@tools/go-tools.sh >/dev/null || [ $$? -eq 3 ]

# The Go and Java example programs (examples/), generated from protos/ and
# built; tests/integration/clients runs them against a local cluster.
examples: install
	PYTHON=$(BIN)/python examples/go/build.sh
	examples/java/build.sh

test-unit: install
	$(BIN)/python -m pytest -q tests/unit

test-integration: install
	$(BIN)/python -m pytest -q tests/integration

# The long fault runs (kill -9 loops for minutes), left out of `make test`.
soak: install
	$(BIN)/python -m pytest -q -m soak tests/fault

# Throughput, latency and memory beside the same run's baselines, then the
# control plane's numbers (rebalance time, offset commits per second), then
# every figure that moved more than 15% from bench/baselines/<machine kind>.json
# (a report, not a failure; bench/baseline.py).
bench: install
	$(BIN)/python -m bench
	$(BIN)/python -m bench.group_bench
	$(BIN)/python -m bench.gateway_bench
	$(BIN)/python -m bench.baseline compare

# This run's figures (bench/results/) become the committed baseline.
bench-baseline: install
	$(BIN)/python -m bench.baseline update

bench-kafka: install
	$(BIN)/python -m bench --with-kafka

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/buf lint
	tools/buf-breaking.sh $(BIN)/buf

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Regenerate the Python code and type stubs from protos/ (committed, never edited by hand).
proto: install
	PYTHON=$(BIN)/python tools/genproto.sh

# Fail when the committed generated code differs from what protos/ generate
# (tools/genproto.sh says which distribution each proto directory goes to).
GENERATED := sdk/tidelog/v1 services/common/tidelog_server/internal
proto-check: install
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	  PYTHON=$(BIN)/python tools/genproto.sh $$tmp >/dev/null && \
	  for d in $(GENERATED); do \
	    for f in $$(cd $$tmp/$$d && ls); do \
	      cmp -s $$tmp/$$d/$$f $$d/$$f || { echo "generated code is stale: $$d/$$f differs; run 'make proto'"; exit 1; }; \
	    done; \
	    for f in $$(cd $$d && ls | grep -E '_pb2|__init__'); do \
	      test -e $$tmp/$$d/$$f || { echo "generated file without a .proto: $$d/$$f; run 'make proto'"; exit 1; }; \
	    done; \
	  done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .cache examples/go/tidelog examples/java/target
