#!/usr/bin/env bash
# Set up everything (system packages, .venv, the project) and run the checks:
# ruff, mypy and the whole test suite (pure, loopback node processes, and the
# privileged namespace/link tests, which need root).
#
# While pytest runs, a small campaign runs beside it again and again (another user's
# campaign on the same host: namespaces, ledgers, temporary directories, node and
# emulator processes of a run that is not the suite's). The suite must pass with it:
# every leftover check counts only what its own runs created (tests/leftovers.py).
# It is stopped (SIGTERM: it removes what it made) when pytest ends, and its results
# directory is deleted. PF_TEST_BESIDE=0 leaves it out.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
# The suite's own programs run inside topologies (tests/testbed/net: `testbed exec` and
# `shell` run ping); a fresh machine may not have it (CI 2026-12-03: three tests failed
# with "ping: No such file or directory"). Installed as root, named otherwise.
if ! command -v ping >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iputils-ping; } \
      >/dev/null 2>&1 || echo "test: could not install iputils-ping; the ping tests will fail" >&2
  else
    echo "test: ping is missing (as root, once: apt-get install iputils-ping); the ping tests will fail" >&2
  fi
fi
status=0
.venv/bin/ruff check protocols nodes testbed tests scripts || status=1
.venv/bin/mypy || status=1

beside_dir=
beside_pid=
if [ "${PF_TEST_BESIDE:-1}" != 0 ]; then
  beside_dir=$(mktemp -d "${TMPDIR:-/tmp}/pf-beside-XXXXXX")
  network=loopback
  [ "$(id -u)" = 0 ] && [ -e /dev/net/tun ] && network=fixed
  cat >"$beside_dir/beside.toml" <<TOML
# scripts/test.sh: a campaign beside the suite
name = "beside"
seed = 11
templates = 3

[options]
rpc_timeout_s = 10
episode_timeout_s = 120
durability = "normal"

[grid]
policy = ["planfence", "batched_all_key"]
network = ["$network"]
rho = [4]
agents = [3]
keys = [6]
connection = ["fresh"]
units = [16]
TOML
  (
    run=
    trap '[ -n "$run" ] && kill -TERM "$run" 2>/dev/null && wait "$run"; exit 0' TERM
    n=0
    while :; do
      n=$((n + 1))
      .venv/bin/testbed run "$beside_dir/beside.toml" --jobs 2 --out "$beside_dir/run-$n" \
        >"$beside_dir/run-$n.log" 2>&1 &
      run=$!
      wait "$run"
      echo "$n $?" >>"$beside_dir/runs.txt"
    done
  ) &
  beside_pid=$!
  echo "test: a campaign runs beside the suite ($network, again and again; $beside_dir)"
fi

.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" = 5 ]; then
  echo "test: pytest collected no test; that is a broken checkout, not a pass" >&2
  rc=1
fi
[ "$rc" = 0 ] || status=$rc

if [ -n "$beside_pid" ]; then
  kill -TERM "$beside_pid" 2>/dev/null
  wait "$beside_pid"
  done_runs=$(awk '$2 == 0' "$beside_dir/runs.txt" 2>/dev/null | wc -l)
  failed_runs=$(awk '$2 != 0' "$beside_dir/runs.txt" 2>/dev/null | wc -l)
  echo "test: the campaign beside the suite finished $done_runs times ($failed_runs failed)"
  if [ "$failed_runs" != 0 ]; then
    awk '$2 != 0 { print $1 }' "$beside_dir/runs.txt" | while read -r n; do
      tail -n 3 "$beside_dir/run-$n.log" | sed "s/^/test: beside run $n: /" >&2
    done
  fi
  rm -rf "$beside_dir"
fi
exit $status
