#!/usr/bin/env bash
# Set up everything, run the `demo` campaign (loopback and the AT&T LTE trace, five
# policies, rho 1 and 4) and write its report under results/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/testbed doctor
resume=()
# A second run finishes (or re-reports) the first instead of refusing the directory.
[ -e results/demo/manifest.json ] && resume=(--resume)
.venv/bin/testbed run demo --out results/demo "${resume[@]}" "$@"
.venv/bin/testbed report results/demo
echo "demo: open results/demo/report.md (or report.html)"
