#!/usr/bin/env bash
# Builds the batch add-ons kjob is tested beside — Kueue's and JobSet's managers — from the Go
# modules pinned by the go.sum files in cluster/kueue and cluster/jobset, and copies the CRDs and
# webhook configurations those same module versions ship (config/components/{crd/bases,webhook}
# in the module zip) next to the binaries. Nothing but Go modules is downloaded.
#
# A cache separate from the control plane's (cluster/build.sh), keyed by the hash of these module
# files, this script and the Go version, so pinning or changing an add-on never rebuilds the
# control plane and a machine builds the add-ons once.
#
#   cluster/build-addons.sh   build if needed, print the add-ons directory on stdout
#                             (bin/kueue, bin/jobset, config/kueue/*.yaml, config/jobset/*.yaml)
#
# Environment: KJOB_CLUSTER_CACHE (default ~/.cache/kjob-cluster), GO (default go).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
GO=${GO:-go}
KUEUE_VERSION=v0.17.0
JOBSET_VERSION=v0.10.1
cache_root=${KJOB_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kjob-cluster}

fail() { echo "cluster/build-addons.sh: $*" >&2; exit 1; }
command -v "$GO" >/dev/null 2>&1 || fail "no Go toolchain ('$GO' not on PATH): cannot build Kueue and JobSet"

key=$(cd "$here" && { cat build-addons.sh kueue/go.mod kueue/go.sum jobset/go.mod jobset/go.sum; "$GO" version; } | sha256sum | cut -c1-16)
out="$cache_root/addons-$key"
if [ -f "$out/.complete" ]; then
  echo "$out"
  exit 0
fi
rm -rf "$out.partial"
mkdir -p "$out.partial/bin" "$out.partial/config/kueue" "$out.partial/config/jobset"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly GOTOOLCHAIN=local
log="$cache_root/addons-$key.build.log"
: >"$log"
step() {
  local what=$1 dir=$2; shift 2
  echo "cluster/build-addons.sh: $what (log: $log)" >&2
  if ! (cd "$here/$dir" && "$@") >>"$log" 2>&1; then
    tail -n 20 "$log" >&2
    fail "$what failed (module download or compile; full log: $log)"
  fi
}
# The module's directory in the module cache (downloaded by go.sum's hash if missing).
module_dir() { (cd "$here/$1" && "$GO" list -m -f '{{.Dir}}' "$2"); }
step "building Kueue $KUEUE_VERSION" kueue "$GO" build -p 2 -trimpath \
  -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
  -o "$out.partial/bin/kueue" sigs.k8s.io/kueue/cmd/kueue
step "building JobSet $JOBSET_VERSION" jobset "$GO" build -p 2 -trimpath -ldflags "-s -w" \
  -o "$out.partial/bin/jobset" sigs.k8s.io/jobset
kdir=$(module_dir kueue sigs.k8s.io/kueue) || fail "no module directory for sigs.k8s.io/kueue"
jdir=$(module_dir jobset sigs.k8s.io/jobset) || fail "no module directory for sigs.k8s.io/jobset"
for pair in "kueue:$kdir" "jobset:$jdir"; do
  name=${pair%%:*} dir=${pair#*:}
  cp "$dir"/config/components/crd/bases/*.yaml "$out.partial/config/$name/"
  cp "$dir"/config/components/webhook/manifests.yaml "$out.partial/config/$name/webhooks.yaml"
done
chmod -R u+w "$out.partial"
touch "$out.partial/.complete"
rm -rf "$out"
mv "$out.partial" "$out"
echo "$out"
