"""When a link may move a packet, and how long a crossing takes (pure, for the model).

- :class:`TraceOpportunities`: a Mahimahi trace unrolled periodically, replay started at
  an offset (``testbed.links.traces`` rules);
- :class:`RateOpportunities`: one 1500-byte opportunity every 1500*8/rate_kbit ms;
- :class:`DelaySteps`: the one-way delay of a delay trace, a step function of trace
  time (replay time + offset).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Protocol

PACKET_BYTES = 1500


class Opportunities(Protocol):
    """Delivery opportunities, indexed k = 0, 1, 2, ... in time order from replay start."""

    def time_of(self, k: int) -> float:
        """Replay time (ms since the trace clock started) of opportunity k."""
        ...

    def first_at_or_after(self, t_ms: float) -> int:
        """Index of the first opportunity at replay time >= t_ms."""
        ...


class TraceOpportunities:
    """Opportunities of a Mahimahi trace, unrolled periodically and started at `offset_ms`."""

    def __init__(self, stamps_ms: Sequence[int], period_ms: int, offset_ms: float = 0.0) -> None:
        stamps = [int(s) for s in stamps_ms]
        if not stamps or period_ms <= 0 or stamps[-1] != period_ms:
            raise ValueError("stamps_ms: non-empty, sorted, last stamp = period_ms > 0")
        if offset_ms < 0 or not math.isfinite(offset_ms):
            raise ValueError(f"offset_ms: a finite number >= 0, got {offset_ms!r}")
        self._stamps = stamps
        self._n = len(stamps)
        self._period = period_ms
        self._offset = math.fmod(offset_ms, period_ms)

    def time_of(self, k: int) -> float:
        cycle, i = divmod(k, self._n)
        return cycle * self._period + self._stamps[i] - self._offset

    def first_at_or_after(self, t_ms: float) -> int:
        trace_t = max(0.0, t_ms + self._offset)  # the trace unrolls from trace time 0
        cycle = math.floor(trace_t / self._period)
        # Stamps of cycle c lie in [c*period, (c+1)*period]: look in the previous cycle
        # too, because its last stamp equals this cycle's start.
        for c in (max(0, cycle - 1), cycle):
            i = bisect.bisect_left(self._stamps, trace_t - c * self._period)
            if i < self._n:
                return c * self._n + i
        return (cycle + 1) * self._n  # unreachable: stamps[-1] == period


class RateOpportunities:
    """One opportunity every 1500*8/rate_kbit ms, starting at replay time 0."""

    def __init__(self, rate_kbit: float) -> None:
        if not rate_kbit > 0:
            raise ValueError(f"rate_kbit: a number > 0, got {rate_kbit!r}")
        self.interval_ms = PACKET_BYTES * 8 / rate_kbit

    def time_of(self, k: int) -> float:
        return k * self.interval_ms

    def first_at_or_after(self, t_ms: float) -> int:
        return max(0, math.ceil(t_ms / self.interval_ms - 1e-9))


class DelaySteps:
    """One-way delay as a step function of trace time (``traces.DelayTrace`` steps)."""

    def __init__(self, steps: Sequence[tuple[float, float]], offset_ms: float = 0.0) -> None:
        if not steps or steps[0][0] != 0:
            raise ValueError("steps: non-empty, first at 0 ms")
        self._times = [float(t) for t, _ in steps]
        self._delays = [float(d) for _, d in steps]
        self.offset_ms = offset_ms

    def at(self, replay_ms: float) -> float:
        i = bisect.bisect_right(self._times, replay_ms + self.offset_ms) - 1
        return self._delays[max(0, i)]
