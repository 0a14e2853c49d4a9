"""``testbed run CAMPAIGN --dry-run`` and ``testbed check CAMPAIGN``: the plan, nothing made.

Prints the cells, the episode count, each network's links (mean capacity, longest
outage, delay, loss, queue) and propagation round trips, which backends could run it,
and a rough wall-time estimate. It reads the campaign and its trace files only: no run
directory, no namespace, no probe of the kernel (``auto`` is resolved when a run
starts).

The estimate (not a measurement; docs/campaigns.md), for a host running nothing else:
a loopback episode costs 3 ms per work unit; an emulated one RTTS_PER_UNIT round trips
per unit (4 with a new connection per RPC, 2.5 with reused ones; fitted once to the
AT&T figures of docs/benchmarks.md), where a round trip is the median agent pair's
propagation plus two full packets each way at the links' mean capacity; plus the
episode's traffic (KIB_PER_ACTION by record tier, from the reference runs) through the
slowest agent uplink; plus the long outages its links have while it runs (from its
trace offset, for as long as it lasts; gaps of OUTAGE_STALL_MS or more: the episode
waits them out, and TCP needs about OUTAGE_RECOVERY_S more; shorter gaps are in the
mean capacity, and TCP rides them out); plus setup per episode, per topology (its
namespaces and emulator, and a node process per host) and per run (start, probes,
and the consolidation at the end).
Episodes on emulated links divide by ``--jobs``.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from testbed.campaign.model import Campaign, Cell
from testbed.links.linkspec import CENTRAL_HOST, NetworkProfile
from testbed.links.netem_plan import unsupported
from testbed.links.netinfo import (
    delay_text,
    fmt_mbit,
    fmt_range,
    link_info,
    rtt_range_ms,
    team_links,
    team_outage_s,
)

RTTS_PER_UNIT = {"fresh": 4.0, "reuse": 2.5}
LOOPBACK_UNIT_S = 0.003
EPISODE_SETUP_S = 0.3
RUN_START_S = 4.0
"""Start, imports and (as root) the backend probes' scratch namespaces (about 3.7 s of
CPU measured for `testbed check` as root)."""
RUN_END_S = 2.0
"""Consolidating the shards and printing the summary (pandas, pyarrow)."""
TOPOLOGY_SETUP_S = 1.0
HOST_START_S = 0.7
"""A node process per host: started together, about 1.4 s of CPU each on two cores."""
OUTAGE_RECOVERY_S = 0.5
OUTAGE_STALL_MS = 1500.0
"""An outage this long outlasts TCP's first retransmission timeouts and stalls an episode
(the AT&T downlink's many 1 s gaps do not: its episodes take what its mean capacity
says, results/rates)."""
PACKET_BITS = 1500 * 8
KIB_PER_ACTION = {"compact": 7.0, "artifact": 660.0}
MAX_CELL_LINES = 40


def _episode_s(profile: NetworkProfile, cell: Cell) -> float:
    """One episode: its link-bound work, then what the outages of the trace window it
    replays add (twice: the window grows with what they add)."""
    base = _base_episode_s(profile, cell)
    if profile.link is None or not any(lk.trace_driven for lk in profile.links()):
        return base
    seconds = base
    for _ in range(2):
        outage = team_outage_s(profile, cell.agents, cell.needs_central,
                               offset_s=cell.trace_offset_s, seconds=seconds,
                               min_gap_ms=OUTAGE_STALL_MS)
        seconds = base + outage + (OUTAGE_RECOVERY_S if outage else 0.0)
    return seconds


def _base_episode_s(profile: NetworkProfile, cell: Cell) -> float:
    if profile.link is None:
        return EPISODE_SETUP_S / 6 + cell.units * LOOPBACK_UNIT_S
    hosts = team_links(profile, cell.agents, cell.needs_central)
    rtts = []
    infos = {name: link_info(link) for name, link in hosts}
    names = list(infos)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            rtt = sum(infos[x].delay_ms[d][1] for x, d in ((a, "up"), (b, "down"), (b, "up"),
                                                         (a, "down")))
            for info, side in ((infos[a], "up"), (infos[b], "down"), (infos[b], "up"),
                               (infos[a], "down")):
                kbit = getattr(info, side).mean_kbit
                rtt += 0.0 if not kbit else 2 * PACKET_BITS / kbit
            rtts.append(rtt)
    rtt_s = (statistics.median(rtts) if rtts else 0.0) / 1000.0
    actions = max(1, math.floor(cell.units / (2 + cell.rho) + 0.5))
    ups = [info.up.mean_kbit for name, info in infos.items() if name != CENTRAL_HOST]
    slowest = min((k for k in ups if k), default=None)
    transfer_s = 0.0 if slowest is None else \
        actions * KIB_PER_ACTION.get(cell.tier, 7.0) * 8192 / (slowest * 1000)
    return (EPISODE_SETUP_S + transfer_s
            + cell.units * RTTS_PER_UNIT.get(cell.connection, 4.0) * rtt_s)


def estimate_wall_s(campaign: Campaign, jobs: int = 1) -> float:
    """Rough wall time of the whole campaign (module docstring)."""
    loop_s = emulated_s = 0.0
    profiles = {name: campaign.network_profile(name) for name in campaign.network_names()}
    command = campaign.command
    for cell, _template in campaign.episodes():
        seconds = (_episode_s(profiles[cell.network], cell) if command is None else
                   EPISODE_SETUP_S + (command.lead_ms + cell.units * command.unit_ms) / 1000)
        if profiles[cell.network].link is None:
            loop_s += seconds
        else:
            emulated_s += seconds
    setup_s = loop_setup_s = 0.0
    for key, _ in campaign.groups():
        hosts = key.agents + int(key.central)
        if profiles[key.network].link is None:
            loop_setup_s += hosts * HOST_START_S
        else:
            setup_s += TOPOLOGY_SETUP_S + hosts * HOST_START_S
    return (RUN_START_S + RUN_END_S + loop_s + loop_setup_s
            + (emulated_s + setup_s) / max(1, jobs))


def estimate_warnings(campaign: Campaign, jobs: int = 1) -> list[str]:
    """Networks whose episodes the estimate puts beyond ``options.episode_timeout_s``
    (they would be aborted), one line each."""
    limit = campaign.options.episode_timeout_s
    worst: dict[str, float] = {}
    for cell in campaign.cells():
        seconds = _episode_s(campaign.network_profile(cell.network), cell)
        worst[cell.network] = max(worst.get(cell.network, 0.0), seconds)
    return [f"grid.network: episodes on {name} are estimated at about "
            f"{_fmt_duration(seconds)}, beyond options.episode_timeout_s ({limit:g} s); "
            "they would be aborted"
            for name, seconds in worst.items() if seconds > limit]


def _fmt_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 600:
        return f"{seconds / 60:.1f} min"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def network_lines(name: str, profile: NetworkProfile, *, defined: bool,
                  teams: set[tuple[int, bool]]) -> list[str]:
    """What one network is, line by line (links, round trips, backends)."""
    where = "defined in the campaign" if defined else "built-in"
    lines = [f"network {name} ({where}){': ' + profile.description if profile.description else ''}"]
    if profile.link is None:
        return [*lines, "  unshaped: no namespaces, every host on 127.0.0.1 (backend none)"]
    for label, link in [("every host", profile.link),
                        *((f"hosts.{sel}", lk) for sel, lk in profile.hosts)]:
        info = link_info(link)
        parts = []
        for side in ("up", "down"):
            d = getattr(info, side)
            outage = "" if d.longest_outage_s is None else \
                f", longest outage {d.longest_outage_s:.3g} s"
            source = "" if d.source in ("unlimited",) or d.source.endswith("kbit/s") else \
                f" ({d.source})"
            parts.append(f"{side} {fmt_mbit(d.mean_kbit)}{source}{outage}")
        delay = delay_text(info)
        lines.append(f"  {label}: {'; '.join(parts)}; delay {delay} per crossing; loss "
                     f"{info.loss}; queue {info.queue}")
    for agents, central in sorted(teams):
        rtts = rtt_range_ms(profile, agents, central)
        text = f"agent to agent {fmt_range(*rtts['agents'])}"
        if "central" in rtts:
            text += f", agent to central {fmt_range(*rtts['central'])}"
        lines.append(f"  base round trip ({agents} agents{' + central' if central else ''}): "
                     f"{text}")
    for sel, cc in profile.host_congestion_control:
        lines.append(f"  hosts.{sel}: congestion control {cc} (the network's: "
                     f"{profile.congestion_control})")
    netem = unsupported(profile)
    lines.append("  backends: userspace" + (", netem" if netem is None else
                                             f" (netem refuses: {netem})"))
    return lines


def backend_line(chosen: str, probed: dict[str, str] | None, cluster: str | None) -> str:
    """What the run's backends will be: probed here, chosen by the workers, or unknown."""
    if chosen == "sim":
        return ("backend: sim (every episode in virtual time: nothing to probe, no root; "
                "docs/sim.md)")
    if cluster is not None:
        return f"backend: {chosen} (each worker of {cluster} probes its own)"
    if probed is None:
        return (f"backend: {chosen} (not probed: that needs root; `testbed run` probes "
                "before it creates anything, see `testbed doctor`)")
    shaped = {net: b for net, b in probed.items() if b != "none"}
    if not shaped:
        return "backend: none (every network is unshaped)"
    return f"backend: {chosen}, probed here: " + ", ".join(
        f"{net} on {b}" for net, b in shaped.items())


def plan_lines(campaign: Campaign, *, jobs: int = 1, backend: str | None = None,
               probed: dict[str, str] | None = None, cluster: str | None = None,
               ) -> list[str]:
    cells = campaign.cells()
    episodes = campaign.episodes()
    lines = [f"campaign {campaign.name} ({campaign.source}): {len(cells)} cells x "
             f"{len(campaign.templates)} templates = {len(episodes)} episodes, "
             f"{len(campaign.groups())} topologies"]
    for cell in cells[:MAX_CELL_LINES]:
        lines.append(f"  cell {cell.id}")
    if len(cells) > MAX_CELL_LINES:
        lines.append(f"  ... {len(cells) - MAX_CELL_LINES} more cells")
    teams: dict[str, set[tuple[int, bool]]] = {}
    for cell in cells:
        teams.setdefault(cell.network, set()).add((cell.agents, cell.needs_central))
    for name in campaign.network_names():
        lines += network_lines(name, campaign.network_profile(name),
                               defined=name in campaign.networks, teams=teams[name])
    lines += command_lines(campaign)
    chosen = backend or campaign.options.backend
    lines.append(backend_line(chosen, probed, cluster))
    if campaign.model is not None:
        lines.append(f"model: {campaign.model.model} at {campaign.model.base_url} (placement "
                     f"{campaign.model.placement}; probed when the run starts; the estimate "
                     "below leaves out generation: 3-4 role calls per task)")
    if campaign.decisions is not None:
        lines.append(f"decisions: the planners' decisions recorded under "
                     f"{campaign.decisions.path}")
    if campaign.options.link_log:
        lines.append("link_log: every episode writes per-host packet logs under "
                     "<out>/links/ (userspace backend)")
    lines.append(f"estimated wall time: about {_fmt_duration(estimate_wall_s(campaign, jobs))}"
                 f" with --jobs {jobs} (rough; docs/campaigns.md)")
    return lines


def command_lines(campaign: Campaign) -> list[str]:
    """A command workload's programs, in start order, and its schedule's pace."""
    command = campaign.command
    if command is None:
        return []
    lines = [f"command {command.name}: hosts a0.. (the cell's agents)"
             + "".join(f", {h}" for h in command.hosts)
             + f"; one unit every {command.unit_ms:g} ms after a {command.lead_ms:g} ms lead;"
             f" each episode stopped after {command.timeout_s:g} s"]
    for i, run in enumerate(command.runs):
        notes = [n for n in ("service" if run.service else "",
                             f"ready {run.ready}" if run.ready else "") if n]
        lines.append(f"  run[{i}] on {', '.join(run.on)}"
                     + (f" ({', '.join(notes)})" if notes else "") + f": {' '.join(run.argv)}")
    return lines


def print_plan(campaign: Campaign, console: Any, *, jobs: int = 1,
               backend: str | None = None, probed: dict[str, str] | None = None,
               cluster: str | None = None) -> None:
    for line in plan_lines(campaign, jobs=jobs, backend=backend, probed=probed,
                           cluster=cluster):
        console.print(line, markup=False)
    console.print("dry run: nothing was created (no run directory, no namespace)",
                  markup=False)
