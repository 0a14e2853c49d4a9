#!/usr/bin/env bash
# Set up everything (system packages, .venv, the project) and run the checks, lane by
# lane, each timed:
#
#   bash scripts/test.sh              every lane CI runs, in order: setup, lint (ruff and
#                                     mypy), main (every test but the claims checks: pure,
#                                     loopback node processes, and the privileged
#                                     namespace/link tests, which need root), claims
#   bash scripts/test.sh --fast       setup, lint and the fast tests: none marked
#                                     privileged, netem, slow or claims (after every edit;
#                                     about 2 minutes here)
#   bash scripts/test.sh --lane NAME  one lane: setup, lint, main, claims or fast
#                                     (.ci/run runs them one by one)
#   bash scripts/test.sh ARGS...      setup, lint and `pytest ARGS` (e.g. tests/protocols);
#                                     after --fast or --lane NAME, ARGS narrow that lane
#
# The claims lane (pytest -m claims) checks what the documents claim: results/README.md
# against the reference runs' data and docs/architecture.md's recipes on a copy of the
# checkout. Markers are defined in pyproject.toml. Each pytest lane prints its 15
# slowest tests and its seconds per layer (tests/conftest.py); the runner prints every
# lane's seconds at the end. The main and fast lanes run on TEST_WORKERS pytest-xdist
# workers (default 3; TEST_WORKERS=0 runs them in one process).
#
# While the main or fast tests run, a small campaign runs beside them again and again
# (another user's campaign on the same host: namespaces, ledgers, temporary directories,
# node and emulator processes of a run that is not the suite's). The suite must pass with
# it: every leftover check counts only what its own runs created (tests/leftovers.py).
# It is stopped (SIGTERM: it removes what it made) when pytest ends, and its results
# directory is deleted. PF_TEST_BESIDE=0 leaves it out.
set -uo pipefail
cd "$(dirname "$0")/.."

lanes=(setup lint main claims)
picked=
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --fast) lanes=(setup lint fast); picked=1; shift ;;
    --lane)
      case ${2:-} in
        setup|lint|main|claims|fast) lanes=("$2"); picked=1; shift 2 ;;
        *) echo "test: --lane takes setup, lint, main, claims or fast, got '${2:-}'" >&2
           exit 2 ;;
      esac ;;
    *) args+=("$1"); shift ;;
  esac
done
# ARGS alone: setup, lint and pytest ARGS, as before the lanes
[ -z "$picked" ] && [ ${#args[@]} -gt 0 ] && lanes=(setup lint pytest)

FAST='not privileged and not netem and not slow and not claims'

lane_setup() {
  bash scripts/setup.sh || return 1
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
  # The report's first screen is checked in a headless browser
  # (tests/testbed/report/test_first_screen.py). Chromium is about 100 MB to fetch and
  # 400 MB installed, too much for every user's setup.sh, so only the test lane installs
  # it; without it that one test is skipped.
  if ! command -v chromium >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "test: installing chromium for the report's browser check (about 100 MB)"
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } \
        >/dev/null 2>&1 || echo "test: could not install chromium; the browser check of the report is skipped" >&2
    else
      echo "test: chromium is missing (as root, once: apt-get install chromium); the browser check of the report is skipped" >&2
    fi
  fi
  # The Redis and etcd examples' tests (tests/testbed/run/test_store_examples.py) run the
  # real servers (a few MB from Debian); without them those tests are skipped.
  if ! command -v redis-server >/dev/null || ! command -v etcd >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "test: installing redis-server and etcd for the store examples' tests"
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server etcd-server etcd-client; } \
        >/dev/null 2>&1 || echo "test: could not install redis-server/etcd; the store examples' tests are skipped" >&2
    else
      echo "test: redis-server or etcd is missing (as root, once: apt-get install redis-server etcd-server etcd-client); the store examples' tests are skipped" >&2
    fi
  fi
}

lane_lint() {
  local rc=0
  .venv/bin/ruff check protocols nodes testbed tests scripts || rc=1
  .venv/bin/mypy || rc=1
  return $rc
}

beside_dir=
beside_pid=
start_beside() {
  [ "${PF_TEST_BESIDE:-1}" != 0 ] || return 0
  beside_dir=$(mktemp -d "${TMPDIR:-/tmp}/pf-beside-XXXXXX")
  local network=loopback
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
}

stop_beside() {
  [ -n "$beside_pid" ] || return 0
  kill -TERM "$beside_pid" 2>/dev/null
  wait "$beside_pid"
  local done_runs failed_runs
  done_runs=$(awk '$2 == 0' "$beside_dir/runs.txt" 2>/dev/null | wc -l)
  failed_runs=$(awk '$2 != 0' "$beside_dir/runs.txt" 2>/dev/null | wc -l)
  echo "test: the campaign beside the suite finished $done_runs times ($failed_runs failed)"
  if [ "$failed_runs" != 0 ]; then
    awk '$2 != 0 { print $1 }' "$beside_dir/runs.txt" | while read -r n; do
      tail -n 3 "$beside_dir/run-$n.log" | sed "s/^/test: beside run $n: /" >&2
    done
  fi
  rm -rf "$beside_dir"
  beside_dir=
  beside_pid=
}
trap stop_beside EXIT

# pytest over the lane's marker expression (none: every test ARGS name) and ARGS
run_pytest() {
  local beside=$1 expr=$2 rc
  shift 2
  [ "$beside" = 1 ] && start_beside
  # the main and fast lanes run on TEST_WORKERS pytest-xdist workers (default 3: most
  # tests wait on processes, sockets and links, not on these 2 cores); 0 runs them in
  # this process
  local workers=()
  [ "$beside" = 1 ] && [ "${TEST_WORKERS:-3}" != 0 ] && workers=(-n "${TEST_WORKERS:-3}")
  if [ -n "$expr" ]; then
    .venv/bin/python -m pytest --durations=15 "${workers[@]}" -m "$expr" "${args[@]}"
  else
    .venv/bin/python -m pytest --durations=15 "${workers[@]}" "${args[@]}"
  fi
  rc=$?
  if [ "$rc" = 5 ]; then
    if [ ${#args[@]} -eq 0 ]; then
      echo "test: pytest collected no test; that is a broken checkout, not a pass" >&2
    else
      echo "test: no test of this lane is among '${args[*]}'" >&2
    fi
    rc=1
  fi
  stop_beside
  return $rc
}

status=0
summary=()
for lane in "${lanes[@]}"; do
  if [ "$lane" != setup ] && [ ! -x .venv/bin/python ]; then
    echo "test: no .venv; run the setup lane first (bash scripts/test.sh --lane setup)" >&2
    exit 1
  fi
  echo "test: lane $lane"
  t0=$(date +%s)
  case $lane in
    setup) lane_setup ;;
    lint) lane_lint ;;
    main) run_pytest 1 'not claims' ;;
    claims) run_pytest 0 claims ;;
    fast) run_pytest 1 "$FAST" ;;
    pytest) run_pytest 1 '' ;;
  esac
  rc=$?
  seconds=$(( $(date +%s) - t0 ))
  echo "test: lane $lane: exit $rc after $seconds s"
  summary+=("$lane ${seconds} s$([ "$rc" = 0 ] || echo " (exit $rc)")")
  [ "$rc" = 0 ] || [ "$status" != 0 ] || status=$rc
  if [ "$lane" = setup ] && [ "$rc" != 0 ]; then
    break  # nothing to test with
  fi
done
summary_line=$(printf '%s, ' "${summary[@]}")
echo "test: lanes: ${summary_line%, }"
exit $status
