# kjob — build, test, lint, demo, bench, images, kind.
SHELL := /bin/bash
CARGO ?= cargo
NEXTEST_PROFILE ?= $(if $(CI),ci,default)

.PHONY: all build setup fmt lint test test-rust test-python demo bench bench-sim bench-queue chaos images kind-load clean

all: build

build:
	$(CARGO) build --workspace --bins

setup:
	./scripts/setup.sh

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## test: what CI runs. Installs what a fresh machine lacks, then lint + every test suite.
test: setup lint test-rust test-python

test-rust:
	$(CARGO) build --workspace --bins
	$(CARGO) nextest run --workspace --profile $(NEXTEST_PROFILE)

test-python:
	@if [ -d tests/python ]; then $(CARGO) build -p kjob-sim --bin kjob-sim && python3 -m pytest -q tests/python; fi

clean:
	$(CARGO) clean
