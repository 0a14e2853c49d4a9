#!/usr/bin/env bash
# Set up everything the testbed needs on a fresh Debian/Ubuntu machine (as root):
# system packages, a virtualenv in .venv, the project and its dev tools.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "setup: run as root (network namespaces and TUN devices need it)" >&2; exit 1
fi
need_apt=()
command -v python3 >/dev/null || need_apt+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
[ -e /dev/net/tun ] || modprobe tun 2>/dev/null || true
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi
python3 - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit("setup: Python 3.11 or newer is required, found " + sys.version.split()[0])
PY
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# The project and its tools, at the versions CI passed with (requirements.lock).
.venv/bin/python -m pip install -q -c requirements.lock -e '.[dev]'
echo "setup: ready (.venv)"
