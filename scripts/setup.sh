#!/usr/bin/env bash
# Installs what a fresh machine lacks for kjob's tests and demo: redis-server (Debian), the Python
# client, pytest and selenium (PyPI) with Debian's chromium and chromium-driver for the web view's
# browser test, cargo-nextest and cargo-deny (crates.io). KJOB_SKIP_PYTHON=1 and KJOB_SKIP_NEXTEST=1
# leave out what a target does not run. Idempotent; quiet when everything is present.
set -euo pipefail

# Disk: a cold `make test` grows target/ to about 10 GiB (debug build, clippy, test binaries); a
# linker that runs out of space dies with "Bus error", which names no cause. Say it here instead.
# KJOB_DISK_GIB is what the calling make target needs (its default is make test's figure).
need_gib=${KJOB_DISK_GIB:-10}
target_dir=${CARGO_TARGET_DIR:-target}
probe=$target_dir
[ -d "$probe" ] || probe=.
avail_kib=$(df -Pk "$probe" | awk 'NR==2 {print $4}')
if [ -n "$avail_kib" ] && [ "$avail_kib" -lt $((need_gib * 1024 * 1024)) ]; then
  have_kib=0
  [ -d "$target_dir" ] && have_kib=$(du -sk "$target_dir" 2>/dev/null | awk '{print $1}')
  short_kib=$((need_gib * 1024 * 1024 - have_kib - avail_kib))
  if [ "$short_kib" -gt 0 ]; then
    echo "setup: $((avail_kib / 1024 / 1024)) GiB free on the filesystem of $target_dir/, and the" \
      "build needs about $need_gib GiB there ($((have_kib / 1024 / 1024)) GiB already built):" \
      "free $(((short_kib + 1024 * 1024 - 1) / 1024 / 1024)) GiB more (old clones' target/" \
      "directories, ~/.cache/go-build) and run it again" >&2
    exit 1
  fi
fi

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)
# The benchmark charts' text (plotters renders it with this TrueType font).
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_apt+=(fonts-dejavu-core)
if [ "${KJOB_SKIP_PYTHON:-0}" != "1" ]; then
  # tests/python/test_web_view.py opens kjob-queue's web view in headless Chromium.
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} from Debian's packages"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ "${KJOB_SKIP_PYTHON:-0}" != "1" ]; then
  # grpcio: tests/python/test_queue_auth.py calls kjob-queue as a hostile client; selenium:
  # test_web_view.py drives chromium (the versions are tests/python/requirements.txt's).
  if ! python3 -c 'import kubernetes, pytest, grpc, selenium; assert kubernetes.__version__.startswith("32."); assert selenium.__version__.startswith("4.")' 2>/dev/null; then
    echo "setup: installing tests/python/requirements.txt from PyPI"
    python3 -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/../tests/python/requirements.txt" >/dev/null
  fi
fi

# Only the test suites run nextest; the demo, benchmarks and chaos suite skip its ~6 min build.
if [ "${KJOB_SKIP_NEXTEST:-0}" != "1" ]; then
  command -v cargo-nextest >/dev/null 2>&1 || cargo install --locked cargo-nextest
fi

# The dependency policy (make deny, part of make test's lint): a pinned cargo-deny, built from
# crates.io (about 6 min on a busy 2-core machine; docs/testing.md), for the test suites and
# `make deny` (KJOB_NEED_DENY=1) only. Its licenses, bans and sources checks run offline.
CARGO_DENY_VERSION=0.20.2
if [ "${KJOB_SKIP_NEXTEST:-0}" != "1" ] || [ "${KJOB_NEED_DENY:-0}" = "1" ]; then
  if [ "$(cargo-deny --version 2>/dev/null)" != "cargo-deny $CARGO_DENY_VERSION" ]; then
    echo "setup: installing cargo-deny $CARGO_DENY_VERSION from crates.io"
    cargo install --locked "cargo-deny@$CARGO_DENY_VERSION"
  fi
fi
