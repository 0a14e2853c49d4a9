"""``testbed networks list|show NAME``: the networks a campaign can name, resolved.

``list`` shows every registered network (and, with ``--campaign FILE``, the file's
own); ``show`` prints one network's resolved definition (as the TOML table that
defines it), its links' mean capacity and longest outage, its propagation round trips,
and with ``--plot FILE.png`` the capacity of every link direction over one trace
period and its one-way delay (propagation, or a delay trace's steps).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from testbed.campaign.parse import load_campaign
from testbed.links.linkspec import LinkSpec, NetworkProfile
from testbed.links.netdef import network_to_data
from testbed.links.netinfo import (
    fmt_mbit,
    fmt_range,
    link_info,
    plot_bin_ms,
    rtt_range_ms,
    trace_gaps_ms,
)
from testbed.links.profiles import ProfileError, builtin_names, get_profile, profile_names
from testbed.links.traces import load_delay_trace, load_trace_ref
from testbed.tools.plan_view import network_lines


def _networks(campaign_path: str | None) -> dict[str, tuple[NetworkProfile, str]]:
    out: dict[str, tuple[NetworkProfile, str]] = {}
    builtin = set(builtin_names())
    for name in profile_names():
        try:
            out[name] = (get_profile(name), "built-in" if name in builtin else "registered")
        except ProfileError:
            continue  # its traces are missing here; `show` says why
    if campaign_path is not None:
        campaign = load_campaign(campaign_path)
        for name, profile in campaign.networks.items():
            out[name] = (profile, f"campaign {campaign.name}")
    return out


def networks_list(console: Console, *, campaign: str | None = None) -> None:
    table = Table(title="networks (`testbed networks show NAME` for one)")
    for column in ("name", "from", "base RTT", "up mean", "down mean", "longest outage",
                   "hosts with their own link"):
        table.add_column(column)
    for name, (profile, origin) in _networks(campaign).items():
        if profile.link is None:
            table.add_row(name, origin, "0 ms", "unshaped", "unshaped", "-", "-")
            continue
        info = link_info(profile.link)
        outages = [d.longest_outage_s for d in (info.up, info.down)
                   if d.longest_outage_s is not None]
        rtt = rtt_range_ms(profile, 2)["agents"]
        table.add_row(name, origin, fmt_range(*rtt), fmt_mbit(info.up.mean_kbit),
                      fmt_mbit(info.down.mean_kbit),
                      f"{max(outages):.3g} s" if outages else "-",
                      ", ".join(sel for sel, _ in profile.hosts) or "-")
    console.print(table)


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def definition_toml(name: str, profile: NetworkProfile) -> str:
    """The resolved definition as the ``[networks.NAME]`` table that gives it."""
    data = network_to_data(profile)
    hosts = data.pop("hosts", {})
    lines = [f"[networks.{name}]", *(f"{k} = {_toml_value(v)}" for k, v in data.items())]
    for selector, link in hosts.items():
        lines += ["", f"[networks.{name}.hosts.{_toml_key(selector)}]",
                  *(f"{k} = {_toml_value(v)}" for k, v in link.items())]
    return "\n".join(lines)


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").isalnum() else json.dumps(key)


def networks_show(name: str, console: Console, *, campaign: str | None = None,
                  plot: Path | None = None) -> None:
    known = _networks(campaign)
    if name not in known:
        try:
            get_profile(name)  # raises the one-line reason (unknown, or traces missing)
        except ProfileError as exc:
            if campaign is not None or "unknown profile" not in str(exc):
                raise
            raise ProfileError(f"{exc} (a network a campaign file defines needs --campaign "
                               "FILE)") from None
    profile, origin = known[name]
    console.print(f"# {origin}", markup=False)
    console.print(definition_toml(name, profile), markup=False, highlight=False)
    console.print("", markup=False)
    for line in network_lines(name, profile, defined=origin.startswith("campaign"),
                              teams={(2, False), (2, True)}):
        console.print(line, markup=False)
    if plot is not None and profile.link is not None:
        write_network_plot(profile, plot)
        console.print(f"wrote {plot}", markup=False)


def _series(link: LinkSpec, side: str) -> tuple[Any, Any, str, int]:
    """Bin edges (s), capacity per bin (Mbit/s), the source's name and the bin width."""
    import numpy as np

    ref = link.trace_of(side)
    if ref is not None:
        trace = load_trace_ref(ref, "up" if side == "up" else "down")
        bin_ms = plot_bin_ms(trace.period_ms, trace_gaps_ms(trace.stamps_ms, trace.period_ms))
        rates = trace.capacity_series_kbit(bin_ms) / 1000.0
        edges = np.minimum(np.arange(rates.size + 1) * bin_ms, trace.period_ms) / 1000.0
        return edges, rates, trace.name, bin_ms
    rate = link.rate_of(side)
    label = "unlimited" if rate is None else f"{rate:g} kbit/s"
    return np.array([0.0, 60.0]), np.array([0.0 if rate is None else rate / 1000.0]), label, 0


def _delays(link: LinkSpec, side: str, end_s: float) -> tuple[list[float], list[float], str]:
    """One direction's one-way delay over trace time: a delay trace's steps, or flat."""
    own = link.side(side)
    if own.delay_trace is not None:
        steps = load_delay_trace(own.delay_trace).steps
        times = [t / 1000 for t, _ in steps] + [end_s]
        values = [d for _, d in steps]
        return times, values, f"{side}: {Path(own.delay_trace).name}"
    return [0.0, end_s], [own.delay_ms], f"{side}: {own.delay_ms:g} ms"


def write_network_plot(profile: NetworkProfile, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    network_figure(profile).savefig(path, dpi=100)


def network_figure(profile: NetworkProfile) -> Any:
    """Per distinct link: the capacity of both directions over one trace period (bins
    finer than its shortest outage; the last bin as wide as it is), and below it the
    one-way delay per crossing of each direction (propagation, or a delay trace's
    steps). Legends sit outside the data, to the right."""
    from matplotlib.figure import Figure

    links = [("every host", profile.link)] + [(f"hosts.{s}", lk) for s, lk in profile.hosts]
    rows = [(label, link) for label, link in links if link is not None]
    figure = Figure(figsize=(11, 3.6 * len(rows)), layout="constrained")
    axes = figure.subplots(2 * len(rows), 1, squeeze=False,
                           height_ratios=[3, 1.2] * len(rows))[:, 0]
    for i, (label, link) in enumerate(rows):
        ax, delay_ax = axes[2 * i], axes[2 * i + 1]
        end_s = 0.0  # one trace period (both directions' traces, or 60 s without)
        bins = []
        for side in ("up", "down"):
            edges, mbit, source, bin_ms = _series(link, side)
            end_s = max(end_s, float(edges[-1]))
            ax.stairs(mbit, edges, linewidth=0.8, label=f"{side}: {source}")
            bins += [f"{side} {bin_ms} ms"] if bin_ms else []
        ax.set_ylabel("Mbit/s")
        ax.set_xlim(0, end_s)
        ax.set_title(f"{profile.name}, {label}: capacity"
                     + (f" ({', '.join(bins)} bins)" if bins else ""), fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        for side, color in (("up", "#1f77b4"), ("down", "#ff7f0e")):
            times, values, name = _delays(link, side, end_s)
            delay_ax.stairs(values, times, color=color, linewidth=1.0, label=name,
                            baseline=None)
        delay_ax.set_ylabel("one-way delay ms", fontsize=8)
        delay_ax.set_xlim(0, end_s)
        delay_ax.set_ylim(bottom=0)
        delay_ax.grid(True, alpha=0.3)
        delay_ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1].set_xlabel("trace time (s)")
    return figure
