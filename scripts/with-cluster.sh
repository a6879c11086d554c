#!/usr/bin/env bash
# Runs a command with the real control plane up (kjob-cluster up into $KJOB_TEST_CLUSTER_DIR,
# default target/test-cluster) and KJOB_TEST_CLUSTER pointing at it, so every real-server suite
# shares one kube-apiserver; stops it afterwards, whatever the command's result.
#
# A failed Go module download or build fails here with one line naming what failed. Only when
# no Go toolchain exists at all are the real-server suites skipped, and this says so.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
dir=${KJOB_TEST_CLUSTER_DIR:-$target/test-cluster}

if ! command -v go >/dev/null 2>&1; then
  echo "SKIP real-server suites: no Go toolchain on PATH, so the real control plane cannot be built" >&2
  exec "$@"
fi
bin=$(./cluster/build.sh) || { echo "with-cluster: building the real control plane failed (see above)" >&2; exit 1; }
# Kueue and JobSet too (docs/ecosystem.md), before any test: a test that asks for them would
# otherwise build them inside its own time limit, and tests in parallel would build them twice.
./cluster/build-addons.sh >/dev/null || { echo "with-cluster: building Kueue and JobSet failed (see above)" >&2; exit 1; }
# Helm for the chart's tests (tools/e2e/tests/helm_chart.rs), for the same reason.
./cluster/build-helm.sh >/dev/null || { echo "with-cluster: building Helm failed (see above)" >&2; exit 1; }
"$target/debug/kjob-cluster" up --dir "$dir" --bin-dir "$bin" --node-agent "$target/debug/kjob-node-agent" \
  || { echo "with-cluster: starting the real control plane failed (logs: $dir/logs)" >&2; exit 1; }
trap '"$target/debug/kjob-cluster" down --dir "$dir" >/dev/null 2>&1 || true' EXIT
export KJOB_TEST_CLUSTER=$(cd "$dir" && pwd)
export KJOB_KUBECTL=${KJOB_KUBECTL:-$bin/kubectl}
"$@"
# Every suite ran under kjob's own ServiceAccounts: RBAC refused none of their requests and the
# server rejected none of their writes.
"$target/debug/kjob-cluster" audit --dir "$dir"
