#!/usr/bin/env bash
# Follow docs/architecture.md's two recipes ("add a policy", "add a network profile") on a
# scratch copy of this checkout and run the tests there: the recipes pass the suite only
# if no test spells out the policies or networks it covers.
#
#   bash scripts/try-recipes.sh                 # the whole suite on the copy
#   bash scripts/try-recipes.sh tests/protocols # or what pytest is given
#
# The copy holds the checkout's files as they are now (tracked and untracked, not the
# ignored ones), plus, as the recipes say:
# - two policies in their own modules, imported by protocols/policies/_all.py: one plain
#   (recipe_fence) and one that needs the central host (recipe_central);
# - two shipped networks in testbed/links/presets/networks.toml: one from its own traces
#   (recipe_lte: traces/Recipe-LTE.up/.down with a row in traces/README.md) and one with
#   a fixed rate (recipe_wired).
# It runs with this checkout's .venv, the copy first on PYTHONPATH (node processes the
# tests start import from the copy too). Nothing in the checkout changes; the copy is
# removed at the end. Exit status: pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=$root/.venv/bin/python
[ -x "$python" ] || { echo "try-recipes: no .venv here; run bash scripts/setup.sh" >&2; exit 3; }
work=$(mktemp -d /tmp/try-recipes.XXXXXX)
trap 'rm -rf "$work"' EXIT
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$work"
cd "$work"

# Recipe: add a policy (1. a module with a registered Policy; 2. imported in _all.py)
cat > protocols/policies/recipe_fence.py <<'PY'
"""A policy added by scripts/try-recipes.sh, as docs/architecture.md says."""

from __future__ import annotations

from protocols.policies.planfence import PlanFence
from protocols.policies.registry import register


@register
class RecipeFence(PlanFence):
    """As PlanFence, under another name."""

    name = "recipe_fence"
    display_name = "Recipe fence"
PY
cat > protocols/policies/recipe_central.py <<'PY'
"""A policy that needs the central host, added by scripts/try-recipes.sh."""

from __future__ import annotations

from protocols.policies.centralized_lineage import CentralizedLineage
from protocols.policies.registry import register


@register
class RecipeCentral(CentralizedLineage):
    """As centralized lineage, under another name."""

    name = "recipe_central"
    display_name = "Recipe central"
PY
"$python" - <<'PY'
from pathlib import Path

path = Path("protocols/policies/_all.py")
lines = [line.removesuffix("  # noqa: F401") for line in path.read_text().splitlines()]
head = [line for line in lines if not line.startswith("import ")]
imports = sorted({line for line in lines if line.startswith("import ")}
                 | {"import protocols.policies.recipe_central",
                    "import protocols.policies.recipe_fence"})
imports[-1] += "  # noqa: F401"
path.write_text("\n".join([*head, *imports]) + "\n")
PY

# Recipe: add a network profile (1. traces with a README row, or a fixed rate; 2. a
# [networks.NAME] table in the presets)
cp traces/TMobile-LTE-short.up traces/Recipe-LTE.up
cp traces/TMobile-LTE-short.down traces/Recipe-LTE.down
"$python" - <<'PY'
from pathlib import Path

readme = Path("traces/README.md")
lines = readme.read_text().splitlines()
row = next(line for line in lines if line.startswith("| `tmobile`"))
new = row.replace("`tmobile` (T-Mobile)", "`recipe_lte` (recipe)").replace(
    "TMobile-LTE-short", "Recipe-LTE")
lines.insert(lines.index(row) + 1, new)
readme.write_text("\n".join(lines) + "\n")
PY
cat >> testbed/links/presets/networks.toml <<'TOML'

[networks.recipe_lte]
description = "T-Mobile's traces under another name (scripts/try-recipes.sh)"
up_trace = "Recipe-LTE.up"
down_trace = "Recipe-LTE.down"
delay_ms = 20
queue = { kind = "droptail", packets = 1000 }

[networks.recipe_wired]
description = "a 50 Mbit/s wired link, 5 ms (scripts/try-recipes.sh)"
rate_kbit = 50000
delay_ms = 5
queue = { kind = "droptail", packets = 1000 }
TOML

export PYTHONPATH="$work${PYTHONPATH:+:$PYTHONPATH}"
"$python" - <<'PY'
import sys
from pathlib import Path

import protocols.policies
import testbed
from protocols.policies import policy_names
from testbed.links.profiles import profile_names

here = Path.cwd()
for module in (protocols.policies, testbed):
    if here not in Path(module.__file__).resolve().parents:
        sys.exit(f"try-recipes: {module.__name__} imports from {module.__file__}, not the copy")
missing = {"recipe_fence", "recipe_central"} - set(policy_names()) | (
    {"recipe_lte", "recipe_wired"} - set(profile_names()))
if missing:
    sys.exit(f"try-recipes: not registered after the recipes: {', '.join(sorted(missing))}")
print(f"try-recipes: the recipes applied in {here}")
PY
status=0
"$python" -m pytest -p no:cacheprovider "${@:-tests}" || status=$?
exit "$status"
