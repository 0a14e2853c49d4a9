"""What a network is, in numbers a person reads: capacity, outages, round trips (pure).

Used by ``testbed networks list|show`` and by ``testbed run --dry-run`` / ``testbed
check``. Round trips are propagation only (no queueing, no serialisation): between two
hosts with links A and B, 2 x (A's delay + B's delay); a delay trace counts with its
range. Mean capacity is a trace's long-run rate (every stamp one 1500-byte packet per
period) or the fixed rate; ``None`` is an unlimited direction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from testbed.links.linkspec import CENTRAL_HOST, GilbertLoss, LinkSpec, NetworkProfile, QueueSpec
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
    delay_min_ms: float  # over both directions
    delay_max_ms: float
    loss: str
    queue: str
    delay_ms: dict[str, tuple[float, float]]  # per direction (min, max)
    order: str = "link_then_delay"


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


def _loss_of(pct: float, g: GilbertLoss | None) -> str:
    if g is not None:
        return (f"gilbert p={g.p:g} r={g.r:g} good {g.loss_good_pct:g}% bad "
                f"{g.loss_bad_pct:g}% (mean {g.mean_loss_pct:.3g}%, bad runs of "
                f"{g.mean_bad_run_packets:.3g} packets)")
    return f"iid {pct:g}%" if pct else "none"


def _per_side(up: str, down: str) -> str:
    return up if up == down else f"up {up}, down {down}"


def loss_text(link: LinkSpec) -> str:
    up, down = (_loss_of(s.loss_pct, s.gilbert) for s in link.sides)
    return _per_side(up, down)


def _queue_of(q: QueueSpec) -> str:
    bounds = f"{q.packets} packets" + (f", {q.bytes} bytes" if q.bytes is not None else "")
    if q.kind in ("codel", "fq_codel"):
        flows = f", {q.flows} flows" if q.kind == "fq_codel" else ""
        return (f"{q.kind} target {q.target_ms:g} ms interval {q.interval_ms:g} ms{flows}, "
                f"{bounds}")
    if q.kind == "pie":
        return f"pie target {q.target_ms:g} ms tupdate {q.tupdate_ms:g} ms, {bounds}"
    return f"{q.kind} {bounds}"


def queue_text(link: LinkSpec) -> str:
    up, down = (_queue_of(s.queue) for s in link.sides)
    return _per_side(up, down)


def delay_range_ms(link: LinkSpec, direction: str) -> tuple[float, float]:
    """(lowest, highest) one-way delay of one direction (a delay trace's range)."""
    side = link.side(direction)
    if side.delay_trace is None:
        return side.delay_ms, side.delay_ms
    trace = load_delay_trace(side.delay_trace)
    return trace.min_ms, trace.max_ms


def link_info(link: LinkSpec) -> LinkInfo:
    delays = {d: delay_range_ms(link, d) for d in ("up", "down")}
    return LinkInfo(direction_info(link, "up"), direction_info(link, "down"),
                    min(lo for lo, _ in delays.values()), max(hi for _, hi in delays.values()),
                    loss_text(link), queue_text(link), delays, link.order)


def delay_text(info: LinkInfo) -> str:
    """The delay per crossing, per direction when they differ, and the order if not
    the default."""
    up, down = (fmt_range(*info.delay_ms[d]) for d in ("up", "down"))
    text = _per_side(up, down)
    return text + ("" if info.order == "link_then_delay" else f" ({info.order})")


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

    def one_way(a: str, b: str, end: int) -> float:
        """A's uplink and B's downlink: the lowest (END 0) or highest (1) delay."""
        return spans[a].delay_ms["up"][end] + spans[b].delay_ms["down"][end]

    def span(pairs: list[tuple[str, str]]) -> tuple[float, float]:
        lows = [one_way(a, b, 0) + one_way(b, a, 0) for a, b in pairs]
        highs = [one_way(a, b, 1) + one_way(b, a, 1) for a, b in pairs]
        return (min(lows), max(highs)) if pairs else (0.0, 0.0)

    out = {"agents": span([(a, b) for i, a in enumerate(agent_names)
                           for b in agent_names[i + 1:]])}
    if central and CENTRAL_HOST in spans:
        out["central"] = span([(a, CENTRAL_HOST) for a in agent_names])
    return out


PLOT_BINS_MS = (1000, 500, 200, 100, 50)
OUTAGE_PLOT_MS = 200.0
"""An outage a plot should show: this long or longer without a delivery opportunity."""


def plot_bin_ms(span_ms: float, gaps_ms: Sequence[float] | np.ndarray) -> int:
    """Bins for a capacity or throughput plot over SPAN_MS: 1 s over long spans (500 ms
    over 2 min or less, 100 ms over 30 s or less), and never wider than half the
    shortest outage (a gap of OUTAGE_PLOT_MS or more), so each outage shows as at least
    one empty bin; at least 50 ms."""
    base = 1000 if span_ms > 120_000 else 500 if span_ms > 30_000 else 100
    outages = [g for g in gaps_ms if g >= OUTAGE_PLOT_MS]
    if not outages:
        return base
    limit = min(outages) / 2
    return min(base, next((b for b in PLOT_BINS_MS if b <= limit), PLOT_BINS_MS[-1]))


def trace_gaps_ms(stamps_ms: np.ndarray, period_ms: float) -> np.ndarray:
    """The stretches between a trace's delivery opportunities over one period."""
    unrolled = np.append(stamps_ms, period_ms + stamps_ms[0])
    gaps: np.ndarray = np.diff(unrolled).astype(np.float64)
    return gaps


def outage_ms_in_window(link: LinkSpec, direction: str, start_ms: float, end_ms: float,
                        min_gap_ms: float = OUTAGE_PLOT_MS) -> float:
    """How long one direction is out (stretches of MIN_GAP_MS or more without a
    delivery opportunity, clipped to the window) in trace time [START_MS, END_MS), in
    ms; 0 without a trace."""
    ref = link.trace_of(direction)
    if ref is None or end_ms <= start_ms:
        return 0.0
    trace = load_trace_ref(ref, "up" if direction == "up" else "down")
    period = float(trace.period_ms)
    periods = int((end_ms - start_ms) // period)
    if periods > 1:  # a long window repeats one period's outages (never unrolled whole)
        one = outage_ms_in_window(link, direction, start_ms, start_ms + period, min_gap_ms)
        return one * periods + outage_ms_in_window(
            link, direction, start_ms + periods * period, end_ms, min_gap_ms)
    times = trace.opportunities(0.0, end_ms - start_ms, start_ms)
    edges = np.concatenate(([0.0], times, [end_ms - start_ms]))
    gaps = np.diff(edges)
    return float(gaps[gaps >= min_gap_ms].sum())


def team_outage_s(profile: NetworkProfile, agents: int, central: bool, *, offset_s: float,
                  seconds: float, min_gap_ms: float = OUTAGE_PLOT_MS) -> float:
    """Outage seconds (gaps of MIN_GAP_MS or more) a team meets in SECONDS from trace
    offset OFFSET_S: the most any one of its distinct link directions has (a trace
    shared by several hosts is out for all of them at once, so it counts once)."""
    seen: dict[tuple[str | None, str, float], float] = {}
    for _, link in team_links(profile, agents, central):
        start = (offset_s + link.trace_offset_s) * 1000.0
        for direction in ("up", "down"):
            key = (link.trace_of(direction), direction, link.trace_offset_s)
            if key[0] is None or key in seen:
                continue
            seen[key] = outage_ms_in_window(link, direction, start,
                                            start + seconds * 1000.0, min_gap_ms) / 1000.0
    return max(seen.values(), default=0.0)


def fmt_range(low: float, high: float, unit: str = "ms") -> str:
    return f"{low:g} {unit}" if abs(high - low) < 1e-9 else f"{low:g}-{high:g} {unit}"


def fmt_mbit(kbit: float | None) -> str:
    return "unlimited" if kbit is None else f"{kbit / 1000:.3g} Mbit/s"
