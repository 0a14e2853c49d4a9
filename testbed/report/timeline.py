"""``testbed report RUN --episode KEY --timeline``: one episode as a space-time diagram.

The episode's history (``RUN/history/<episode>/``) is judged by the checker, laid out
by :func:`testbed.report.timeline_layout.timeline_layout` and drawn here: a lane per
host, time across, writes, derives, checks and acts as marks, recorded messages as
arrows, every stale action ringed in red with a dashed line back to the write that
superseded its input. Files: ``figures/timeline_<episode>.png`` and ``.svg``.
"""

from __future__ import annotations

import re
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from protocols.history_check import STALE_IN_WINDOW, check_history
from testbed.errors import UserError
from testbed.report.figures import save
from testbed.report.timeline_layout import Timeline, timeline_layout
from testbed.results.history import HISTORY_DIR, episode_folders, read_episode

STALE_RED = "#b00020"
STYLE = {  # kind -> (marker, colour, legend label)
    "write": ("s", "#1f77b4", "write (owner commits a version)"),
    "derive": ("D", "#2ca02c", "derive (a plan made)"),
    "act": ("^", "#000000", "act (action issued)"),
}
CHECK_COLOUR = "#ff7f0e"
ARROW_COLOUR = "#9e9e9e"


def episode_folder(run: Path, episode: str) -> tuple[str, Path]:
    """(key, folder) of the episode ``--episode`` names (``~`` for ``/`` accepted); a
    one-line error saying how to find the keys when the run has no such history."""
    key = episode.strip().rstrip("/").replace("~", "/")
    folders = dict(episode_folders(run))
    if key in folders:
        return key, folders[key]
    if not folders:
        raise UserError(f"--episode: {run} has no {HISTORY_DIR}/ (a run made before "
                        "histories, or not a run directory); nothing to draw")
    first = next(iter(folders))
    raise UserError(f"--episode: {episode!r} has no history in {run}; the keys are the "
                    f"folder names under {run / HISTORY_DIR}/ (with ~ for /, e.g. {first!r}), "
                    f"and `testbed history check {run}` names the episodes with stale actions")


def stem_for(key: str) -> str:
    return "timeline_" + re.sub(r"[^A-Za-z0-9._@=-]+", "~", key)


def timeline_for(run: Path, episode: str) -> tuple[str, Timeline]:
    key, folder = episode_folder(run, episode)
    histories = read_episode(folder, relative_to=run)
    return key, timeline_layout(histories, check_history(histories))


def _legend_note(timeline: Timeline) -> str:
    if not timeline.has_messages:
        return ("messages: this run's history has no rpc records, so no arrows are drawn "
                "(histories written before rpc events, or a program that records none)")
    drawn = (timeline.rpc_events - timeline.undrawn_rpcs)
    note = f"messages: {drawn} recorded calls, each a request and a reply arrow"
    if timeline.undrawn_rpcs:
        note += f"; {timeline.undrawn_rpcs} without the peer's instant, not drawn"
    return note


def draw_timeline(key: str, timeline: Timeline) -> Figure:
    lanes = {host: i for i, host in enumerate(reversed(timeline.lanes))}
    figure = Figure(figsize=(11, 1.6 + 0.55 * max(len(lanes), 2)), layout="constrained")
    ax = figure.add_subplot()
    for y in lanes.values():
        ax.axhline(y, color="#e0e0e0", linewidth=0.8, zorder=0)
    for arrow in timeline.arrows:
        ax.annotate("", xy=(arrow.dst_ms, lanes[arrow.dst]),
                    xytext=(arrow.src_ms, lanes[arrow.src]),
                    arrowprops={"arrowstyle": "-|>", "color": ARROW_COLOUR, "lw": 0.6,
                                "alpha": 0.7, "shrinkA": 0, "shrinkB": 0}, zorder=1)
    for mark in timeline.marks:
        y = lanes[mark.host]
        if mark.kind == "check":
            assert mark.end_ms is not None
            ax.plot([mark.t_ms, mark.end_ms], [y, y], color=CHECK_COLOUR, linewidth=5,
                    solid_capstyle="butt", alpha=0.8, zorder=2)
            continue
        marker, colour, _ = STYLE[mark.kind]
        ax.plot([mark.t_ms], [y], marker=marker, color=colour, markersize=6,
                linestyle="none", zorder=3)
    for i, light in enumerate(timeline.highlights):
        act = light.act
        ax.plot([act.t_ms], [lanes[act.host]], marker="o", markersize=15, fillstyle="none",
                color=STALE_RED, markeredgewidth=1.8, linestyle="none", zorder=4)
        label = light.action + ("\nfresh memory" if light.fresh_memory_stale_plan else "") \
            + ("\nin window" if light.status == STALE_IN_WINDOW else "")
        ax.annotate(label, (act.t_ms, lanes[act.host]), xytext=(7, 8 if i % 2 else -8),
                    textcoords="offset points", va="bottom" if i % 2 else "top",
                    color=STALE_RED, fontsize=7, zorder=5)
        for write in light.superseding:
            ax.plot([write.t_ms], [lanes[write.host]], marker="*", markersize=14,
                    color=STALE_RED, linestyle="none", zorder=4)
            ax.plot([write.t_ms, act.t_ms], [lanes[write.host], lanes[act.host]],
                    color=STALE_RED, linestyle="--", linewidth=1.0, zorder=4)
    ax.set_yticks(list(lanes.values()), list(lanes))
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    ax.set_xlabel("time since the episode's first event (ms, the run's shared clock)")
    stale = len(timeline.highlights)
    ax.set_title(f"{key}: {stale} stale action{'s' if stale != 1 else ''}", fontsize=10)
    handles = [Line2D([], [], marker=m, color=c, linestyle="none", label=label)
               for m, c, label in STYLE.values()]
    handles += [
        Line2D([], [], color=CHECK_COLOUR, linewidth=5, label="check (validation span)"),
        Line2D([], [], color=STALE_RED, marker="o", fillstyle="none", markersize=10,
               linestyle="none", label="stale action (fresh memory: its host already "
               "held the newer version)"),
        Line2D([], [], color=STALE_RED, marker="*", markersize=10, linestyle="--",
               label="write that superseded its input"),
    ]
    if timeline.arrows:
        handles.append(Line2D([], [], color=ARROW_COLOUR, label="message (request, reply)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=4,
              fontsize=7, frameon=False, title=_legend_note(timeline), title_fontsize=7)
    return figure


def timeline_figure(run: Path, episode: str, directory: Path) -> list[Path]:
    """Draw the episode's timeline into ``directory``; the PNG and SVG paths."""
    key, timeline = timeline_for(run, episode)
    return save(draw_timeline(key, timeline), directory, stem_for(key))
