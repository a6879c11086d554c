# kjob — build, test, lint, demo, bench, images, kind.
SHELL := /bin/bash
CARGO ?= cargo
NEXTEST_PROFILE ?= $(if $(CI),ci,default)
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
KIND_CLUSTER ?= kjob
COMPONENTS := queue watcher worker
# The real control plane (make cluster-up): KUBELET=on|off, JOB_CONTROLLER=kjob|upstream.
KUBELET ?= on
JOB_CONTROLLER ?= kjob
CLUSTER_DIR ?= $(TARGET_DIR)/cluster

.PHONY: all build setup fmt lint deny test test-rust test-python test-rust-run test-python-run demo bench bench-upstream bench-scale bench-fairness bench-sim bench-watcher bench-queue bench-queue-cluster \
	bench-reconcile chaos images kind-up kind-load deploy clean cluster-build cluster-build-addons cluster-build-helm cluster-up cluster-down \
	diff-upstream test-diff-run

all: build

## build: every binary (debug)
build:
	$(CARGO) build --locked --workspace --bins

## setup: install what a fresh machine lacks (redis-server, Python client, pytest)
setup:
	./scripts/setup.sh

fmt:
	$(CARGO) fmt --all

## lint: rustfmt check, clippy with warnings as errors, and the dependency policy (deny)
lint: deny
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings

## deny: cargo-deny's licenses, bans and sources checks against deny.toml, offline (the advisory
## database cannot be reached from here); scripts/setup.sh installs the pinned cargo-deny
deny:
	@KJOB_NEED_DENY=1 KJOB_SKIP_PYTHON=1 KJOB_SKIP_NEXTEST=1 KJOB_DISK_GIB=0 ./scripts/setup.sh
	$(CARGO) deny --offline --locked check licenses bans sources

## test: what CI runs. Installs what a fresh machine lacks (redis-server, cargo-nextest, the
## Python client, the Go-built control plane), then lint + every test suite, the real-server
## ones on one control plane started for the run (scripts/with-cluster.sh), then the
## differential suite at CI size (test-diff-run).
test: setup lint
	$(CARGO) build --locked --workspace --bins
	./scripts/with-cluster.sh $(MAKE) --no-print-directory test-rust-run test-python-run
	$(MAKE) --no-print-directory test-diff-run

test-rust:
	$(CARGO) build --locked --workspace --bins
	./scripts/with-cluster.sh $(MAKE) --no-print-directory test-rust-run

test-python:
	$(CARGO) build --locked --workspace --bins
	./scripts/with-cluster.sh $(MAKE) --no-print-directory test-python-run

test-rust-run:
	$(CARGO) nextest run --locked --workspace --profile $(NEXTEST_PROFILE)

## test-diff-run: the differential suite at CI size (the built-in cases and DIFF_CI_CASES generated
## ones of seed DIFF_CI_SEED) on its own two control planes (it needs KUBELET=off and one with
## upstream's Job controller, which the shared test cluster is not); then the Kueue and JobSet
## scenarios again with kjob taking only the Jobs naming it (upstream's controller beside it);
## binaries from make build.
DIFF_CI_SEED ?= 1
DIFF_CI_CASES ?= 300
test-diff-run:
	@if ! command -v go >/dev/null 2>&1; then \
	  echo "SKIP diff-upstream: no Go toolchain on PATH, so the real control plane cannot be built" >&2; \
	else \
	  $(TARGET_DIR)/debug/kjob-diff-upstream --bin-dir $(TARGET_DIR)/debug --out $(TARGET_DIR)/diff \
	    --seed $(DIFF_CI_SEED) --cases $(DIFF_CI_CASES) && \
	  $(TARGET_DIR)/debug/kjob-diff-upstream --bin-dir $(TARGET_DIR)/debug --out $(TARGET_DIR)/diff-managed-by \
	    --kjob-takes managed-by --case 'kueue-*,jobset-*'; \
	fi

test-python-run:
	KJOB_SIM_BIN=$(TARGET_DIR)/debug/kjob-sim python3 -m pytest -q tests/python

## demo: the whole stack against kjob-sim, running the Jobs in examples/ (CLUSTER=real: on the
## real control plane of make cluster-up, started first when it is not up)
CLUSTER ?= sim
demo:
	KJOB_SKIP_PYTHON=1 KJOB_SKIP_NEXTEST=1 KJOB_DISK_GIB=4 ./scripts/setup.sh
	$(CARGO) build --locked $(addprefix --bin ,kjob-demo kjob-sim $(addprefix kjob-,$(COMPONENTS)))
ifeq ($(CLUSTER),real)
	$(CARGO) build --locked --bin kjob-cluster --bin kjob-node-agent
	[ -f $(CLUSTER_DIR)/cluster.json ] || $(MAKE) cluster-up
	$(TARGET_DIR)/debug/kjob-demo --cluster $(CLUSTER_DIR) $(DEMO_ARGS)
else
	$(TARGET_DIR)/debug/kjob-demo $(DEMO_ARGS)
endif

## bench: the whole-stack benchmark; report and plots under target/bench/
bench:
	KJOB_SKIP_PYTHON=1 KJOB_SKIP_NEXTEST=1 KJOB_DISK_GIB=6 ./scripts/setup.sh
	$(CARGO) build --locked --release -p kjob-bench -p kjob-sim -p kjob-queue -p kjob-watcher -p kjob-worker --bins
	$(TARGET_DIR)/release/kjob-bench --bin-dir $(TARGET_DIR)/release $(BENCH_ARGS)

## bench-upstream: kjob side by side with kube-controller-manager's Job controller on fresh real
## control planes (upstream defaults, upstream tuned, kjob with 1 and 2 workers, interleaved, then
## reversed); target/bench/upstream.md, upstream.json and PNG charts (BENCH_ARGS=--quick: one short pass)
bench-upstream: cluster-build
	KJOB_SKIP_PYTHON=1 KJOB_SKIP_NEXTEST=1 KJOB_DISK_GIB=6 ./scripts/setup.sh
	$(CARGO) build --locked --release -p kjob-bench -p kjob-sim -p kjob-queue -p kjob-watcher -p kjob-worker --bins
	$(TARGET_DIR)/release/kjob-bench-upstream --bin-dir $(TARGET_DIR)/release --out $(TARGET_DIR)/bench $(BENCH_ARGS)

## bench-scale: managed-cluster budgets: upstream at its defaults against kjob with 1, 2, 4 and 8
## workers each at those defaults, and 4 workers sharing one such budget; 1,000-Job bursts, two
## passes (target/bench/scale/upstream.md; BENCH_ARGS overrides, e.g. --burst-jobs=400 --passes=1)
bench-scale: cluster-build
	KJOB_SKIP_PYTHON=1 KJOB_SKIP_NEXTEST=1 KJOB_DISK_GIB=6 ./scripts/setup.sh
	$(CARGO) build --locked --release -p kjob-bench -p kjob-sim -p kjob-queue -p kjob-watcher -p kjob-worker --bins
	$(TARGET_DIR)/release/kjob-bench-upstream --bin-dir $(TARGET_DIR)/release --out $(TARGET_DIR)/bench/scale \
		--configs a,m1,m2,m4,m8,mt4 --workloads burst --burst-jobs 1000 --passes 2 --apiserver-profile false $(BENCH_ARGS)

## bench-fairness: the flood: one namespace creates 2,000 Jobs at once while ten others each create
## one every 10 s; upstream against kjob (one worker), fair and with fairness off (--lease-order
## fifo), at upstream's default budget (a, m1, f1) and tuned (b, c, cf); one pass
## (target/bench/fairness/upstream.md; BENCH_ARGS overrides)
bench-fairness: cluster-build
	KJOB_SKIP_PYTHON=1 KJOB_SKIP_NEXTEST=1 KJOB_DISK_GIB=6 ./scripts/setup.sh
	$(CARGO) build --locked --release -p kjob-bench -p kjob-sim -p kjob-queue -p kjob-watcher -p kjob-worker --bins
	$(TARGET_DIR)/release/kjob-bench-upstream --bin-dir $(TARGET_DIR)/release --out $(TARGET_DIR)/bench/fairness \
		--configs a,m1,f1,b,c,cf --workloads flood --passes 1 --apiserver-profile false $(BENCH_ARGS)

## bench-watcher: the watcher's CPU per pod event, --watch-encoding protobuf against json, on the
## real control plane (BENCH_ARGS: --pods, --updates, --passes)
bench-watcher: cluster-build
	$(CARGO) build --locked --release -p kjob-bench -p kjob-sim -p kjob-queue -p kjob-watcher -p kjob-worker --bins
	$(TARGET_DIR)/release/kjob-watcher-bench --bin-dir $(TARGET_DIR)/release --out $(TARGET_DIR)/bench/watcher $(BENCH_ARGS)

## bench-sim: kjob-sim's raw throughput (creates/s, status updates/s, watch events/s, RSS)
bench-sim:
	$(CARGO) build --locked --release -p kjob-sim --bins
	$(TARGET_DIR)/release/kjob-sim-bench $(BENCH_ARGS)

## bench-queue: kjob-queue vs BullMQ (node + npm): items/s, Redis commands and CPU per item, enqueue-to-lease latency
bench-queue:
	KJOB_SKIP_PYTHON=1 KJOB_SKIP_NEXTEST=1 KJOB_DISK_GIB=4 ./scripts/setup.sh
	$(CARGO) build --locked --release -p kjob-bench --bin kjob-queue-bench
	RUST_LOG=warn $(TARGET_DIR)/release/kjob-queue-bench run $(BENCH_ARGS)

## bench-queue-cluster: bench-queue's kjob rounds on one Redis and on a 3-master Redis Cluster (plain): items/s, keys and commands per master
bench-queue-cluster:
	KJOB_SKIP_PYTHON=1 KJOB_SKIP_NEXTEST=1 KJOB_DISK_GIB=4 ./scripts/setup.sh
	$(CARGO) build --locked --release -p kjob-bench --bin kjob-queue-bench
	RUST_LOG=warn $(TARGET_DIR)/release/kjob-queue-bench run --topology single,cluster --security plain $(BENCH_ARGS)

## bench-reconcile: Criterion bench of one sync plan for Indexed Jobs of 1k/10k/20k pods
bench-reconcile:
	$(CARGO) bench --locked -p kjob-reconcile --bench plan

## chaos: the fault suite (kill workers, restart queue and redis, kill the leader, API errors)
chaos:
	KJOB_SKIP_PYTHON=1 KJOB_SKIP_NEXTEST=1 KJOB_DISK_GIB=5 ./scripts/setup.sh
	$(CARGO) build --locked --workspace --bins
	$(TARGET_DIR)/debug/kjob-chaos --bin-dir $(TARGET_DIR)/debug $(CHAOS_ARGS)

## diff-upstream: every case under kube-controller-manager's Job controller and under kjob (two
## fresh control planes up at once, KUBELET=off, a scripted kubelet), compared; report in
## target/diff/ (DIFF_ARGS: --seed N --cases N --case NAME --parallel N --reruns N)
diff-upstream: cluster-build cluster-build-addons
	$(CARGO) build --locked -p kjob-queue -p kjob-watcher -p kjob-worker -p kjob-sim -p kjob-diff --bins
	$(TARGET_DIR)/debug/kjob-diff-upstream --bin-dir $(TARGET_DIR)/debug --out $(TARGET_DIR)/diff $(DIFF_ARGS)

## cluster-build: build etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl
## from the Go modules pinned in cluster/ (once per go.sum; cached outside the repo)
cluster-build:
	./cluster/build.sh

## cluster-build-addons: build Kueue's and JobSet's managers from the Go modules pinned in
## cluster/kueue and cluster/jobset, with their CRDs and webhook configurations (once per go.sum;
## cached outside the repo, apart from the control plane's build)
cluster-build-addons:
	./cluster/build-addons.sh

## cluster-build-helm: build Helm from the Go module pinned in cluster/helm, for the chart's
## tests (once per go.sum; cached outside the repo); prints the helm binary's path
cluster-build-helm:
	./cluster/build-helm.sh

## cluster-up: the real control plane on loopback, in the background (KUBELET=off, JOB_CONTROLLER=upstream,
## ADDONS=kueue,jobset: Kueue's and JobSet's managers beside it, docs/ecosystem.md; KJOB_WORKERS=2:
## kjob's services too, secured as deployed, taking every Job or, with JOB_CONTROLLER=upstream,
## the Jobs naming kjob)
ADDONS ?=
cluster-up: cluster-build $(if $(ADDONS),cluster-build-addons)
	$(CARGO) build --locked -p kjob-testkit -p kjob-sim --bins $(if $(KJOB_WORKERS),$(addprefix --bin ,$(addprefix kjob-,$(COMPONENTS))))
	$(TARGET_DIR)/debug/kjob-cluster up --dir $(CLUSTER_DIR) --kubelet $(KUBELET) --job-controller $(JOB_CONTROLLER) $(if $(ADDONS),--addons $(ADDONS)) $(if $(KJOB_WORKERS),--kjob-workers $(KJOB_WORKERS)) $(CLUSTER_ARGS)

## cluster-down: stop every process of make cluster-up (the add-ons' managers too) and remove its data
cluster-down:
	$(CARGO) build --locked -p kjob-testkit --bins
	$(TARGET_DIR)/debug/kjob-cluster down --dir $(CLUSTER_DIR)

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
