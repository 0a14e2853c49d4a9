"""``testbed check``'s expected resolution: how precisely the campaign can compare.

For every configuration of the campaign holding PlanFence and another policy, the stored
spread of earlier runs on the same network (``testbed/report/spread.py``, rule 2)
predicts the half-width of the paired stall comparison's 95% interval at this
campaign's templates and ``--repeats`` (``testbed/report/sizing.py``, rule 1), and the
templates it would take to reach a few targets. A configuration with no measured
spread says so; nothing is invented for it.
"""

from __future__ import annotations

from typing import Any

from testbed.campaign.model import Campaign
from testbed.report.spread import SPREAD_TABLE, lookup, read_spread_table
from testbed.report.stats import TIE_FRACTION

TARGETS = (0.10, 0.05)
MAX_LINES = 12


def resolution_lines(campaign: Campaign, *, repeats: int = 1, a: str = "planfence",
                     table_path: Any = SPREAD_TABLE) -> list[str]:
    table = read_spread_table(table_path)
    templates = len(campaign.templates)
    seen: set[tuple[str, str, float, str]] = set()
    lines: list[str] = []
    policies = {c.policy for c in campaign.cells()}
    if a not in policies or len(policies) < 2:
        return []
    for cell in campaign.cells():
        if cell.policy == a:
            continue
        ident = (cell.network, cell.connection, float(cell.rho), cell.policy)
        if ident in seen:
            continue
        seen.add(ident)
        row, note = lookup(table, cell.network, cell.connection, float(cell.rho), a,
                           cell.policy)
        head = (f"{a}:{cell.policy} on {cell.network}, {cell.connection}, "
                f"rho={cell.rho:g}")
        if row is None:
            lines.append(f"{head}: no expected resolution ({note}; measure one with "
                         "`testbed spread DIR --write`)")
            continue
        expected = row.expected(templates, repeats)
        needs = ", ".join(_needed(row.curve.templates_for(t, row.scale(repeats)), t)
                          for t in TARGETS)
        caveat = f"; {note}" if note else ""
        lines.append(f"{head}: expected resolution ±{100 * expected:.1f}% at {templates} "
                     f"templates x {repeats} repeats (tie band {100 * TIE_FRACTION:.0f}%; "
                     f"{needs}) from {row.source} ({row.templates} templates{caveat})")
    if len(lines) > MAX_LINES:
        lines = [*lines[:MAX_LINES], f"... {len(lines) - MAX_LINES} more comparisons"]
    return lines


def _needed(templates: int | None, target: float) -> str:
    if templates is None:
        return f"±{100 * target:.0f}%: not reachable (below the families' floor)"
    return f"±{100 * target:.0f}%: ~{templates} templates"


def resolution_report(campaign: Campaign, *, repeats: int = 1) -> list[str]:
    """``check``'s lines: a heading and one line per comparison (none without pairs)."""
    lines = resolution_lines(campaign, repeats=repeats)
    if not lines:
        return []
    return ["expected resolution of the paired stall comparisons (from the stored spread "
            "of earlier runs; docs/reports.md, 'Resolution'):", *(f"  {x}" for x in lines)]
