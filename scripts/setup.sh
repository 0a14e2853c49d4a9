#!/usr/bin/env bash
# Set up everything the testbed needs on a fresh Debian/Ubuntu machine: system packages
# (as root), a virtualenv in .venv on the python3 this user can run, the project and its
# dev tools. As an ordinary user nothing is installed system-wide: what is missing is
# named, for root to install once (rootless runs and workers: docs/cluster.md).
set -euo pipefail
cd "$(dirname "$0")/.."
need_apt=()
command -v python3 >/dev/null || need_apt+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ "$(id -u)" = 0 ]; then
  [ -e /dev/net/tun ] || modprobe tun 2>/dev/null || true
  if [ ${#need_apt[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
  fi
elif [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: missing ${need_apt[*]}; as root, once: apt-get install ${need_apt[*]}" >&2
  exit 3
fi
if [ -x .venv/bin/python ] && ! .venv/bin/python -c '' 2>/dev/null; then
  echo "setup: .venv was built on an interpreter this user cannot run" \
       "($(readlink -f .venv/bin/python)); remove .venv or use a checkout of your own" >&2
  exit 3
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
