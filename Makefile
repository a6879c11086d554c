# kjob — build, test, lint, demo, bench, images, kind.
SHELL := /bin/bash
CARGO ?= cargo
NEXTEST_PROFILE ?= $(if $(CI),ci,default)
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
KIND_CLUSTER ?= kjob
COMPONENTS := queue watcher worker

.PHONY: all build setup fmt lint test test-rust test-python demo bench bench-sim bench-queue \
	bench-reconcile chaos images kind-up kind-load deploy clean

all: build

## build: every binary (debug)
build:
	$(CARGO) build --workspace --bins

## setup: install what a fresh machine lacks (redis-server, Python client, pytest)
setup:
	./scripts/setup.sh

fmt:
	$(CARGO) fmt --all

## lint: rustfmt check and clippy with warnings as errors
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## test: what CI runs. Installs what a fresh machine lacks, then lint + every test suite.
test: setup lint test-rust test-python

test-rust:
	$(CARGO) build --workspace --bins
	$(CARGO) nextest run --workspace --profile $(NEXTEST_PROFILE)

test-python:
	$(CARGO) build --workspace --bins
	KJOB_SIM_BIN=$(TARGET_DIR)/debug/kjob-sim python3 -m pytest -q tests/python

## demo: the whole stack against kjob-sim, running the Jobs in examples/
demo:
	KJOB_SKIP_PYTHON=1 ./scripts/setup.sh
	$(CARGO) build -p kjob-demo -p kjob-sim -p kjob-queue -p kjob-watcher -p kjob-worker --bins
	$(TARGET_DIR)/debug/kjob-demo $(DEMO_ARGS)

## bench: the whole-stack benchmark; report and plots under target/bench/
bench:
	KJOB_SKIP_PYTHON=1 ./scripts/setup.sh
	$(CARGO) build --release -p kjob-bench -p kjob-sim -p kjob-queue -p kjob-watcher -p kjob-worker --bins
	$(TARGET_DIR)/release/kjob-bench --bin-dir $(TARGET_DIR)/release $(BENCH_ARGS)

## bench-sim: kjob-sim's raw throughput (creates/s, status updates/s, watch events/s, RSS)
bench-sim:
	$(CARGO) build --release -p kjob-sim --bins
	$(TARGET_DIR)/release/kjob-sim-bench $(BENCH_ARGS)

## bench-queue: kjob-queue vs BullMQ (node + npm): items/s, Redis commands and CPU per item, enqueue-to-lease latency
bench-queue:
	KJOB_SKIP_PYTHON=1 ./scripts/setup.sh
	$(CARGO) build --release -p kjob-bench --bin kjob-queue-bench
	RUST_LOG=warn $(TARGET_DIR)/release/kjob-queue-bench run $(BENCH_ARGS)

## bench-reconcile: Criterion bench of one sync plan for Indexed Jobs of 1k/10k/20k pods
bench-reconcile:
	$(CARGO) bench -p kjob-reconcile --bench plan

## chaos: the fault suite (kill workers, restart queue and redis, kill the leader, API errors)
chaos:
	KJOB_SKIP_PYTHON=1 ./scripts/setup.sh
	$(CARGO) build --workspace --bins
	$(TARGET_DIR)/debug/kjob-chaos --bin-dir $(TARGET_DIR)/debug $(CHAOS_ARGS)

## images: container images kjob/<component>:dev (needs a Docker engine)
images:
	for c in $(COMPONENTS); do docker build --build-arg BIN=kjob-$$c -t kjob/$$c:dev . || exit 1; done

## kind-up: a kind cluster beside the built-in Job controller
kind-up:
	kind create cluster --name $(KIND_CLUSTER) --config deploy/kind/cluster.yaml

## kind-load: load the images into the kind cluster
kind-load:
	for c in $(COMPONENTS); do kind load docker-image kjob/$$c:dev --name $(KIND_CLUSTER) || exit 1; done

## deploy: apply the kind overlay to the current kubectl context
deploy:
	kubectl apply -k deploy/overlays/kind

clean:
	$(CARGO) clean
