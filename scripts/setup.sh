#!/usr/bin/env bash
# Installs what a fresh machine lacks for kjob's tests and demo: redis-server (Debian), the Python
# client and pytest (PyPI). Idempotent; quiet when everything is present.
set -euo pipefail

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)
# The benchmark charts' text (plotters renders it with this TrueType font).
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_apt+=(fonts-dejavu-core)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} from Debian's packages"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ "${KJOB_SKIP_PYTHON:-0}" != "1" ]; then
  if ! python3 -c 'import kubernetes, pytest; assert kubernetes.__version__.startswith("32.")' 2>/dev/null; then
    echo "setup: installing kubernetes==32.* and pytest from PyPI"
    python3 -m pip install -q --disable-pip-version-check 'kubernetes==32.*' 'pytest>=8' >/dev/null
  fi
fi

command -v cargo-nextest >/dev/null 2>&1 || cargo install --locked cargo-nextest
