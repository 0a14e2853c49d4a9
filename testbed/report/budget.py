"""Budgeted validation: the risk-cost frontier table and figure (``planfence_budget``).

Per network and rho: one row per budget policy configuration (ranking, b) with the
invalid actions it issued, its availability and its median stall and traffic, between
the two ends run on the same schedules, owner-head freshness (no check; the b = 0 end)
and PlanFence (every input checked; the b = all end). The figure puts the invalid share
of issued actions against median stall and against median traffic, one line per
ranking through b = 0, 1, ..., all. Nothing is drawn for a campaign without
``planfence_budget``. See docs/policies.md ("Budgeted validation").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from protocols.policies import make_policy
from protocols.policies._budget import ALL, RANKINGS
from testbed.report import naming, slicing
from testbed.report.figures import save
from testbed.report.load import Run
from testbed.report.stats import RowSummary, summarise
from testbed.report.table_common import Options, layout, strata, summary_row
from testbed.report.tabular import Cell, Table, fmt

POLICY = "planfence_budget"
LOW_END, HIGH_END = "owner_head_freshness", "planfence"
_RANKING_COLORS = {"random": "#1f77b4", "recency": "#ff7f0e", "critical_first": "#9467bd",
                   "value": "#d62728"}


@dataclass(frozen=True)
class Point:
    """One row of the frontier: a configuration and its summary at one rho."""

    policy: str
    ranking: str  # "" for the two ends
    b: int | None  # None: all inputs
    summary: RowSummary

    @property
    def invalid_share(self) -> float:
        issued = self.summary.issued
        return self.summary.invalid / issued if issued else math.nan

    @property
    def b_text(self) -> str:
        return ALL if self.b is None else str(self.b)


def budget_settings(policy: str) -> tuple[str, int | None] | None:
    """(ranking, b) of a ``planfence_budget`` spec, None for any other policy."""
    if policy.partition("/")[0] != POLICY:
        return None
    try:
        settings = make_policy(policy).settings
    except ValueError:  # not registered here: not something this table can read
        return None
    b = settings["b"]
    return str(settings["ranking"]), None if b == ALL else int(b)


def _order(point: Point) -> tuple[int, int, float]:
    """Owner-head freshness, b = 0, each ranking by b (all last), PlanFence."""
    if not point.ranking:
        return (0 if point.policy == LOW_END else 3, 0, 0)
    if point.b == 0:
        return (1, 0, 0)
    rank = RANKINGS.index(point.ranking) if point.ranking in RANKINGS else len(RANKINGS)
    return (2, rank, math.inf if point.b is None else point.b)


def frontier_points(frame: pd.DataFrame) -> dict[float, list[Point]]:
    """Per rho, the frontier's rows in table order (the two ends if present)."""
    out: dict[float, list[Point]] = {}
    for rho in frame["rho"].astype(float).drop_duplicates().sort_values():
        part = frame[frame["rho"].astype(float) == rho]
        points = []
        for policy in map(str, part["policy"].unique()):
            found = budget_settings(policy)
            if found is None and policy not in (LOW_END, HIGH_END):
                continue
            ranking, b = found if found is not None else ("", 0 if policy == LOW_END else None)
            points.append(Point(policy, ranking, b,
                                summarise(part[part["policy"] == policy], strata())))
        if any(p.ranking for p in points):
            out[float(rho)] = sorted(points, key=_order)
    return out


def _slice(run: Run, network: str) -> pd.DataFrame:
    return slicing.slice_for(run.episodes, free=("rho",), where={"network": network}).episodes


def budget_tables(run: Run, options: Options) -> list[Table]:
    tables = []
    for network in slicing.networks(run.episodes):
        frame = _slice(run, network)
        points = frontier_points(frame)
        if points:
            tables.append(_table(run, frame, network, points))
    return tables


def _table(run: Run, frame: pd.DataFrame, network: str,
           points: dict[float, list[Point]]) -> Table:
    rows: list[list[Cell]] = []
    records: list[dict[str, object]] = []
    findings: list[str] = []
    for rho, group in points.items():
        for i, p in enumerate(group):
            s = p.summary
            rows.append([
                Cell(slicing.number(rho) if i == 0 else ""),
                Cell(naming.display_name(p.policy) if not p.ranking else "PlanFence budget"
                     + (f" {naming.UNSAFE_MARK}" if naming.is_marked_unsafe(p.policy) else "")),
                Cell(p.ranking or "–"), Cell(p.b_text),
                Cell(f"{s.invalid}/{s.issued}"),
                Cell(fmt(100 * p.invalid_share) if s.issued else "–"),
                Cell(f"{s.available}/{s.scheduled}"),
                Cell(f"{fmt(s.stall_ms)} [{fmt(s.stall_q1_ms)}, {fmt(s.stall_q3_ms)}]"),
                Cell(fmt(s.kib, 2)),
            ])
            records.append({"rho": rho, "policy": p.policy, "ranking": p.ranking,
                            "b": p.b_text, "invalid_share": p.invalid_share,
                            **summary_row(s)})
        findings += _ends(rho, group)
    return layout(run, frame, records,
        name=f"table_budget_{network}",
        title=f"Budgeted validation on {network}: invalid actions against stall and traffic",
        header=["rho", "Method", "Ranking", "b", "Invalid / issued", "Invalid %",
                "Available / scheduled", "Stall ms/action [IQR]", "Traffic (KiB/action)"],
        rows=rows,
        legend="b: inputs checked per action (of the action's declared inputs; all = every "
        "one). b = 0 checks nothing whatever the ranking; b = all checks everything for "
        "every ranking but value, which funds only checks worth their measured cost. "
        "Stall and traffic: medians over templates (IQR pools the episodes); invalid "
        "counts are over every issued action of the row.",
        findings=findings,
    )


def _ends(rho: float, group: list[Point]) -> list[str]:
    """How the budget's ends compare with the two reference policies (same schedules)."""
    by_policy = {p.policy: p for p in group}
    out = []
    zero = next((p for p in group if p.ranking and p.b == 0), None)
    full = next((p for p in group if p.ranking and p.b is None and p.ranking != "value"), None)
    for end, ref in ((zero, by_policy.get(LOW_END)), (full, by_policy.get(HIGH_END))):
        if end is None or ref is None:
            continue
        same = "matches" if end.summary.invalid == ref.summary.invalid else "differs from"
        out.append(f"rho = {slicing.number(rho)}: b = {end.b_text} issued "
                   f"{end.summary.invalid}/{end.summary.issued} invalid, which {same} "
                   f"{naming.display_name(ref.policy)}'s {ref.summary.invalid}/"
                   f"{ref.summary.issued}.")
    return out


def budget_figure(run: Run, directory: Path) -> list[Path]:
    """Invalid share against median stall and traffic, one line per ranking."""
    paths: list[Path] = []
    for network in slicing.networks(run.episodes):
        points = frontier_points(_slice(run, network))
        if not points:
            continue
        figure = Figure(figsize=(9.0, 3.2 * len(points) + 0.6), layout="constrained")
        axes = figure.subplots(len(points), 2, squeeze=False)
        for row, (rho, group) in zip(axes, points.items(), strict=True):
            for ax, metric, label in ((row[0], "stall_ms", "median stall (ms/action)"),
                                      (row[1], "kib", "median traffic (KiB/action)")):
                _draw(ax, group, metric)
                ax.set_xlabel(label)
                ax.set_ylabel("invalid / issued")
                ax.set_title(f"rho = {slicing.number(rho)}")
                ax.grid(True, alpha=0.3)
        handles, labels = axes[0][0].get_legend_handles_labels()
        figure.legend(handles, labels, fontsize=7, loc="outside right center")
        figure.suptitle(f"Budgeted validation on {network}: risk against cost (labels: b)")
        paths += save(figure, directory, f"fig_budget_frontier_{network}")
    return paths


def _draw(ax: Axes, group: list[Point], metric: str) -> None:
    def xy(p: Point) -> tuple[float, float]:
        return float(getattr(p.summary, metric)), p.invalid_share

    zero = [p for p in group if p.ranking and p.b == 0]
    full = [p for p in group if p.ranking and p.b is None and p.ranking != "value"]
    for ranking in RANKINGS:
        own = [p for p in group if p.ranking == ranking and p.b not in (0, None)]
        ends = [p for p in group if p.ranking == ranking and p.b is None]
        # b = all is PlanFence for every ranking but value, which may not check it all
        top = ends if ranking == "value" else (ends or full)
        line = zero[:1] + sorted(own, key=lambda p: p.b or 0) + top[:1]
        if len(line) < 2 or (not own and not ends):
            continue
        xs, ys = zip(*(xy(p) for p in line), strict=True)
        ax.plot(xs, ys, marker="o", color=_RANKING_COLORS[ranking], label=ranking,
                linewidth=1.2, markersize=4)
        for p, x, y in zip(line, xs, ys, strict=True):
            ax.annotate(p.b_text, (x, y), textcoords="offset points", xytext=(3, 3),
                        fontsize=6)
    for policy, marker, color in ((LOW_END, "s", "#8c564b"), (HIGH_END, "D", "#2ca02c")):
        for p in (q for q in group if q.policy == policy):
            x, y = xy(p)
            ax.scatter([x], [y], marker=marker, s=70, color=color, zorder=3,
                       label=naming.display_name(policy), alpha=0.8)
