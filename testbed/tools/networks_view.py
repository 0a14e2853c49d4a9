"""``testbed networks list|show NAME``: the networks a campaign can name, resolved.

``list`` shows every registered network (and, with ``--campaign FILE``, the file's
own); ``show`` prints one network's resolved definition (as the TOML table that
defines it), its links' mean capacity and longest outage, its propagation round trips,
and with ``--plot FILE.png`` the capacity of every link direction over one trace
period (and the delay of a delay trace).
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
from testbed.links.netinfo import fmt_mbit, fmt_range, link_info, rtt_range_ms
from testbed.links.profiles import ProfileError, builtin_names, get_profile, profile_names
from testbed.links.traces import load_delay_trace, load_trace_ref
from testbed.tools.plan_view import network_lines

PLOT_BIN_MS = 1000


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


def _series(link: LinkSpec, side: str) -> tuple[Any, Any, str]:
    import numpy as np

    ref = link.trace_of(side)
    if ref is not None:
        trace = load_trace_ref(ref, "up" if side == "up" else "down")
        rates = trace.capacity_series_kbit(PLOT_BIN_MS) / 1000.0
        return np.arange(rates.size) * PLOT_BIN_MS / 1000.0, rates, trace.name
    rate = link.rate_of(side)
    label = "unlimited" if rate is None else f"{rate:g} kbit/s"
    return np.array([0.0, 60.0]), np.array([0.0 if rate is None else rate / 1000.0] * 2), label


def write_network_plot(profile: NetworkProfile, path: Path) -> None:
    """Capacity of every distinct link over one trace period; delay traces below."""
    from matplotlib.figure import Figure

    links = [("every host", profile.link)] + [(f"hosts.{s}", lk) for s, lk in profile.hosts]
    rows = [(label, link) for label, link in links if link is not None]
    figure = Figure(figsize=(10, 2.6 * len(rows)), layout="constrained")
    axes = figure.subplots(len(rows), 1, squeeze=False)[:, 0]
    for ax, (label, link) in zip(axes, rows, strict=True):
        for side in ("up", "down"):
            t, mbit, source = _series(link, side)
            ax.step(t, mbit, where="post", linewidth=0.8, label=f"{side}: {source}")
        ax.set_ylabel("Mbit/s")
        ax.set_title(f"{profile.name}, {label}: capacity ({PLOT_BIN_MS} ms bins), delay "
                     f"{fmt_range(link_info(link).delay_min_ms, link_info(link).delay_max_ms)}")
        if link.delay_trace is not None:
            steps = load_delay_trace(link.delay_trace).steps
            twin = ax.twinx()
            twin.step([t / 1000 for t, _ in steps], [d for _, d in steps], where="post",
                      color="black", linewidth=0.8, label="delay")
            twin.set_ylabel("one-way delay ms")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("trace time (s)")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
