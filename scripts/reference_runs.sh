#!/usr/bin/env bash
# Re-run the reference results committed under results/ (as root, after setup.sh):
# each campaign in results/configs/, one after another, then its report.
# Usage: bash scripts/reference_runs.sh [primary rates scope reuse density]
set -euo pipefail
cd "$(dirname "$0")/.."
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(primary rates scope reuse density)
for name in "${names[@]}"; do
  resume=()
  [ -e "results/$name/manifest.json" ] && resume=(--resume)
  .venv/bin/testbed run "results/configs/$name.toml" --out "results/$name" "${resume[@]}"
  .venv/bin/testbed report "results/$name"
done
