"""The netem backend's pure half: traces compiled into rate steps, qdisc parameters.

Nothing here touches the kernel (``testbed.links.netem`` applies these plans).

- A capacity trace cannot be replayed packet by packet by the kernel; it is compiled
  into one rate per fixed interval (:func:`compile_schedule`). Intervals with no
  opportunity are explicit zero steps; tbf cannot take a zero rate, so they are applied
  as :data:`ZERO_RATE_FLOOR_KBIT`, slow enough that nothing but the bucket's burst leaves.
- Each direction is planned as netem (one-way ``delay_ms``, ``loss_pct`` or a
  Gilbert-Elliott ``gemodel``) with a tbf child for rate-limited links; the drop-tail
  bound is tbf's byte limit, counted in Ethernet frames (IP packet + 14 bytes, what the
  qdisc sees on a veth): ``queue_packets`` full frames, and at most ``queue_bytes`` of
  IP bytes scaled to frames (:func:`limit_frame_bytes`). With CoDel, a ``codel`` qdisc
  under tbf holds the queue (its limit in packets, its target and interval).
- Every host is planned from its own link (``NetworkProfile.link_of``).
- :func:`unsupported` says which field of a network netem cannot express (a delay
  trace, a byte bound on a CoDel queue); the backend refuses such a network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from testbed.links.linkspec import LinkSpec, NetworkProfile
from testbed.links.traces import MTU_BYTES, Trace, kbit_per_opportunity_ms

DEFAULT_INTERVAL_MS = 10.0
"""Rate-change interval; ten changes per second per direction per host."""

ZERO_RATE_FLOOR_KBIT = 8.0
"""tbf rate standing for zero capacity (1000 B/s: a 1500-byte packet needs 1.5 s)."""

NETEM_DELAY_LIMIT_PACKETS = 100_000
"""netem's own FIFO only holds packets in flight for the delay; it must never drop."""

FRAME_OVERHEAD_BYTES = 14
"""Ethernet header a veth qdisc counts on top of the IP packet."""


# ----------------------------------------------------------------- pure: schedule compiler


@dataclass(frozen=True)
class RateStep:
    """From replay time `t_ms` until the next step the link carries `rate_kbit` (0 = outage)."""

    t_ms: float
    rate_kbit: float


def compile_schedule(
    trace: Trace,
    *,
    offset_ms: float,
    interval_ms: float,
    duration_ms: float,
    start_ms: float = 0.0,
) -> list[RateStep]:
    """One step per interval over [start_ms, start_ms + duration_ms) of replay time.

    Replay time 0 is trace time `offset_ms`. Each step's rate is what the trace's
    opportunities in that interval can carry (1500 bytes each); the last interval may
    be shorter and uses its real width. Compiling a long replay in consecutive pieces
    (`start_ms` = 0, d, 2d, ...) gives exactly the steps of compiling it whole.
    """
    for field_name, value in (("interval_ms", interval_ms), ("duration_ms", duration_ms)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{field_name}: must be a finite number > 0, got {value!r}")
    for field_name, value in (("offset_ms", offset_ms), ("start_ms", start_ms)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{field_name}: must be a finite number >= 0, got {value!r}")
    n_steps = math.ceil(duration_ms / interval_ms - 1e-9)
    end_ms = start_ms + duration_ms
    edges = np.minimum(start_ms + np.arange(n_steps + 1, dtype=np.float64) * interval_ms, end_ms)
    opportunities = trace.opportunities(start_ms, end_ms, offset_ms)
    # counts[i] = opportunities in [edges[i], edges[i+1])
    positions = np.searchsorted(opportunities, edges, side="left")
    counts = np.diff(positions)
    widths = np.diff(edges)
    return [
        RateStep(t_ms=float(edges[i]), rate_kbit=kbit_per_opportunity_ms(int(counts[i]), float(widths[i])))
        for i in range(n_steps)
    ]


# ----------------------------------------------------------------- pure: qdisc parameters


def tbf_params(rate_kbit: float, *, limit_bytes: int) -> dict[str, int]:
    """pyroute2 `tbf` arguments: rate in bytes/s, burst of one full frame or 1 ms of rate."""
    effective_kbit = max(rate_kbit, ZERO_RATE_FLOOR_KBIT)
    rate_bytes_s = max(1, round(effective_kbit * 1000 / 8))
    burst = max(MTU_BYTES + 14, math.ceil(rate_bytes_s / 1000))
    return {"rate": rate_bytes_s, "burst": burst, "limit": max(limit_bytes, burst)}


def limit_frame_bytes(queue_packets: int, queue_bytes: int | None) -> int:
    """tbf's byte limit for a drop-tail bound of QUEUE_PACKETS packets and at most
    QUEUE_BYTES IP bytes: exact for full-size packets (frames of 1514 bytes)."""
    frame = MTU_BYTES + FRAME_OVERHEAD_BYTES
    limit = queue_packets * frame
    if queue_bytes is not None:
        limit = min(limit, math.ceil(queue_bytes * frame / MTU_BYTES))
    return limit


def percent_u32(pct: float) -> int:
    """A percentage as netem's u32 probability (0 -> 0, 100 -> 2**32 - 1)."""
    return int((2**32 - 1) * pct / 100)


@dataclass(frozen=True)
class DirectionPlan:
    """Qdiscs of one direction of one host link, before anything touches the kernel."""

    delay_ms: float
    loss_pct: float
    limit_bytes: int
    trace: str | None  # rate follows this trace's schedule
    rate_kbit: float | None  # fixed rate; None with trace None = delay only
    gilbert: tuple[float, float, float, float] | None = None  # p, r, good %, bad %
    codel: tuple[int, float, float] | None = None  # limit packets, target ms, interval ms
    offset_ms: float = 0.0  # the link's own trace offset, added to the backend's

    @property
    def shaped(self) -> bool:
        return self.trace is not None or self.rate_kbit is not None

    def netem_params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "delay": round(self.delay_ms * 1000),  # microseconds
            "loss": self.loss_pct,
            "limit": NETEM_DELAY_LIMIT_PACKETS,
        }
        if self.gilbert is not None:
            params["gemodel"] = gemodel_params(*self.gilbert)
        return params

    def leaf_params(self) -> tuple[str, dict[str, Any]] | None:
        """The queue qdisc under tbf (None: tbf's own byte-limited fifo)."""
        if self.codel is None:
            return None
        limit, target_ms, interval_ms = self.codel
        return "codel", {"cdl_limit": limit, "cdl_target": round(target_ms * 1000),
                         "cdl_interval": round(interval_ms * 1000)}  # microseconds


def gemodel_params(p: float, r: float, loss_good_pct: float, loss_bad_pct: float,
                   ) -> dict[str, int]:
    """netem ``loss gemodel p r 1-h 1-k`` as the kernel's u32 fields (h: no loss in bad)."""
    return {"p": percent_u32(p * 100), "r": percent_u32(r * 100),
            "h": percent_u32(100 - loss_bad_pct), "k1": percent_u32(loss_good_pct)}


def plan_direction(link: LinkSpec, direction: str) -> DirectionPlan:
    """Describe one direction ('up' or 'down') of an access link."""
    if direction not in ("up", "down"):
        raise ValueError(f"direction: must be 'up' or 'down', got {direction!r}")
    g = link.gilbert
    return DirectionPlan(
        delay_ms=link.delay_ms,
        loss_pct=link.loss_pct,
        limit_bytes=limit_frame_bytes(link.queue_packets, link.queue_bytes),
        trace=link.trace_of(direction),
        rate_kbit=link.rate_of(direction),
        gilbert=None if g is None else (g.p, g.r, g.loss_good_pct, g.loss_bad_pct),
        codel=((link.queue_packets, link.codel_target_ms, link.codel_interval_ms)
               if link.queue_kind == "codel" else None),
        offset_ms=link.trace_offset_s * 1000.0,
    )


def unsupported(profile: NetworkProfile) -> str | None:
    """Why netem cannot run PROFILE exactly as defined (one line), or None."""
    for selector, link in [("", profile.link), *profile.hosts]:
        if link is None:
            continue
        where = f"network {profile.name}" + (f", host {selector}" if selector else "")
        if link.delay_trace is not None:
            return (f"{where}: delay_trace: the netem backend cannot vary the delay over "
                    "time; use backend userspace")
        if link.queue_kind == "codel" and link.queue_bytes is not None:
            return (f"{where}: queue.bytes: Linux codel bounds packets only; drop the byte "
                    "bound or use backend userspace")
    return None


def uses_codel(profile: NetworkProfile) -> bool:
    return any(link.queue_kind == "codel" for link in profile.links())
