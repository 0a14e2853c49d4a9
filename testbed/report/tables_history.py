"""``table_history``: the history checker's verdict per network and policy.

One row per network and policy (in report order) of the episodes that carry the
checker's columns (docs/history.md): episodes judged, actions attempted, actions stale
at their issue instant, of those the ones whose newer write landed in a validation
window and the ones whose executor already held the newer version (fresh memory,
stale plan), and their lateness (median over episodes of the episode's median; the
largest). No table when no episode of the run was judged (runs made before histories,
programs that write none).
"""

from __future__ import annotations

import math

import pandas as pd

from testbed.report import naming, slicing
from testbed.report.load import Run
from testbed.report.table_common import Options, layout
from testbed.report.tabular import Cell, Table, fmt


def _num(values: pd.Series, how: str) -> float:
    clean = values.dropna().astype(float)
    if not len(clean):
        return math.nan
    return float(clean.median() if how == "median" else clean.max())


def history_tables(run: Run, options: Options) -> list[Table]:
    """The table above, or none."""
    ep = run.episodes
    if ep.empty or "stale_actions" not in ep or not ep["stale_actions"].notna().any():
        return []
    judged = ep[ep["stale_actions"].notna() & ~ep["aborted"].astype(bool)]
    rows, records = [], []
    for network in slicing.networks(judged):
        for policy in naming.ordered(judged.loc[judged["network"] == network, "policy"]):
            part = judged[(judged["network"] == network) & (judged["policy"] == policy)]
            counts = {c: int(part[c].fillna(0).sum()) for c in
                      ("attempted_actions", "stale_actions", "stale_in_window_actions",
                       "fresh_memory_stale_plan")}
            p50 = _num(part["stale_late_p50_ms"], "median")
            late_max = _num(part["stale_late_max_ms"], "max")
            rows.append([Cell(network), Cell(policy), Cell(str(len(part))),
                         Cell(str(counts["attempted_actions"])),
                         Cell(str(counts["stale_actions"])),
                         Cell(str(counts["stale_in_window_actions"])),
                         Cell(str(counts["fresh_memory_stale_plan"])),
                         Cell(fmt(p50)), Cell(fmt(late_max))])
            records.append({"network": network, "policy": policy, "episodes": len(part),
                            **counts, "late_ms_p50_median": p50, "late_ms_max": late_max})
    return [layout(run, judged, records, name="table_history",
                   title="The history checker: stale actions per network and policy",
                   header=["network", "policy", "episodes", "actions", "stale",
                           "in a validation window", "fresh memory, stale plan",
                           "late ms (median)", "late ms (max)"], rows=rows,
                   legend="Judged from each episode's recorded history alone (history/, "
                   "docs/history.md): an action is stale when an input of its plan was "
                   "no longer the key's current version at the instant it was issued. "
                   "Late: from the first newer write to the action (median over episodes "
                   "of the episode's median; largest). `testbed history check RUN` "
                   "explains each stale action.")]
