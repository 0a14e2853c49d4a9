"""`testbed traces list|show`: human views of the shipped capacity traces."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from testbed.links.netinfo import plot_bin_ms, trace_gaps_ms
from testbed.links.traces import (
    Trace,
    TraceError,
    load_named,
    load_trace,
    trace_catalogue,
    trace_dir,
)

__all__ = ["PLOT_BIN_MS", "TraceSummary", "summarize", "traces_list", "traces_show"]

PLOT_BIN_MS = 1000
"""The zero-capacity count uses 1 s bins (plots choose their own: netinfo.plot_bin_ms)."""


@dataclass(frozen=True)
class TraceSummary:
    name: str
    direction: str
    length_s: float
    mean_mbit: float
    longest_outage_s: float
    zero_capacity_s: float  # seconds of 1 s bins with no delivery opportunity
    opportunities: int


def summarize(trace: Trace) -> TraceSummary:
    series = trace.capacity_series_kbit(PLOT_BIN_MS)
    return TraceSummary(
        name=trace.name,
        direction=trace.direction,
        length_s=trace.length_s,
        mean_mbit=trace.mean_rate_kbit() / 1000.0,
        longest_outage_s=trace.longest_outage_ms() / 1000.0,
        zero_capacity_s=float((series == 0).sum()) * PLOT_BIN_MS / 1000.0,
        opportunities=int(trace.stamps_ms.size),
    )


def traces_list(console: Console) -> None:
    """Table of every trace in the trace folder."""
    catalogue = trace_catalogue()
    if not catalogue:
        console.print(f"no traces found in {trace_dir()} (*.up / *.down files)")
        return
    # the folder on a line of its own: a long path must not be cut like a table title
    console.print(f"traces in {trace_dir()}", soft_wrap=True, markup=False, highlight=False)
    table = Table()
    table.add_column("name")
    table.add_column("direction")
    table.add_column("length s", justify="right")
    table.add_column("mean capacity Mbit/s", justify="right")
    table.add_column("longest outage s", justify="right")
    for name in catalogue:
        s = summarize(load_named(name))
        table.add_row(s.name, s.direction, f"{s.length_s:.1f}", f"{s.mean_mbit:.2f}",
                      f"{s.longest_outage_s:.1f}")
    console.print(table)


def trace_by_name_or_path(name: str, direction: str | None = None) -> Trace:
    """A shipped trace by name, or a trace file by path (its direction from a .up/.down
    suffix, else DIRECTION)."""
    path = Path(name)
    if path.is_file():
        if direction is None and path.suffix not in (".up", ".down"):
            raise TraceError(f"{name}: cannot tell the direction from the name; pass "
                             "--direction up|down (or name the file *.up / *.down)")
        return load_trace(path, direction="up" if direction == "up" else
                          "down" if direction == "down" else None)
    if path.exists():
        raise TraceError(f"{name}: is a directory; allowed: a trace file or a shipped "
                         "trace's name (`testbed traces list`)")
    if "/" in name or name.startswith("."):
        raise TraceError(f"{name}: no such file; allowed: a trace file or a shipped "
                         "trace's name (`testbed traces list`)")
    return load_named(name)


def traces_show(name: str, plot: Path | None, console: Console, *,
                direction: str | None = None) -> None:
    """Summary of one trace (a shipped name or a file); with `plot`, a capacity plot."""
    trace = trace_by_name_or_path(name, direction)
    s = summarize(trace)
    table = Table(title=name, show_header=False)
    table.add_column("field")
    table.add_column("value", justify="right")
    for field, value in (
        ("direction", s.direction),
        ("length", f"{s.length_s:.3f} s"),
        ("delivery opportunities", f"{s.opportunities}"),
        ("mean capacity", f"{s.mean_mbit:.3f} Mbit/s"),
        ("longest outage", f"{s.longest_outage_s:.3f} s"),
        ("zero-capacity 1 s bins", f"{s.zero_capacity_s:.0f} s"),
    ):
        table.add_row(field, value)
    console.print(table)
    if plot is not None:
        write_plot(trace, plot)
        console.print(f"wrote {plot}")


def write_plot(trace: Trace, path: Path) -> None:
    """Capacity over one period as stairs (bins finer than the shortest outage; the last
    bin as wide as what is left of the period), the mean dashed, the legend outside."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    bin_ms = plot_bin_ms(trace.period_ms, trace_gaps_ms(trace.stamps_ms, trace.period_ms))
    series = trace.capacity_series_kbit(bin_ms) / 1000.0
    edges = np.minimum(np.arange(series.size + 1) * bin_ms, trace.period_ms) / 1000.0
    fig, ax = plt.subplots(figsize=(11, 3.5), dpi=100, layout="constrained")
    try:
        ax.stairs(series, edges, linewidth=0.9, label=f"capacity ({bin_ms} ms bins)")
        ax.axhline(trace.mean_rate_kbit() / 1000.0, linestyle="--", linewidth=0.8,
                   color="gray", label="mean")
        ax.set_xlabel("time in trace (s)")
        ax.set_ylabel("Mbit/s")
        ax.set_title(f"{trace.name} ({trace.direction}link)")
        ax.set_xlim(0, trace.length_s)
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)
