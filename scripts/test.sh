#!/usr/bin/env bash
# Set up everything (system packages, .venv, the project) and run the checks:
# ruff, mypy and the whole test suite (pure, loopback node processes, and the
# privileged namespace/link tests, which need root).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
status=0
.venv/bin/ruff check protocols nodes testbed tests scripts || status=1
.venv/bin/mypy || status=1
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" = 5 ]; then
  echo "test: pytest collected no test; that is a broken checkout, not a pass" >&2
  rc=1
fi
[ "$rc" = 0 ] || status=$rc
exit $status
