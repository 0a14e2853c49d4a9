"""Unsafe policies in a report: which they are, and the legend line wherever one appears.

A policy is unsafe in a run when it issued at least one invalid action anywhere in that
run (``invalid_n`` of its episodes). ``build_report`` marks them through
``naming.marking_unsafe``, so every table cell, finding and figure label that names one
carries ``naming.UNSAFE_MARK``; the functions here add the line that explains the mark
to each table and figure that shows it.
"""

from __future__ import annotations

from collections.abc import Iterable

from matplotlib.figure import Figure
from matplotlib.text import Text

from testbed.report import naming
from testbed.report.load import Run
from testbed.report.tabular import Table

LEGEND = f"{naming.UNSAFE_MARK} unsafe: issued at least one invalid action in this run"


def unsafe_policies(run: Run) -> frozenset[str]:
    """Policies with any invalid action among the run's (verdict) episodes."""
    episodes = run.episodes
    if episodes.empty or "invalid_n" not in episodes or "policy" not in episodes:
        return frozenset()
    invalid = episodes.groupby("policy")["invalid_n"].sum()
    return frozenset(str(p) for p, n in invalid.items() if n > 0)


def legend_line(policies: Iterable[str]) -> str:
    """The line under a table or figure: what the mark means, and how often it happened."""
    n = len(set(policies))
    return f"{LEGEND} ({n} {'policy' if n == 1 else 'policies'})." if n else ""


def _table_marked(table: Table) -> bool:
    texts = [*table.header, *(c.text for row in table.rows for c in row), *table.findings]
    return any(naming.UNSAFE_MARK in text for text in texts)


def explain_in_tables(tables: Iterable[Table], policies: Iterable[str]) -> None:
    """Append the legend line to every table that shows a marked name (in place)."""
    line = legend_line(policies)
    for table in tables:
        if line and _table_marked(table) and LEGEND not in table.legend:
            table.legend = f"{table.legend} {line}".strip()


def explain_in_figure(figure: Figure) -> None:
    """A note under a figure whose labels carry the mark (called by ``figures.save``)."""
    texts = [t.get_text() for t in figure.findobj(Text)]
    if not any(naming.UNSAFE_MARK in t for t in texts) or any(LEGEND in t for t in texts):
        return
    figure.supxlabel(LEGEND, fontsize=8, color="#b00020")
