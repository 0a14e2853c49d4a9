"""What one request/response exchange waits for on a network's links, over replay time.

Rules of the model (the link model's, ``testbed.links.model``, for one small packet each
way; ``testbed report`` uses it to predict stall from counted rounds, docs/reports.md,
"Stall measured vs predicted from counted rounds"):

1. A packet offered to one direction of a link at replay time t leaves its queue at the
   first delivery opportunity at or after t (trace stamps unrolled from the link's
   offset, one every 1500*8/rate ms for a fixed rate, at once without one) and the
   link's delay after that; with the delay first (``order``), it joins the queue at
   t + delay instead. A delay trace gives the delay at that replay time.
2. An exchange between hosts A and B started at t crosses A's uplink, B's downlink, B's
   uplink and A's downlink; its round trip is the time until the answer is back at A.
3. An episode is a closed loop: the controller runs one operation at a time and each
   waits for its answers, so its exchanges sample replay time at the rate they
   complete. A chain of back-to-back exchanges from replay time 0 stands for them, and
   the round trip an exchange of the episode saw is the mean over the chain's exchanges
   that start inside the episode's replay window. A zero-capacity stretch so weighs by
   the exchanges that meet it (about one per stretch), not by its length, which is
   what a random instant would see.
4. The chain's first exchange meets the start of the trace (the AT&T uplink's first
   opportunity is at 831 ms); the episode's first event is always a plan (workload rule
   5), whose exchange is never on an action's path, so the mean leaves it out.
5. Hosts with different links: the mean over ordered pairs of distinct agents. The
   central service's own link (``[networks.NAME.hosts.central]``) is not used: rounds
   to it are taken at the agents' round trip.

Left out: more than one packet per opportunity (serialization), traffic queued ahead,
loss and retransmission, and CPU time at either end.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from testbed.links.linkspec import DIRECTIONS, LinkSpec, NetworkProfile, Side
from testbed.links.opportunities import (
    DelaySteps,
    Opportunities,
    RateOpportunities,
    TraceOpportunities,
)
from testbed.links.traces import load_delay_trace, load_trace_ref

#: How far past the window a chain is grown at a time (replay seconds).
CHAIN_STEP_S = 60.0


@dataclass(frozen=True)
class Crossing:
    """One direction of one link: its opportunities (None: unlimited), delay, order."""

    opportunities: Opportunities | None
    delay_ms: float
    delay_first: bool = False
    delay_steps: DelaySteps | None = None

    def exit_ms(self, t_ms: float) -> float:
        """When a packet offered at replay time T_MS leaves this direction (rule 1)."""
        delay = self.delay_ms if self.delay_steps is None else self.delay_steps.at(t_ms)
        if self.delay_first:
            return self._release(t_ms + delay)
        return self._release(t_ms) + delay

    def _release(self, t_ms: float) -> float:
        if self.opportunities is None:
            return t_ms
        return self.opportunities.time_of(self.opportunities.first_at_or_after(t_ms))


def crossing_of(side: Side, offset_s: float) -> Crossing:
    """The crossing of one resolved direction, its trace started at OFFSET_S (the cell's
    offset plus the link's own)."""
    offset_ms = (offset_s + side.trace_offset_s) * 1000.0
    opportunities: Opportunities | None = None
    if side.trace is not None:
        trace = load_trace_ref(side.trace, "up" if side.direction == "up" else "down")
        opportunities = TraceOpportunities(trace.stamps_ms.tolist(), trace.period_ms, offset_ms)
    elif side.rate_kbit is not None:
        opportunities = RateOpportunities(side.rate_kbit)
    steps = None
    if side.delay_trace is not None:
        steps = DelaySteps(load_delay_trace(side.delay_trace).steps, offset_ms)
    return Crossing(opportunities, side.delay_ms, side.delay_first, steps)


def round_trip_ms(path: tuple[Crossing, Crossing, Crossing, Crossing], t_ms: float) -> float:
    """Round trip of one exchange started at T_MS over the four crossings (rule 2)."""
    t = t_ms
    for crossing in path:
        t = crossing.exit_ms(t)
    return t - t_ms


@dataclass
class Chain:
    """Back-to-back exchanges from replay time 0 (rule 3), grown on demand."""

    path: tuple[Crossing, Crossing, Crossing, Crossing]
    starts_ms: list[float]
    rtts_ms: list[float]

    def grow(self, until_ms: float) -> None:
        t = self.starts_ms[-1] + self.rtts_ms[-1] if self.starts_ms else 0.0
        while t < until_ms:
            rtt = round_trip_ms(self.path, t)
            self.starts_ms.append(t)
            self.rtts_ms.append(rtt)
            t += rtt

    def window(self, window_s: float) -> np.ndarray:
        """Round trips of the exchanges that start in [0, WINDOW_S), the first left out
        (rule 4; kept when it is the only one)."""
        end = max(0.0, window_s) * 1000.0
        if not self.starts_ms or self.starts_ms[-1] + self.rtts_ms[-1] < end:
            self.grow(end + CHAIN_STEP_S * 1000.0)
        starts = np.asarray(self.starts_ms)
        rtts = np.asarray(self.rtts_ms)
        inside = rtts[starts < end] if end > 0 else rtts[:1]
        return inside[1:] if inside.size > 1 else inside


def path_of(a: LinkSpec, b: LinkSpec, offset_s: float
            ) -> tuple[Crossing, Crossing, Crossing, Crossing]:
    """A's uplink, B's downlink, B's uplink, A's downlink (rule 2)."""
    up, down = DIRECTIONS
    return (crossing_of(a.side(up), offset_s), crossing_of(b.side(down), offset_s),
            crossing_of(b.side(up), offset_s), crossing_of(a.side(down), offset_s))


@lru_cache(maxsize=256)
def _chain(a: LinkSpec, b: LinkSpec, offset_s: float) -> Chain:
    return Chain(path_of(a, b, offset_s), [], [])


def agent_pairs(profile: NetworkProfile, agents: int) -> list[tuple[LinkSpec, LinkSpec, int]]:
    """Distinct (A's link, B's link) of ordered pairs of distinct agents, with their
    counts (rule 5); empty for an unshaped network."""
    links = [profile.link_of(f"a{i}", i) for i in range(agents)]
    counts: dict[tuple[LinkSpec, LinkSpec], int] = {}
    for i, a in enumerate(links):
        for j, b in enumerate(links):
            if i != j and a is not None and b is not None:
                counts[(a, b)] = counts.get((a, b), 0) + 1
    return [(a, b, n) for (a, b), n in counts.items()]


def exchange_rtt_ms(profile: NetworkProfile, agents: int, *, offset_s: float,
                    window_s: float,
                    statistic: Callable[[np.ndarray], float] = lambda x: float(np.mean(x)),
                    ) -> float:
    """The round trip one exchange of an episode saw (rules 3-5): STATISTIC (the mean)
    of the chain's round trips in the episode's replay window, over agent pairs. NaN for
    an unshaped network or a team of one."""
    pairs = agent_pairs(profile, agents)
    total = sum(n for _, _, n in pairs)
    if not total or not math.isfinite(window_s):
        return math.nan
    return sum(n * statistic(_chain(a, b, float(offset_s)).window(window_s))
               for a, b, n in pairs) / total


def base_rtt_ms(profile: NetworkProfile, agents: int) -> float:
    """Propagation-only round trip, the mean over ordered pairs of distinct agents."""
    pairs = agent_pairs(profile, agents)
    total = sum(n for _, _, n in pairs)
    if not total:
        return math.nan
    return sum(n * NetworkProfile.rtt_between_ms(a, b) for a, b, n in pairs) / total
