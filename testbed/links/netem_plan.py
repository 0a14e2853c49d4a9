"""The netem backend's pure half: traces compiled into rate steps, qdisc parameters.

Nothing here touches the kernel (``testbed.links.netem`` applies these plans).

- A capacity trace cannot be replayed packet by packet by the kernel; it is compiled
  into one rate per fixed interval (:func:`compile_schedule`). Intervals with no
  opportunity are explicit zero steps; tbf cannot take a zero rate, so they are applied
  as :data:`ZERO_RATE_FLOOR_KBIT`, slow enough that nothing but the bucket's burst leaves.
- Each direction is planned as netem (one-way ``delay_ms``, ``loss_pct``) with a tbf
  child for rate-limited links; the drop-tail bound is tbf's byte limit: ``queue_bytes``,
  else ``queue_packets`` x 1500.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from testbed.links.profiles import LinkSpec
from testbed.links.traces import MTU_BYTES, Trace, kbit_per_opportunity_ms

DEFAULT_INTERVAL_MS = 10.0
"""Rate-change interval; ten changes per second per direction per host."""

ZERO_RATE_FLOOR_KBIT = 8.0
"""tbf rate standing for zero capacity (1000 B/s: a 1500-byte packet needs 1.5 s)."""

NETEM_DELAY_LIMIT_PACKETS = 100_000
"""netem's own FIFO only holds packets in flight for the delay; it must never drop."""


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


@dataclass(frozen=True)
class DirectionPlan:
    """Qdiscs of one direction of one host link, before anything touches the kernel."""

    delay_ms: float
    loss_pct: float
    limit_bytes: int
    trace: str | None  # rate follows this trace's schedule
    rate_kbit: float | None  # fixed rate; None with trace None = delay only

    @property
    def shaped(self) -> bool:
        return self.trace is not None or self.rate_kbit is not None

    def netem_params(self) -> dict[str, Any]:
        return {
            "delay": round(self.delay_ms * 1000),  # microseconds
            "loss": self.loss_pct,
            "limit": NETEM_DELAY_LIMIT_PACKETS,
        }


def plan_direction(link: LinkSpec, direction: str) -> DirectionPlan:
    """Describe one direction ('up' or 'down') of a profile's access link."""
    if direction not in ("up", "down"):
        raise ValueError(f"direction: must be 'up' or 'down', got {direction!r}")
    limit = link.queue_bytes if link.queue_bytes is not None else link.queue_packets * MTU_BYTES
    return DirectionPlan(
        delay_ms=link.delay_ms,
        loss_pct=link.loss_pct,
        limit_bytes=limit,
        trace=link.up_trace if direction == "up" else link.down_trace,
        rate_kbit=link.rate_kbit,
    )
