"""What the links did: per-episode link columns, the host's disturbance, link plots.

- :func:`link_health_lines`: per network, medians of the episodes' queueing delay,
  utilisation and drops, and every episode whose emulator released packets late by
  more than :data:`LATE_LIMIT_MS` at p99 (``emulator_late_p99_ms``): the host disturbed
  that episode's timing, and its stall is suspect.
- :func:`link_figures`: for one episode (``--episode KEY``) or, per network, the logged
  episode whose links met the most outage (then delay steps, then the longest),
  throughput against capacity and every packet's queueing delay over time, per host
  and direction, from the episode's Mahimahi-format logs (``[options] link_log =
  true``), like ``mm-throughput-graph`` and ``mm-delay-graph``. Bins are 500 ms, finer
  (down to 50 ms) when an outage is shorter than a bin; a wired link (capacity far
  above its traffic) gets a log axis so the traffic stays visible; one legend, below
  the panels.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.figure import Figure

from testbed.campaign.vocabulary import policy_needs_central
from testbed.errors import UserError
from testbed.links.linkspec import NetworkProfile
from testbed.links.logread import LogEvents, link_series, read_log
from testbed.links.netinfo import plot_bin_ms
from testbed.report import slicing
from testbed.report.figures import save
from testbed.report.load import Run
from testbed.report.recorded_links import recorded_profiles, what_it_met
from testbed.report.tables_command import is_command_run

LATE_LIMIT_MS = 1.0
MAX_HOST_ROWS = 8


WIRED_RATIO = 20.0
"""Capacity this many times the traffic's peak: a log axis, or the traffic is a flat 0."""


def bin_ms_for(events: LogEvents) -> float:
    """Bins for one log: mm-throughput-graph's 500 ms (100 ms for episodes of 30 s or
    less), finer where an outage is shorter than two bins (netinfo.plot_bin_ms)."""
    times = [a.max() for a in (events.departures_ms, events.opportunities_ms) if a.size]
    opps = events.opportunities_ms
    gaps = np.diff(np.sort(opps)) if opps.size > 1 else np.zeros(0)
    return float(plot_bin_ms(max(times) if times else 0.0, gaps))


def late_episodes(run: Run) -> pd.DataFrame:
    """Episodes whose emulator p99 release lateness exceeded LATE_LIMIT_MS."""
    ep = run.episodes
    if "emulator_late_p99_ms" not in ep:
        return ep.iloc[0:0]
    late = ep[ep["emulator_late_p99_ms"].astype(float) > LATE_LIMIT_MS]
    return late.sort_values("emulator_late_p99_ms", ascending=False)


def _median(frame: pd.DataFrame, column: str) -> float:
    if column not in frame:
        return math.nan
    values = frame[column].dropna().astype(float)
    return float(values.median()) if len(values) else math.nan


def _fmt(value: float, unit: str = "") -> str:
    return "-" if math.isnan(value) else f"{value:.3g}{unit}"


def link_health_lines(run: Run) -> list[str]:
    """Report lines (Markdown list items without the dash)."""
    ep = run.episodes[~run.episodes["aborted"]]
    lines: list[str] = []
    if "link_up_qdelay_p50_ms" not in ep or ep["link_up_qdelay_p50_ms"].isna().all():
        lines.append("No per-episode link statistics in this run (loopback only, the netem "
                     "backend, or a run recorded before they existed).")
    else:
        for net in slicing.networks(ep):
            part = ep[ep["network"] == net]
            if part["link_up_qdelay_p50_ms"].isna().all():
                continue
            lines.append(
                f"{net}: median over {len(part)} episodes of queueing delay p50/p95 up "
                f"{_fmt(_median(part, 'link_up_qdelay_p50_ms'))}/"
                f"{_fmt(_median(part, 'link_up_qdelay_p95_ms'), ' ms')}, down "
                f"{_fmt(_median(part, 'link_down_qdelay_p50_ms'))}/"
                f"{_fmt(_median(part, 'link_down_qdelay_p95_ms'), ' ms')}; utilisation up "
                f"{_fmt(_median(part, 'link_up_utilisation'))}, down "
                f"{_fmt(_median(part, 'link_down_utilisation'))}; drops up "
                f"{_fmt(_median(part, 'link_up_drops'))}, down "
                f"{_fmt(_median(part, 'link_down_drops'))}; emulator lateness p99 "
                f"{_fmt(_median(part, 'emulator_late_p99_ms'), ' ms')}")
    late = late_episodes(run)
    if late.empty and "emulator_late_p99_ms" in ep and ep["emulator_late_p99_ms"].notna().any():
        lines.append(f"No episode's emulator released packets more than {LATE_LIMIT_MS:g} ms "
                     "late at p99: the host did not disturb the links.")
    for row in late.to_dict("records"):
        lines.append(f"FLAGGED {row['episode']}: emulator lateness p99 "
                     f"{float(row['emulator_late_p99_ms']):.2f} ms, max "
                     f"{float(row.get('emulator_late_max_ms') or math.nan):.2f} ms "
                     f"(> {LATE_LIMIT_MS:g} ms: the host disturbed this episode's timing)")
    return lines


class EpisodeChoiceError(UserError):
    """``--episode`` names no episode of the run, or one without a packet log."""


def resolve_episode(run: Run, episode: str) -> str:
    """The episode key ``--episode`` names (the ``links/`` folder form, with ``~`` for
    ``/``, is accepted too); a one-line error if the run has no such logged episode."""
    key = episode.strip().rstrip("/").replace("~", "/")
    ep = run.episodes
    logged = ep[ep["link_log"].notna()] if "link_log" in ep else ep.iloc[0:0]
    some = ", ".join(logged["episode"].head(3)) if len(logged) else ""
    hint = f"; logged episodes include {some}" if some else \
        "; no episode of this run has one (options.link_log = true writes them)"
    if key not in set(ep["episode"]):
        raise EpisodeChoiceError(f"--episode: {episode!r} is not an episode of this run{hint}")
    if key not in set(logged["episode"]):
        raise EpisodeChoiceError(f"--episode: {key} has no packet log{hint}")
    return key


def _chosen(run: Run, episode: str | None) -> tuple[list[pd.Series], list[str]]:
    ep = run.episodes
    if "link_log" not in ep:
        return [], ([] if episode is None else
                    [f"link plots: episode {episode} has no link log in this run"])
    logged = ep[ep["link_log"].notna()]
    if episode is not None:
        rows = logged[logged["episode"] == episode]
        if rows.empty:
            known = "; logged: " + ", ".join(logged["episode"].head(3)) if len(logged) else ""
            return [], [f"link plots: episode {episode} has no link log in this run{known}"]
        return [rows.iloc[0]], []
    if logged.empty:
        return [], []
    profiles = recorded_profiles(run.manifest)
    command = is_command_run(run)
    return [_most_eventful(logged[logged["network"] == net], profiles.get(str(net)),
                           command=command)
            for net in slicing.networks(logged)], []


def _most_eventful(rows: pd.DataFrame, profile: NetworkProfile | None, *,
                   command: bool = False) -> pd.Series:
    """The episode whose links met the most outage (then delay steps, then the longest),
    so the default plot shows what the network does (recorded_links). COMMAND: a command
    workload's rows, whose ``policy`` is the command's label (no central host)."""
    def key(row: pd.Series) -> tuple[tuple[float, int], float, str]:
        wall = float(row.get("wall_s") or 0.0)
        central = not command and policy_needs_central(str(row["policy"]))
        met = (0.0, 0) if profile is None else what_it_met(
            profile, agents=int(row["agents"]), central=central,
            offset_s=float(row["trace_offset_s"]), seconds=wall).score
        return met, wall, str(row["episode"])

    ordered = sorted((row for _, row in rows.iterrows()), key=key)
    best = max(key(r)[:2] for r in ordered)
    return next(r for r in ordered if key(r)[:2] == best)


def _host_logs(folder: Path) -> list[tuple[str, Path | None, Path | None]]:
    hosts = sorted({p.name.split(".")[0] for p in folder.glob("*.log")},
                   key=lambda h: (h == "central", h))
    return [(h, folder / f"{h}.up.log" if (folder / f"{h}.up.log").exists() else None,
             folder / f"{h}.down.log" if (folder / f"{h}.down.log").exists() else None)
            for h in hosts]


def _draw(axes: np.ndarray, row: int, host: str, side: str, path: Path | None) -> None:
    rate_ax, delay_ax = axes[2 * row, 0 if side == "up" else 1], \
        axes[2 * row + 1, 0 if side == "up" else 1]
    if path is None:
        rate_ax.set_title(f"{host} {side}: no log")
        return
    events = read_log(path)
    bin_ms = bin_ms_for(events)
    series = link_series(events, bin_ms=bin_ms)
    edges = series["edges_s"]
    capacity = series["capacity_mbit"]
    if capacity is not None:
        rate_ax.stairs(capacity, edges, fill=True, alpha=0.3, color="#7f7f7f",
                       label="capacity")
    throughput = series["throughput_mbit"]
    rate_ax.stairs(throughput, edges, linewidth=1, color="#1f77b4", label="throughput")
    peak = float(throughput.max()) if throughput.size else 0.0
    if capacity is not None and peak > 0 and float(capacity.max()) > WIRED_RATIO * peak:
        rate_ax.set_yscale("log")  # a wired link: the traffic would sit at 0 on a line
        rate_ax.set_ylim(bottom=peak / 100)
    rate_ax.set_title(f"{host} {'uplink' if side == 'up' else 'downlink'} "
                      f"({bin_ms:g} ms bins)", fontsize=9)
    rate_ax.set_ylabel("Mbit/s", fontsize=8)
    rate_ax.set_xlim(edges[0], edges[-1])
    rate_ax.grid(True, alpha=0.3)
    delay_ax.scatter(series["delay_t_s"], series["delay_ms"], s=1, color="#d62728",
                     label="queueing delay")
    delay_ax.set_ylabel("queueing delay ms", fontsize=8)
    delay_ax.grid(True, alpha=0.3)


def _episode_figure(run: Run, row: pd.Series, directory: Path, stem: str,
                    ) -> tuple[list[Path], list[str]]:
    folder = run.path / str(row["link_log"])
    if not folder.is_dir():
        return [], [f"link plots of {row['episode']}: {folder} is missing"]
    hosts = _host_logs(folder)
    notes = []
    if len(hosts) > MAX_HOST_ROWS:
        notes.append(f"link plots of {row['episode']}: first {MAX_HOST_ROWS} of "
                     f"{len(hosts)} hosts drawn")
        hosts = hosts[:MAX_HOST_ROWS]
    if not hosts:
        return [], [f"link plots of {row['episode']}: no log files in {folder}"]
    figure = Figure(figsize=(11, 2.8 * len(hosts)), layout="constrained")
    axes = figure.subplots(2 * len(hosts), 2, squeeze=False, sharex=True)
    for i, (host, up, down) in enumerate(hosts):
        _draw(axes, i, host, "up", up)
        _draw(axes, i, host, "down", down)
    for ax in axes[-1]:
        ax.set_xlabel("time since episode start (s)")
    handles: dict[str, Artist] = {}
    for ax in axes.ravel():  # one legend for every panel, outside the data
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        figure.legend(list(handles.values()), list(handles), loc="outside lower center",
                      ncol=len(handles), fontsize=8)
    figure.suptitle(f"{row['episode']}: throughput vs capacity and per-packet queueing "
                    "delay", fontsize=10)
    return save(figure, directory, stem), notes


def link_figures(run: Run, directory: Path, *, episode: str | None = None,
                 ) -> tuple[list[Path], list[str]]:
    """Link plots (module docstring); returns (paths, notes)."""
    rows, notes = _chosen(run, episode)
    paths: list[Path] = []
    for row in rows:
        stem = "fig_link_episode" if episode is not None else f"fig_link_{row['network']}"
        more, more_notes = _episode_figure(run, row, directory, stem)
        paths += more
        notes += more_notes
    return paths, notes
