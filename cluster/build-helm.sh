#!/usr/bin/env bash
# Builds Helm's command from the Go module pinned by cluster/helm/go.sum, so the chart in
# charts/kjob can be rendered and installed by the tests without downloading a binary. Nothing
# but Go modules is downloaded.
#
# Its own cache (like cluster/build-addons.sh), keyed by the hash of the module files, this
# script and the Go version, so bumping Helm rebuilds neither the control plane nor the add-ons.
#
#   cluster/build-helm.sh     build if needed, print the path of the helm binary on stdout
#
# Environment: KJOB_CLUSTER_CACHE (default ~/.cache/kjob-cluster), GO (default go).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
GO=${GO:-go}
HELM_VERSION=v4.3.2
cache_root=${KJOB_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kjob-cluster}

fail() { echo "cluster/build-helm.sh: $*" >&2; exit 1; }
command -v "$GO" >/dev/null 2>&1 || fail "no Go toolchain ('$GO' not on PATH): cannot build Helm"

key=$(cd "$here" && { cat build-helm.sh helm/go.mod helm/go.sum; "$GO" version; } | sha256sum | cut -c1-16)
out="$cache_root/helm-$key"
if [ -f "$out/.complete" ]; then
  echo "$out/bin/helm"
  exit 0
fi
rm -rf "$out.partial"
mkdir -p "$out.partial/bin"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly GOTOOLCHAIN=local
log="$cache_root/helm-$key.build.log"
: >"$log"
echo "cluster/build-helm.sh: building Helm $HELM_VERSION (log: $log)" >&2
if ! (cd "$here/helm" && "$GO" build -p 2 -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
  -o "$out.partial/bin/helm" helm.sh/helm/v4/cmd/helm) >>"$log" 2>&1; then
  tail -n 20 "$log" >&2
  fail "building Helm failed (module download or compile; full log: $log)"
fi
touch "$out.partial/.complete"
rm -rf "$out"
mv "$out.partial" "$out"
echo "$out/bin/helm"
