"""The link model (Mahimahi's mm-link + mm-delay), pure: no kernel, time is an input.

The userspace backend's emulator process runs it on real packets; ``testbed bench
link`` replays it offline as the prediction a measurement is compared with.

Rules of the model (one `LinkQueue` per host per direction):

- A packet offered at time t joins a FIFO drop-tail queue. It is dropped on arrival if the
  queue would then hold more than `queue_packets` packets or `queue_bytes` bytes (the
  packet partly sent at an opportunity still counts as queued). A drop-head queue
  (`drop_head`, Mahimahi's ``drophead``) always takes the arriving packet and drops the
  oldest packets not yet started until the bounds hold again.
- The queue drains only at delivery opportunities. Each opportunity carries up to 1500
  bytes of queued data: several small packets, or a slice of a large one (a packet leaves
  when its last byte has been carried). Bytes an opportunity cannot use are lost, as in
  mm-link. An opportunity at time T serves only packets that arrived at or before T, and
  is used once: a packet offered after it was visited (even at time T) waits for the next.
- Opportunities come from a capacity trace (stamps in ms, wrapping with the last stamp as
  period, replay starting at `offset_ms`), or every 1500*8/rate_kbit ms for a fixed rate,
  or the link is unlimited (a packet is released the moment it arrives).
- A released packet is lost with probability `loss_pct`, or as a Gilbert-Elliott chain
  says (``testbed.links.disciplines``; seeded RNG), otherwise it leaves the link
  `delay_ms` after its release. With a delay trace the delay is the trace's value at the
  release time (replay time + offset), and a packet never overtakes the one before it
  (exit = max(release + delay, previous exit)): the path stays FIFO when the delay drops.
- With CoDel (`codel`), the packet about to start leaving at an opportunity may be
  dropped instead, by RFC 8289's rules on its sojourn time (arrival -> opportunity).
- `delay_first` puts the delay before the queue (``order = "delay_then_link"``, and
  the downlink of ``order = "mahimahi"``, as ``mm-delay`` outside ``mm-link``): a packet
  offered at t reaches the queue at t + delay (the delay trace's value at t; still
  FIFO), is queued there as if offered then (opportunities up to that time are used
  first, as mm-link does), and leaves the link at its release.
- Times are model milliseconds (the emulator feeds `time.monotonic()` * 1000). Exit times
  are *ideal* times (release time + delay), not the time the caller happened to look, so
  wake-up lateness of one stage never accumulates into the next.
- On a zero-capacity stretch of a trace (the AT&T uplink has stretches of many seconds)
  packets wait in the queue until the next opportunity, or are dropped once it is full.

Statistics since the last `restart` or `clear_window`: bytes released at opportunities,
each released packet's queueing delay (sojourn, capped at :data:`MAX_SOJOURN_SAMPLES`) and
the capacity the opportunities offered. An optional `LinkLog` (``testbed.links.linklog``)
writes every event in Mahimahi's log format.

`EmulatorCore` (``testbed.links.core``) joins the per-host links and injects faults.
"""

from __future__ import annotations

import math
import random
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from testbed.links.disciplines import Codel, GilbertElliott
from testbed.links.linklog import LinkLog
from testbed.links.memo import ByIdentity
from testbed.links.opportunities import (
    DelaySteps,
    Opportunities,
    RateOpportunities,
    TraceOpportunities,
)

__all__ = ["PACKET_BYTES", "DelaySteps", "DirectionCounters", "DirectionSpec", "LinkQueue",
           "Opportunities", "RateOpportunities", "TraceOpportunities", "cross_queues", "direction_spec"]

PACKET_BYTES = 1500
"""Bytes one delivery opportunity carries (mm-link's fixed packet size)."""
USERSPACE_QUEUES = ("droptail", "drophead", "codel")
"""The queue kinds this model (and so the userspace backend) runs."""
MAX_SOJOURN_SAMPLES = 1 << 21
"""Queueing-delay samples kept per direction per window (16 MiB); later ones are counted."""


@dataclass
class DirectionCounters:
    packets: int = 0
    bytes: int = 0
    drops: int = 0


class LinkQueue:
    """One direction of one access link: queue, opportunities, delay, loss (module rules)."""

    def __init__(
        self,
        opportunities: Opportunities | None,
        *,
        delay_ms: float = 0.0,
        loss_pct: float = 0.0,
        queue_packets: int | None = None,
        queue_bytes: int | None = None,
        rng: random.Random | None = None,
        origin_ms: float = 0.0,
        gilbert: GilbertElliott | None = None,
        codel: Codel | None = None,
        delays: DelaySteps | None = None,
        drop_head: bool = False,
        delay_first: bool = False,
    ) -> None:
        self.opportunities = opportunities
        self.drop_head = drop_head
        self.delay_first = delay_first
        self._pre_line: deque[tuple[float, int, Any]] = deque()  # delay_first: to the queue
        self.delay_ms = delay_ms
        self.loss_fraction = loss_pct / 100.0
        self.queue_packets = queue_packets
        self.queue_bytes = queue_bytes
        self.rng = rng or random.Random(0)
        self.origin_ms = origin_ms
        self.gilbert = gilbert
        self.codel = codel if opportunities is not None else None
        self.delays = delays
        self.log: LinkLog | None = None
        # queue items: [arrival_ms, size, item, bytes_left]
        self._queue: deque[list[Any]] = deque()
        self._queued_bytes = 0
        self._next_k = 0  # next unused opportunity; meaningful while the queue is non-empty
        self._visited_k = 0  # opportunities before this one have been visited (used up)
        self._delay_line: deque[tuple[float, int, Any]] = deque()
        self._last_exit_ms = -math.inf
        self.counters = DirectionCounters()
        self.clear_window(origin_ms)

    # -- inputs

    def restart(self, origin_ms: float) -> None:
        """Restart the trace clock: replay time 0 (= the offset in the trace) is origin_ms;
        the statistics window starts again there."""
        self.origin_ms = origin_ms
        self._visited_k = 0
        if self._queue:
            self._next_k = self._first_k(max(origin_ms, self._queue[0][0]))
        self.clear_window(origin_ms)

    def clear_window(self, now_ms: float) -> None:
        """Start a new statistics window at NOW_MS."""
        self.window_start_ms = now_ms
        self.window_bytes = 0
        self.window_released = 0
        self.sojourns_ms = array("d")

    def offer(self, item: Any, size: int, t_ms: float) -> bool:
        """A packet of SIZE bytes arrives at T_MS; False if the queue refused it (with
        ``delay_first`` it reaches the queue later: True)."""
        if self.delay_first:
            self._pre_line.append((self._delayed(t_ms), size, item))
            return True
        return self._arrive(item, size, t_ms)

    def _delayed(self, t_ms: float) -> float:
        """When a packet released (or, delay first, offered) at T_MS has crossed the
        delay; never before the one before it."""
        if self.delays is None:
            return t_ms + self.delay_ms
        exit_ms = max(t_ms + self.delays.at(t_ms - self.origin_ms), self._last_exit_ms)
        self._last_exit_ms = exit_ms
        return exit_ms

    def _arrive(self, item: Any, size: int, t_ms: float) -> bool:
        """The packet joins the queue at T_MS (module rules); False if refused."""
        log = self.log
        if log is not None:
            log.arrival(t_ms, size)
        if self.opportunities is None:
            if log is not None:
                log.departure(t_ms, size, t_ms)
            self.window_bytes += size
            self.window_released += 1
            self._release(item, size, t_ms)
            return True
        if not self.drop_head and self._over(1, size):
            self.counters.drops += 1
            if log is not None:
                log.drop(t_ms, size)
            return False
        if not self._queue:  # an opportunity visited already is gone, even at time t_ms
            self._next_k = max(self._first_k(t_ms), self._visited_k)
        self._queue.append([t_ms, size, item, size])
        self._queued_bytes += size
        if self.drop_head:
            return self._drop_from_head(t_ms, item)
        return True

    def _over(self, packets: int, size: int) -> bool:
        """Whether PACKETS more packets of SIZE bytes in all would break a bound."""
        return (self.queue_packets is not None
                and len(self._queue) + packets > self.queue_packets) or (
            self.queue_bytes is not None and self._queued_bytes + size > self.queue_bytes)

    def _drop_from_head(self, t_ms: float, item: Any) -> bool:
        """Drop-head: evict the oldest packets not yet started while a bound is broken;
        False if the arriving packet (ITEM) was among them."""
        kept = True
        while self._over(0, 0):
            index = 0 if self._queue[0][3] == self._queue[0][1] else 1
            victim = self._queue[index]
            del self._queue[index]
            self._queued_bytes -= victim[1]
            self.counters.drops += 1
            if self.log is not None:
                self.log.drop(t_ms, victim[1])
            kept = kept and victim[2] is not item
        return kept

    # -- time

    def next_event_ms(self) -> float | None:
        """When something next happens (an opportunity with work, or an exit), or None."""
        nxt: float | None = self._delay_line[0][0] if self._delay_line else None
        if self._pre_line:
            nxt = self._pre_line[0][0] if nxt is None else min(nxt, self._pre_line[0][0])
        if self._queue and self.opportunities is not None:
            t = self._time(self._next_k)
            nxt = t if nxt is None else min(nxt, t)
        return nxt

    def advance(self, now_ms: float) -> list[tuple[float, Any]]:
        """Use every opportunity up to NOW_MS; return (exit_ms, item) of packets that left."""
        pre = self._pre_line
        while pre and pre[0][0] <= now_ms:  # delay first: into the queue at their time
            due, size, item = pre.popleft()
            if self.opportunities is not None:
                self._drain(due)
            self._arrive(item, size, due)
        if self.opportunities is not None:
            self._drain(now_ms)
        out: list[tuple[float, Any]] = []
        line = self._delay_line
        while line and line[0][0] <= now_ms:
            exit_ms, size, item = line.popleft()
            self.counters.packets += 1
            self.counters.bytes += size
            out.append((exit_ms, item))
        return out

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing in flight (no event can come from this direction)."""
        return not self._queue and not self._delay_line and not self._pre_line

    @property
    def queued_packets(self) -> int:
        return len(self._queue)

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    def capacity_bytes(self, now_ms: float) -> int | None:
        """Bytes the opportunities of the window (its start to NOW_MS) could carry."""
        if self.opportunities is None:
            return None
        first = self._first_k(self.window_start_ms)
        last = self._first_k(now_ms)
        return max(0, last - first) * PACKET_BYTES

    # -- internals

    def _time(self, k: int) -> float:
        assert self.opportunities is not None
        return self.origin_ms + self.opportunities.time_of(k)

    def _first_k(self, t_ms: float) -> int:
        assert self.opportunities is not None
        return self.opportunities.first_at_or_after(t_ms - self.origin_ms)

    def _drain(self, now_ms: float) -> None:
        queue = self._queue
        codel = self.codel
        log = self.log
        while queue:
            t_opp = self._time(self._next_k)
            if t_opp > now_ms:
                return
            if queue[0][0] > t_opp:  # head arrived after this opportunity: skip ahead
                self._next_k = self._first_k(queue[0][0])
                continue
            if log is not None:
                log.opportunity(t_opp)
            budget = PACKET_BYTES
            while budget > 0 and queue and queue[0][0] <= t_opp:
                head = queue[0]
                if codel is not None and head[3] == head[1] and self._codel_drops(t_opp):
                    continue  # CoDel dropped the head; look at the next one
                used = min(budget, head[3])
                head[3] -= used
                budget -= used
                if head[3] == 0:
                    queue.popleft()
                    self._queued_bytes -= head[1]
                    self.window_bytes += head[1]
                    self.window_released += 1
                    sojourn = t_opp - head[0]
                    if len(self.sojourns_ms) < MAX_SOJOURN_SAMPLES:
                        self.sojourns_ms.append(sojourn)
                    if log is not None:
                        log.departure(t_opp, head[1], head[0])
                    self._release(head[2], head[1], t_opp)
            self._next_k += 1
            self._visited_k = self._next_k

    def _drop_head(self, now_ms: float) -> None:
        head = self._queue.popleft()
        self._queued_bytes -= head[1]
        self.counters.drops += 1
        if self.log is not None:
            self.log.drop(now_ms, head[1])

    def _codel_ok(self, now_ms: float) -> bool:
        assert self.codel is not None
        if not self._queue or self._queue[0][0] > now_ms:
            self.codel.queue_empty()
            return False
        head = self._queue[0]
        return self.codel.ok_to_drop(now_ms - head[0], now_ms, self._queued_bytes - head[1])

    def _codel_drops(self, now_ms: float) -> bool:
        """RFC 8289 ``dequeue`` at NOW_MS: drop heads as CoDel says; True if any went."""
        codel = self.codel
        assert codel is not None
        ok = self._codel_ok(now_ms)
        dropped = False
        if codel.dropping:
            if not ok:
                codel.dropping = False
            while codel.dropping and now_ms >= codel.drop_next_ms:
                self._drop_head(now_ms)
                dropped = True
                codel.count += 1
                if not self._codel_ok(now_ms):
                    codel.dropping = False
                else:
                    codel.drop_next_ms = codel.control_law(codel.drop_next_ms)
        elif ok:
            self._drop_head(now_ms)
            dropped = True
            self._codel_ok(now_ms)  # RFC: dodequeue of the next packet
            codel.enter_dropping(now_ms)
        if dropped:
            codel.drops += 1
        return dropped

    def _release(self, item: Any, size: int, t_ms: float) -> None:
        if (self.loss_fraction > 0.0 and self.rng.random() < self.loss_fraction) or (
                self.gilbert is not None and self.gilbert.lose()):
            self.counters.drops += 1
            if self.log is not None:
                self.log.lost(t_ms, size)
            return
        self._delay_line.append((t_ms if self.delay_first else self._delayed(t_ms), size, item))


@dataclass(frozen=True)
class DirectionSpec:
    """Everything the emulator needs for one direction of one host's link (plain data)."""

    delay_ms: float = 0.0
    loss_pct: float = 0.0
    queue_packets: int | None = None
    queue_bytes: int | None = None
    rate_kbit: float | None = None
    trace_name: str | None = None
    stamps_ms: tuple[int, ...] | None = field(default=None, repr=False)
    period_ms: int | None = None
    offset_ms: float = 0.0
    gilbert: tuple[float, float, float, float] | None = None  # p, r, good %, bad %
    queue_kind: str = "droptail"  # droptail | drophead | codel (the others: netem only)
    codel_target_ms: float = 5.0
    codel_interval_ms: float = 100.0
    delay_trace_name: str | None = None
    delay_steps: tuple[tuple[float, float], ...] | None = field(default=None, repr=False)
    delay_first: bool = False  # the delay before the queue (order)

    def opportunities(self) -> Opportunities | None:
        if self.stamps_ms is not None and self.period_ms is not None:
            return TraceOpportunities(self.stamps_ms, self.period_ms, self.offset_ms)
        if self.rate_kbit is not None:
            return RateOpportunities(self.rate_kbit)
        return None

    def make_queue(self, rng: random.Random, origin_ms: float = 0.0,
                   opportunities: Opportunities | None = None) -> LinkQueue:
        """A LinkQueue of this spec (OPPORTUNITIES: a shared, already built schedule)."""
        gilbert = None if self.gilbert is None else GilbertElliott(*self.gilbert, rng=rng)
        codel = (Codel(self.codel_target_ms, self.codel_interval_ms)
                 if self.queue_kind == "codel" else None)
        delays = (None if self.delay_steps is None
                  else DelaySteps(self.delay_steps, self.offset_ms))
        return LinkQueue(
            opportunities if opportunities is not None else self.opportunities(),
            delay_ms=self.delay_ms,
            loss_pct=self.loss_pct,
            queue_packets=self.queue_packets,
            queue_bytes=self.queue_bytes,
            rng=rng,
            origin_ms=origin_ms,
            gilbert=gilbert,
            codel=codel,
            delays=delays,
            drop_head=self.queue_kind == "drophead",
            delay_first=self.delay_first,
        )


#: A trace's stamps as Python ints, once per (read-only, cached) trace array.
_stamp_tuple: ByIdentity[Any, tuple[int, ...]] = ByIdentity(
    lambda stamps: tuple(int(s) for s in stamps.tolist()))


def direction_spec(link: Any, direction: str, *, offset_ms: float = 0.0) -> DirectionSpec:
    """DirectionSpec of one direction ("up"/"down") of a linkspec.LinkSpec.

    OFFSET_MS is the cell's trace offset; the link's own ``trace_offset_s`` is added.
    """
    if direction not in ("up", "down"):
        raise ValueError(f"direction: 'up' or 'down', got {direction!r}")
    from testbed.links.traces import load_delay_trace, load_trace_ref

    side = link.side(direction)
    if side.queue.kind not in USERSPACE_QUEUES:
        raise ValueError(f"queue kind {side.queue.kind!r}: the link model has "
                         f"{', '.join(USERSPACE_QUEUES)} (userspace_support refuses others)")
    stamps: tuple[int, ...] | None = None
    period: int | None = None
    if side.trace is not None:
        trace = load_trace_ref(side.trace, "up" if direction == "up" else "down")
        stamps = _stamp_tuple(trace.stamps_ms)
        period = int(trace.period_ms)
    steps = None
    if side.delay_trace is not None:
        steps = load_delay_trace(side.delay_trace).steps
    g = side.gilbert
    queue = side.queue
    return DirectionSpec(
        delay_ms=float(side.delay_ms),
        loss_pct=float(side.loss_pct),
        queue_packets=queue.packets,
        queue_bytes=queue.bytes,
        rate_kbit=side.rate_kbit,
        trace_name=side.trace,
        stamps_ms=stamps,
        period_ms=period,
        offset_ms=offset_ms + float(side.trace_offset_s) * 1000.0,
        gilbert=None if g is None else (g.p, g.r, g.loss_good_pct, g.loss_bad_pct),
        queue_kind=queue.kind,
        codel_target_ms=float(queue.target_ms),
        codel_interval_ms=float(queue.interval_ms),
        delay_trace_name=side.delay_trace,
        delay_steps=steps,
        delay_first=side.delay_first,
    )


def cross_queues(queues: Sequence[LinkQueue], sizes: Sequence[int], t_ms: float) -> float:
    """Offline replay: packets of SIZES offered at T_MS cross QUEUES in series; the time
    the last one leaves the last queue (a prediction benchmarks compare against)."""
    items = [(t_ms, i) for i in range(len(sizes))]
    for q in queues:
        for t, i in items:
            q.offer(i, sizes[i], t)
        out: list[tuple[float, Any]] = []
        while len(out) < len(items):
            nxt = q.next_event_ms()
            if nxt is None:
                break  # a packet was dropped: the model cannot say more
            out.extend(q.advance(nxt))
        items = list(out)
    return max(t for t, _ in items) if items else t_ms
