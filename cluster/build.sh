#!/usr/bin/env bash
# Builds the real control plane kjob is tested against — etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kubectl — from the Go modules pinned by the go.sum
# files beside this script. (The node agent that plays kubelet is kjob-node-agent, in Rust.) Nothing but Go modules is downloaded.
#
# Binaries land in a cache outside the repo keyed by the hash of the pinned module files, so a
# machine builds them once; later calls print the directory and return at once.
#
#   cluster/build.sh          build if needed, print the bin directory on stdout
#
# Environment: KJOB_CLUSTER_CACHE (default ~/.cache/kjob-cluster), GO (default go).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
GO=${GO:-go}
K8S_VERSION=1.37.2
cache_root=${KJOB_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kjob-cluster}

fail() { echo "cluster/build.sh: $*" >&2; exit 1; }
command -v "$GO" >/dev/null 2>&1 || fail "no Go toolchain ('$GO' not on PATH): cannot build the real control plane"

# The key covers every input of the build: module files, this script, and the Go version.
key=$(cd "$here" && { cat build.sh k8s/go.mod k8s/go.sum etcd/go.mod etcd/go.sum; "$GO" version; } | sha256sum | cut -c1-16)
bin="$cache_root/$key/bin"
if [ -x "$bin/kube-apiserver" ] && [ -x "$bin/etcd" ] && [ -f "$bin/.complete" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$bin.partial"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly GOTOOLCHAIN=local
log="$cache_root/$key/build.log"
: >"$log"
step() {
  local what=$1 dir=$2; shift 2
  echo "cluster/build.sh: building $what (log: $log)" >&2
  if ! (cd "$here/$dir" && "$@") >>"$log" 2>&1; then
    tail -n 20 "$log" >&2
    fail "building $what failed (module download or compile; full log: $log)"
  fi
}
ldf="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldf="$ldf -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=37 -X $p.gitTreeState=clean"
done
step "etcd" etcd "$GO" build -p 2 -trimpath -ldflags "-s -w" -o "$bin.partial/etcd" go.etcd.io/etcd/server/v3
step "kube-apiserver, kube-controller-manager, kube-scheduler and kubectl v$K8S_VERSION" k8s \
  "$GO" build -p 2 -trimpath -tags selinux,notest,grpcnotrace -ldflags "$ldf" -o "$bin.partial/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
touch "$bin.partial/.complete"
rm -rf "$bin"
mv "$bin.partial" "$bin"
echo "$bin"
