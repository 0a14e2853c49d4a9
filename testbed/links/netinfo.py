"""What a network is, in numbers a person reads: capacity, outages, round trips (pure).

Used by ``testbed networks list|show`` and by ``testbed run --dry-run`` / ``testbed
check``. Round trips are propagation only (no queueing, no serialisation): between two
hosts with links A and B, 2 x (A's delay + B's delay); a delay trace counts with its
range. Mean capacity is a trace's long-run rate (every stamp one 1500-byte packet per
period) or the fixed rate; ``None`` is an unlimited direction.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.links.linkspec import CENTRAL_HOST, LinkSpec, NetworkProfile
from testbed.links.traces import load_delay_trace, load_trace_ref


@dataclass(frozen=True)
class DirectionInfo:
    source: str  # trace file name, "12000 kbit/s", or "unlimited"
    mean_kbit: float | None
    longest_outage_s: float | None
    length_s: float | None


@dataclass(frozen=True)
class LinkInfo:
    up: DirectionInfo
    down: DirectionInfo
    delay_min_ms: float
    delay_max_ms: float
    loss: str
    queue: str


def direction_info(link: LinkSpec, side: str) -> DirectionInfo:
    ref = link.trace_of(side)
    if ref is not None:
        trace = load_trace_ref(ref, "up" if side == "up" else "down")
        return DirectionInfo(trace.name, trace.mean_rate_kbit(),
                             trace.longest_outage_ms() / 1000.0, trace.length_s)
    rate = link.rate_of(side)
    if rate is None:
        return DirectionInfo("unlimited", None, None, None)
    return DirectionInfo(f"{rate:g} kbit/s", rate, None, None)


def loss_text(link: LinkSpec) -> str:
    if link.gilbert is not None:
        g = link.gilbert
        return (f"gilbert p={g.p:g} r={g.r:g} good {g.loss_good_pct:g}% bad "
                f"{g.loss_bad_pct:g}% (mean {g.mean_loss_pct:.3g}%, bad runs of "
                f"{g.mean_bad_run_packets:.3g} packets)")
    return f"iid {link.loss_pct:g}%" if link.loss_pct else "none"


def queue_text(link: LinkSpec) -> str:
    bounds = f"{link.queue_packets} packets" + (
        f", {link.queue_bytes} bytes" if link.queue_bytes is not None else "")
    if link.queue_kind == "codel":
        return (f"codel target {link.codel_target_ms:g} ms interval "
                f"{link.codel_interval_ms:g} ms, {bounds}")
    return f"droptail {bounds}"


def link_info(link: LinkSpec) -> LinkInfo:
    low = high = link.delay_ms
    if link.delay_trace is not None:
        trace = load_delay_trace(link.delay_trace)
        low, high = trace.min_ms, trace.max_ms
    return LinkInfo(direction_info(link, "up"), direction_info(link, "down"), low, high,
                    loss_text(link), queue_text(link))


def team_links(profile: NetworkProfile, agents: int, central: bool,
               ) -> list[tuple[str, LinkSpec]]:
    """(host, link) of a team of AGENTS agents (a0..) and, with CENTRAL, the central host."""
    names = [f"a{i}" for i in range(agents)] + ([CENTRAL_HOST] if central else [])
    out = []
    for i, name in enumerate(names):
        link = profile.link_of(name, i)
        if link is not None:
            out.append((name, link))
    return out


def rtt_range_ms(profile: NetworkProfile, agents: int, central: bool = False,
                 ) -> dict[str, tuple[float, float]]:
    """Propagation-only round trips of a team: ``agents`` (between two agents) and,
    with CENTRAL, ``central`` (an agent and the central host); (lowest, highest)."""
    hosts = team_links(profile, agents, central)
    spans = {name: link_info(link) for name, link in hosts}
    agent_names = [n for n, _ in hosts if n != CENTRAL_HOST]

    def span(pairs: list[tuple[str, str]]) -> tuple[float, float]:
        lows = [2 * (spans[a].delay_min_ms + spans[b].delay_min_ms) for a, b in pairs]
        highs = [2 * (spans[a].delay_max_ms + spans[b].delay_max_ms) for a, b in pairs]
        return (min(lows), max(highs)) if pairs else (0.0, 0.0)

    out = {"agents": span([(a, b) for i, a in enumerate(agent_names)
                           for b in agent_names[i + 1:]])}
    if central and CENTRAL_HOST in spans:
        out["central"] = span([(a, CENTRAL_HOST) for a in agent_names])
    return out


def fmt_range(low: float, high: float, unit: str = "ms") -> str:
    return f"{low:g} {unit}" if abs(high - low) < 1e-9 else f"{low:g}-{high:g} {unit}"


def fmt_mbit(kbit: float | None) -> str:
    return "unlimited" if kbit is None else f"{kbit / 1000:.3g} Mbit/s"
