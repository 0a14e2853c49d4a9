"""The table "Stall measured vs predicted from counted rounds", per network with links
(``testbed.report.decomposition`` computes its cells; docs/reports.md says how to read
it).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from testbed.report import naming, slicing
from testbed.report.decomposition import CellRow, cell_keys, cell_rows, per_episode, varying
from testbed.report.load import Run
from testbed.report.table_common import Options, layout
from testbed.report.tabular import Cell, Table, fmt

_LABELS = {"connection": "Connection", "rho": "rho", "keys": "Keys", "agents": "N",
           "deps": "d", "units": "T", "tier": "Tier", "trace_offset_s": "Offset (s)",
           "batch": "Batch", "backend": "Backend"}


def decomposition_tables(run: Run, options: Options) -> list[Table]:
    frame = per_episode(run)
    if frame.empty:
        return []
    keys = cell_keys(frame)
    tables = []
    for network in slicing.networks(frame):
        part = frame[frame["network"].astype(str) == network]
        rows = cell_rows(part, keys)
        if not rows:
            continue
        shown = varying(part, keys)
        order = naming.ordered(part["policy"].unique())
        rows.sort(key=lambda r: (order.index(str(r.key["policy"])),
                                 *(_sortable(r.key[k]) for k in shown)))
        cells = [[Cell(naming.display_name(str(r.key["policy"]))),
                  *(Cell(slicing.number(r.key[k])) for k in shown),
                  Cell(fmt(r.rounds, 2)), Cell(fmt(r.handshake_rounds, 2)),
                  Cell(fmt(r.rtt_ms, 0)), Cell(fmt(r.measured_ms, 0)),
                  Cell(fmt(r.predicted_ms, 0)), Cell(fmt(r.ratio, 2)),
                  Cell(fmt(r.paper_model_ms, 0))] for r in rows]
        tables.append(layout(run, part, [r.record() for r in rows],
            name=f"table_decomposition_{network}",
            title=f"Stall measured vs predicted from counted rounds on {network}",
            header=["Method", *(_LABELS.get(k, k) for k in shown), "Rounds / action",
                    "Handshake RTTs / action", "RTT (ms)", "Measured (ms/action)",
                    "Predicted (ms/action)", "Predicted / measured",
                    "Paper's model (ms/action)"],
            rows=cells,
            legend="Per cell, medians over templates of each episode's stall per attempted "
            "action (the report's statistic) and of its prediction: (rounds + handshake "
            "round trips) x the round trip the link model gives for the episode's replay "
            "window (exchange-weighted mean; testbed/links/exchange.py), plus RPC timeouts. "
            "Rounds count the action path and the barrier and commit hooks; a new "
            "connection adds 2 round trips (TCP, then the channel's handshake). The "
            "paper's model drops the handshake round trips (one trace delay per framed "
            "exchange, appendix H). Counts are the recorded columns, or derived for runs "
            "made before them (CSV column counts).",
            findings=_findings(rows, shown),
        ))
    return tables


def _sortable(value: object) -> tuple[int, float, str]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def _findings(rows: list[CellRow], shown: list[str]) -> list[str]:
    rated = [r for r in rows if pd.notna(r.ratio)]
    out = []
    if rated:
        ratios = [r.ratio for r in rated]
        within = sum(r.within for r in rated)
        out.append(f"{within} of {len(rated)} cells within 10% (predicted / measured "
                   f"{min(ratios):.2f}-{max(ratios):.2f}, median {float(np.median(ratios)):.2f}).")
        misses = [r for r in rated if not r.within]
        if misses:
            out.append("Outside 10%: " + "; ".join(
                f"{_label(r, shown)} {r.ratio:.3f}" for r in misses) + ".")
    idle = [r for r in rows if r.predicted_ms == 0]
    if idle:
        out.append("No rounds on the path (stall is CPU time): " + ", ".join(
            f"{_label(r, shown)} {r.measured_ms:.2f} ms/action" for r in idle) + ".")
    unknown = [r for r in rows if pd.isna(r.predicted_ms)]
    if unknown:
        out.append("No prediction (hook rounds neither recorded nor derivable): "
                   + ", ".join(_label(r, shown) for r in unknown) + ".")
    rtts = [r.rtt_ms for r in rows if pd.notna(r.rtt_ms)]
    bases = [r.base_rtt_ms for r in rows if pd.notna(r.base_rtt_ms)]
    p50 = [r.link_p50_rtt_ms for r in rows if pd.notna(r.link_p50_rtt_ms)]
    if rtts and bases:
        text = (f"Round trip per exchange {_span(rtts)} ms (cell medians) against "
                f"{_span(bases)} ms of propagation")
        if p50:
            text += (f"; the links' median queueing delays give {_span(p50)} ms, what an "
                     "exchange meets outside zero-capacity stretches")
        out.append(text + ".")
    bounds = [(r.serialization_bound_ms / r.predicted_ms, r) for r in rows
              if pd.notna(r.serialization_bound_ms) and r.predicted_ms > 0]
    if bounds:
        share, worst = max(bounds, key=lambda b: b[0])
        out.append("Serialization is left out: queueing every byte of the path and the "
                   "hooks on one uplink at the window's mean capacity (an upper bound) would "
                   f"add at most {100 * share:.0f}% to a prediction ({_label(worst, shown)}).")
    return out


def _span(values: list[float]) -> str:
    low, high = f"{min(values):.0f}", f"{max(values):.0f}"
    return low if low == high else f"{low}-{high}"


def _label(row: CellRow, shown: list[str]) -> str:
    parts = [naming.display_name(str(row.key["policy"]))]
    for column in shown:
        value = slicing.number(row.key[column])
        parts.append(value if column in ("connection", "tier", "backend")
                     else f"{value} keys" if column == "keys"
                     else f"{_LABELS.get(column, column)} {value}")
    return ", ".join(parts)
