# Tidelog's developer commands. `make run` and `make test` work on a fresh
# machine: they create .venv and install what they need first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DATA_DIR ?= .tidelog

.PHONY: helm-background helm install run test test-unit test-integration soak fuzz bench bench-kafka bench-baseline lint format proto proto-check go-tools examples images demo-spark clean

install: $(STAMP)

# One distribution per part, each with its own pyproject.toml; all installed
# editable into .venv with the developer tools.
PARTS := sdk services/common services/broker services/coordinator services/gateway
# What pip installs: the parts, the SDK with its uvloop extra (what the
# latency benchmarks measure) and its Spark extra (pyspark and
# pyarrow, for tests/spark and bench/spark_bench.py; pyspark is a ~456 MB source
# package, ~40 s cold, seconds from pip's cache).
comma := ,
INSTALL_PARTS := $(patsubst sdk,sdk[spark$(comma)uvloop],$(PARTS))

# Reinstall only when a dependency list or the SDK's C extension (built in
# place by the editable install) changes: `make install` is quick when
# nothing did.
$(STAMP): $(addsuffix /pyproject.toml,$(PARTS)) requirements-dev.txt sdk/setup.py sdk/tidelog/_crecords.c sdk/tidelog/_cproduce.c
	@tools/check-prereqs.sh $(PYTHON)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(foreach p,$(INSTALL_PARTS),-e '$(p)') -r requirements-dev.txt
	@# PySpark finds `format("tidelog")` by listing top-level modules named
	@# pyspark_* (pkgutil.iter_modules), which does not see the import hooks of
	@# editable installs: put sdk/ itself on the venv's path so that
	@# sdk/pyspark_tidelog is listed (an installed wheel needs nothing of this).
	@$(BIN)/python -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "tidelog-sdk-modules.pth").write_text("$(CURDIR)/sdk\n")'
	@touch $(STAMP)

run: install
	$(BIN)/tidelog dev --data-dir $(DATA_DIR)

# Tests in TEST_WORKERS processes (they mostly wait on the services they
# start, so more workers than cores pays); tests that share one heavy resource
# carry an xdist_group mark and run in one worker. The fault tests kill
# processes and wait out leases: they run after the rest, FAULT_WORKERS at a
# time (two: ~120 s instead of ~233 s one at a time; each test's cluster is its
# own, and their deadlines are generous: 3 of 3 quiet runs and one beside the
# SDK's unit tests passed).
# helm-background first: the first build of helm takes ~10 minutes and runs
# beside lint and the tests; tests/deploy (one worker) waits for it.
TEST_WORKERS ?= 4
FAULT_WORKERS ?= 2
# GRPC_ENABLE_FORK_SUPPORT=0: a worker forks (Spark's JVM launcher runs
# Python in the child) while other tests' gRPC threads run; with gRPC's fork
# handlers on, such a child died at once (JAVA_GATEWAY_EXITED) in one CI run.
# No test's child process uses the parent's gRPC state.
test: helm-background install proto-check lint go-tools
	GRPC_ENABLE_FORK_SUPPORT=0 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup tests --ignore=tests/fault
	GRPC_ENABLE_FORK_SUPPORT=0 $(BIN)/python -m pytest -q -n $(FAULT_WORKERS) tests/fault

# helm (helm.sh/helm/v3, version pinned in tools/helm.sh), built once into
# ~/.cache/tidelog/go-bin and shared by every clone: `make helm` waits for it,
# `make helm-background` starts the build and returns (exit 3 = no Go: the
# chart tests skip and say so; 4 = a build is under way).
helm:
	@tools/helm.sh >/dev/null || [ $$? -eq 3 ]

helm-background:
	@tools/helm.sh --background >/dev/null; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 3 ] || [ $$rc -eq 4 ]

# grpcurl and the Go protoc plugins at pinned versions, built once into
# .cache/go-bin (docs/any-language.md and the Go example use them). Without Go
# installed this says so and carries on: the tests that need them are skipped
# with that reason.
go-tools:
	@tools/go-tools.sh >/dev/null || [ $$? -eq 3 ]

# The Go, Java and TypeScript example programs (examples/), generated from
# protos/ and built; tests/integration/clients runs them against a local cluster.
examples: install
	PYTHON=$(BIN)/python examples/go/build.sh
	examples/java/build.sh
	examples/typescript/build.sh

# The container images: one per service (deploy/docker/Dockerfile: tidelog-broker,
# tidelog-coordinator, tidelog-gateway) and etcd's for tests/containers, each tagged with a
# hash of its inputs and :latest, and built only when those changed (tools/images.py; the
# wheelhouse and the base image are cached under ~/.cache/tidelog). Starts a Docker engine
# first when none answers (tools/docker-engine.sh, as root; it keeps running:
# `tools/docker-engine.sh stop`). No registry is reachable here, so the base image is made
# with debootstrap; elsewhere: make images BASE_IMAGE=python:3.11-slim-bookworm
BASE_IMAGE ?= local
images: install
	@host=$$(tools/docker-engine.sh start) && \
	  DOCKER_HOST=$$host $(BIN)/python tools/images.py --base $(BASE_IMAGE) --tag latest

test-unit: install
	$(BIN)/python -m pytest -q tests/unit

test-integration: install
	$(BIN)/python -m pytest -q tests/integration

# The long fault runs (kill -9 loops for minutes), left out of `make test`.
soak: install
	$(BIN)/python -m pytest -q -m soak tests/fault

# The hostile-input test with FUZZ_RUNS random seeds (`make test` runs one
# fixed seed); each run prints its seed for replay (tests/security).
FUZZ_RUNS ?= 5
fuzz: install
	for run in $$(seq $(FUZZ_RUNS)); do \
	  TIDELOG_FUZZ_SEED=random $(BIN)/python -m pytest -q -s tests/security/test_fuzz_services.py tests/security/test_fuzz_security_admin.py || exit 1; \
	done

# Throughput, latency and memory beside the same run's baselines, then the
# control plane's numbers (rebalance time, offset commits per second), the
# Spark source against Spark's Kafka source (Kafka on this machine) and the
# page-view pipeline's latency and the Spark sink's rows/s; then every figure
# that moved more than 15% from bench/baselines/<machine kind>.json (a report,
# not a failure; bench/baseline.py).
bench: install
	$(BIN)/python -m bench
	$(BIN)/python -m bench.group_bench
	$(BIN)/python -m bench.gateway_bench
	$(BIN)/python -m bench.spark_bench
	$(BIN)/python -m bench.spark_pipeline_bench
	$(BIN)/python -m bench.quota_bench
	$(BIN)/python -m bench.baseline compare

# This run's figures (bench/results/) become the committed baseline.
bench-baseline: install
	$(BIN)/python -m bench.baseline update

# The paper's pipeline on Spark (examples/spark/page_views.py), larger than in
# `make test`, on a throwaway cluster: every count printed as it arrives, then
# the produce-to-count latency at 1,000 events/s and the sink's rows/s.
demo-spark: install
	$(BIN)/python -m bench.spark_pipeline_bench --demo --seconds 60

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
