#!/usr/bin/env bash
# Re-run the reference results committed under results/ (as root, after setup.sh):
# each campaign in results/configs/, one after another, then its report. A directory
# that already holds a run of that campaign is finished or grown (--extend), never
# repeated. JOBS=N runs N topologies at once (default 1; the committed runs used 4 for
# emulated-link cells and 1 for loopback cells, see results/README.md).
# Usage: [JOBS=N] bash scripts/reference_runs.sh [primary rates scope reuse density teams horizon
#         replanning handoff batches artifact d7 staggered]
set -euo pipefail
cd "$(dirname "$0")/.."
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(primary rates scope reuse density teams horizon replanning handoff batches artifact d7 staggered)
for name in "${names[@]}"; do
  grow=()
  [ -e "results/$name/manifest.json" ] && grow=(--extend)
  .venv/bin/testbed run "results/configs/$name.toml" --out "results/$name" \
    --jobs "${JOBS:-1}" "${grow[@]}"
  .venv/bin/testbed report "results/$name"
done
