"""The one-way delay the links had during the episodes: propagation and delay traces.

``fig_delay_segments``: per network of the run (rebuilt from the manifest,
``recorded_links``), the one-way delay per crossing of each distinct link and direction
over an episode's time, at every trace offset the run used: a flat line for a fixed
delay, the steps of a delay trace (indexed like the capacity traces: replay time plus
the cell's and the link's offsets). It sits beside ``fig_trace_segments`` (capacity),
so a delay step shows in the report as an outage does.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from testbed.errors import UserError
from testbed.links.linkspec import LinkSpec, NetworkProfile
from testbed.links.traces import load_delay_trace
from testbed.report import slicing
from testbed.report.figures import save
from testbed.report.load import Run
from testbed.report.recorded_links import recorded_profiles


def _links(profile: NetworkProfile) -> list[tuple[str, LinkSpec]]:
    out = [("every host", profile.link)] if profile.link is not None else []
    return out + [(f"host {sel}", link) for sel, link in profile.hosts]


def _delay_steps(link: LinkSpec, side: str, start_s: float, duration_s: float,
                 ) -> tuple[list[float], list[float]]:
    """Edges (s since the episode start) and one-way delay (ms) per step."""
    own = link.side(side)
    if own.delay_trace is None:
        return [0.0, duration_s], [own.delay_ms]
    steps = load_delay_trace(own.delay_trace).steps
    start_ms = (start_s + link.trace_offset_s) * 1000.0
    edges, values = [0.0], []
    current = next(d for t, d in reversed(steps) if t <= start_ms) if steps else 0.0
    values.append(current)
    for t_ms, delay in steps:
        rel = (t_ms - start_ms) / 1000.0
        if 0.0 < rel < duration_s:
            edges.append(rel)
            values.append(delay)
    edges.append(duration_s)
    return edges, values


def delay_figure(run: Run, directory: Path) -> tuple[list[Path], list[str]]:
    """``fig_delay_segments`` (module docstring); returns (paths, notes)."""
    profiles = recorded_profiles(run.manifest)
    ep = run.episodes
    panels: list[tuple[str, list[tuple[str, list[float], list[float]]]]] = []
    notes: list[str] = []
    for net in slicing.networks(ep):
        profile = profiles.get(str(net))
        if profile is None or profile.link is None:
            continue
        rows = ep[ep["network"] == net]
        wall = rows["wall_s"].dropna() if "wall_s" in rows else pd.Series(dtype=float)
        duration = float(wall.max()) if len(wall) else 60.0
        lines = []
        for offset in slicing.sorted_values(rows, "trace_offset_s"):
            for label, link in _links(profile):
                for side in ("up", "down"):
                    try:
                        edges, values = _delay_steps(link, side, float(str(offset)), duration)
                    except (UserError, OSError) as exc:
                        notes.append(f"delay of {net} {label} skipped: {exc}")
                        continue
                    lines.append((f"{label} {side} @ {slicing.number(float(str(offset)))} s",
                                  edges, values))
        if lines:
            panels.append((str(net), lines))
    if not panels:
        return [], notes
    figure = Figure(figsize=(10, 2.4 * len(panels)), layout="constrained")
    axes = figure.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (net, lines) in zip(axes, panels, strict=True):
        for label, edges, values in lines:
            ax.stairs(values, edges, linewidth=1, label=label, baseline=None)
        ax.set_title(f"{net}: one-way delay per crossing during an episode", fontsize=10)
        ax.set_ylabel("ms")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1].set_xlabel("time since episode start (s)")
    return save(figure, directory, "fig_delay_segments"), notes
