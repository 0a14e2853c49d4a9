"""``testbed run CAMPAIGN --until-resolved PCT --compare A:B``: grow until resolved.

Rules:

1. Round 1 runs the campaign as asked (``--resume``/``--extend`` as given, with
   ``--repeats`` and ``--rerun-disturbed``). After every round the results are read as
   the report reads them and every watched comparison (``--compare A:B``: policy A
   against B in every configuration that has both, ``testbed/report/spread.py``) is
   printed with its resolution and verdict.
2. The growth rule (``testbed/report/sizing.py`` rule 3, with the curve fitted to the
   run's own nested template prefixes once it has 12 templates) picks the next size: more
   templates (the round runs with ``--extend``: only the new templates' episodes), then
   more repeats (``--resume`` with the larger ``--repeats``: only the new attempts),
   until the worst resolution is at most PCT or ``--max-templates`` and
   ``--max-repeats`` are both reached. The last line says which, and the manifest's
   ``until_resolved`` records every round.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.campaign.model import Campaign
from testbed.campaign.workload import FAMILIES, TEMPLATES_PER_FAMILY
from testbed.errors import UserError
from testbed.report.load import load_run
from testbed.report.sizing import Curve, Size, next_size
from testbed.report.spread import comparisons, resolution_curve
from testbed.report.stats import VERDICT_TEXT, tie_band
from testbed.results.rundir import RunDir
from testbed.run.attempts import AttemptPolicy

Execute = Callable[[Campaign, AttemptPolicy, bool, bool], None]
CATALOGUE = len(FAMILIES) * TEMPLATES_PER_FAMILY
#: A floor is fitted only from runs this large (three sizes: 6, 9 and 12 templates).
MIN_FIT_TEMPLATES = 12


def watched(out: Path, specs: list[tuple[str, str]], *, draws: int = 10_000
            ) -> list[tuple[str, float, str, Curve | None]]:
    """(label, resolution, verdict, fitted curve) of every watched comparison in the run
    at ``out``."""
    run = load_run(out)
    found: list[tuple[str, float, str, Curve | None]] = []
    for a, b in specs:
        results = comparisons(run, a, b, draws=draws)
        if not results:
            found.append((f"{a}:{b}", float("nan"), "not comparable (no paired episodes)",
                          None))
        for config, result, pairs in results:
            where = ", ".join(f"{k}={config[k]}" for k in ("network", "connection", "rho",
                                                            "keys") if k in config)
            curve, _ = resolution_curve(pairs)
            label = (f"{a}:{b} [{where}] change {100 * result.change:+.1f}% "
                     f"[{100 * result.change_low:+.1f}%, {100 * result.change_high:+.1f}%]")
            found.append((label, result.resolution, VERDICT_TEXT[result.verdict], curve))
    return found


def run_until_resolved(args: argparse.Namespace, campaign: Campaign, out: Path,
                       execute: Execute, console: Any) -> int:
    """Rules 1-2; returns the exit status (0 whether resolved or capped: the last line
    says which)."""
    if not args.compare:
        raise UserError("--until-resolved: name the comparisons to resolve with --compare "
                        "A:B (e.g. --compare planfence:batched_all_key)")
    policies = {cell.policy for cell in campaign.cells()}
    for a, b in args.compare:
        for name in (a, b):
            if name not in policies:
                raise UserError(f"--compare: policy {name!r} is not in the campaign's grid; "
                                f"allowed: {', '.join(sorted(policies))}")
    target = args.until_resolved / 100.0
    max_templates = args.max_templates or CATALOGUE
    if max_templates > CATALOGUE:
        raise UserError(f"--max-templates: {max_templates} is not allowed; allowed: "
                        f"1..{CATALOGUE}")
    size = Size(len(campaign.templates), args.repeats)
    if size.templates > max_templates or size.repeats > args.max_repeats:
        raise UserError("--max-templates/--max-repeats: below the campaign's own size "
                        f"({size.templates} templates, {size.repeats} repeats)")
    resume, extend = args.resume, args.extend
    rounds: list[dict[str, Any]] = []
    band_low, band_high = tie_band()
    while True:
        grown = campaign.with_templates(size.templates) \
            if size.templates != len(campaign.templates) else campaign
        execute(grown, AttemptPolicy(size.repeats, args.rerun_disturbed), resume, extend)
        found = watched(out, args.compare)
        values = [r for _, r, _, _ in found]
        worst = float("nan") if not values or any(math.isnan(r) for r in values) \
            else max(values)
        curve = next((c for _, r, _, c in found if r == worst), None)
        console.print(f"until-resolved: {size.templates} templates x {size.repeats} repeats "
                      f"(target ±{args.until_resolved:g}%, tie band "
                      f"{100 * band_low:+.0f}%..{100 * band_high:+.1f}%):")
        for label, resolution, verdict, _ in found:
            console.print(f"  {label} ±{100 * resolution:.1f}%: {verdict}")
        step = next_size(size, worst, target, max_templates=max_templates,
                         max_repeats=args.max_repeats,
                         curve=curve if size.templates >= MIN_FIT_TEMPLATES else None)
        rounds.append({"templates": size.templates, "repeats": size.repeats,
                       "worst_resolution": worst, "next": step.reason})
        _record(out, rounds, target)
        if step.size is None:
            console.print(f"until-resolved: {step.reason}")
            return 0
        console.print(f"until-resolved: growing, {step.reason}")
        resume, extend = step.size.templates == size.templates, \
            step.size.templates != size.templates
        size = step.size


def _record(out: Path, rounds: list[dict[str, Any]], target: float) -> None:
    run_dir = RunDir(out)
    run_dir.update_manifest(until_resolved={"target": target, "rounds": rounds})
