"""The link model (Mahimahi's mm-link + mm-delay), pure: no kernel, time is an input.

The userspace backend's emulator process runs it on real packets; ``testbed bench
link`` replays it offline as the prediction a measurement is compared with.

Rules of the model (one `LinkQueue` per host per direction):

- A packet offered at time t joins a FIFO drop-tail queue. It is dropped on arrival if the
  queue would then hold more than `queue_packets` packets or `queue_bytes` bytes (the
  packet partly sent at an opportunity still counts as queued).
- The queue drains only at delivery opportunities. Each opportunity carries up to 1500
  bytes of queued data: several small packets, or a slice of a large one (a packet leaves
  when its last byte has been carried). Bytes an opportunity cannot use are lost, as in
  mm-link. An opportunity at time T serves only packets that arrived at or before T.
- Opportunities come from a capacity trace (stamps in ms, wrapping with the last stamp as
  period, replay starting at `offset_ms`), or every 1500*8/rate_kbit ms for a fixed rate,
  or the link is unlimited (a packet is released the moment it arrives).
- A released packet is lost with probability `loss_pct` (seeded RNG), otherwise it leaves
  the link `delay_ms` after its release (constant delay keeps FIFO order).
- Times are model milliseconds (the emulator feeds `time.monotonic()` * 1000). Exit times
  are *ideal* times (release time + delay), not the time the caller happened to look, so
  wake-up lateness of one stage never accumulates into the next.
- On a zero-capacity stretch of a trace (the AT&T uplink has stretches of many seconds)
  packets wait in the queue until the next opportunity, or are dropped once it is full.

`EmulatorCore` joins the per-host links: a packet read from host A's TUN device crosses
A's uplink, then the downlink of the host that owns its IPv4 destination address.

Faults (the fault suite's emulator ops, :meth:`EmulatorCore.add_fault`), each for a
stretch of time and for the packets from or to one host, chosen with a seeded RNG:
``partition`` drops every packet; ``corrupt`` flips one byte of a TCP payload and fixes
the TCP checksum, so TCP delivers the altered bytes and only the channel's AEAD can
catch them; ``duplicate`` offers a packet twice; ``reorder`` holds a packet back
``REORDER_HOLD_MS`` so the ones after it overtake it.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

PACKET_BYTES = 1500
"""Bytes one delivery opportunity carries (mm-link's fixed packet size)."""
FAULT_KINDS = ("partition", "corrupt", "duplicate", "reorder")
REORDER_HOLD_MS = 20.0


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


@dataclass
class DirectionCounters:
    packets: int = 0
    bytes: int = 0
    drops: int = 0


class LinkQueue:
    """One direction of one access link: drop-tail queue, opportunities, delay, loss."""

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
    ) -> None:
        self.opportunities = opportunities
        self.delay_ms = delay_ms
        self.loss_fraction = loss_pct / 100.0
        self.queue_packets = queue_packets
        self.queue_bytes = queue_bytes
        self.rng = rng or random.Random(0)
        self.origin_ms = origin_ms
        # queue items: [arrival_ms, size, item, bytes_left]
        self._queue: deque[list[Any]] = deque()
        self._queued_bytes = 0
        self._next_k = 0  # next unused opportunity; meaningful while the queue is non-empty
        self._delay_line: deque[tuple[float, int, Any]] = deque()
        self.counters = DirectionCounters()

    # -- inputs

    def restart(self, origin_ms: float) -> None:
        """Restart the trace clock: replay time 0 (= the offset in the trace) is origin_ms."""
        self.origin_ms = origin_ms
        if self._queue:
            self._next_k = self._first_k(max(origin_ms, self._queue[0][0]))

    def offer(self, item: Any, size: int, t_ms: float) -> bool:
        """A packet of SIZE bytes arrives at T_MS; False if the drop-tail queue refused it."""
        if self.opportunities is None:
            self._release(item, size, t_ms)
            return True
        if (self.queue_packets is not None and len(self._queue) + 1 > self.queue_packets) or (
            self.queue_bytes is not None and self._queued_bytes + size > self.queue_bytes
        ):
            self.counters.drops += 1
            return False
        if not self._queue:
            self._next_k = self._first_k(t_ms)
        self._queue.append([t_ms, size, item, size])
        self._queued_bytes += size
        return True

    # -- time

    def next_event_ms(self) -> float | None:
        """When something next happens (an opportunity with work, or an exit), or None."""
        nxt: float | None = self._delay_line[0][0] if self._delay_line else None
        if self._queue and self.opportunities is not None:
            t = self._time(self._next_k)
            nxt = t if nxt is None else min(nxt, t)
        return nxt

    def advance(self, now_ms: float) -> list[tuple[float, Any]]:
        """Use every opportunity up to NOW_MS; return (exit_ms, item) of packets that left."""
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
        return not self._queue and not self._delay_line

    @property
    def queued_packets(self) -> int:
        return len(self._queue)

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    # -- internals

    def _time(self, k: int) -> float:
        assert self.opportunities is not None
        return self.origin_ms + self.opportunities.time_of(k)

    def _first_k(self, t_ms: float) -> int:
        assert self.opportunities is not None
        return self.opportunities.first_at_or_after(t_ms - self.origin_ms)

    def _drain(self, now_ms: float) -> None:
        queue = self._queue
        while queue:
            t_opp = self._time(self._next_k)
            if t_opp > now_ms:
                return
            if queue[0][0] > t_opp:  # head arrived after this opportunity: skip ahead
                self._next_k = self._first_k(queue[0][0])
                continue
            budget = PACKET_BYTES
            while budget > 0 and queue and queue[0][0] <= t_opp:
                head = queue[0]
                used = min(budget, head[3])
                head[3] -= used
                budget -= used
                if head[3] == 0:
                    queue.popleft()
                    self._queued_bytes -= head[1]
                    self._release(head[2], head[1], t_opp)
            self._next_k += 1

    def _release(self, item: Any, size: int, t_ms: float) -> None:
        if self.loss_fraction > 0.0 and self.rng.random() < self.loss_fraction:
            self.counters.drops += 1
            return
        self._delay_line.append((t_ms + self.delay_ms, size, item))


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

    def opportunities(self) -> Opportunities | None:
        if self.stamps_ms is not None and self.period_ms is not None:
            return TraceOpportunities(self.stamps_ms, self.period_ms, self.offset_ms)
        if self.rate_kbit is not None:
            return RateOpportunities(self.rate_kbit)
        return None

    def make_queue(self, rng: random.Random, origin_ms: float = 0.0) -> LinkQueue:
        return LinkQueue(
            self.opportunities(),
            delay_ms=self.delay_ms,
            loss_pct=self.loss_pct,
            queue_packets=self.queue_packets,
            queue_bytes=self.queue_bytes,
            rng=rng,
            origin_ms=origin_ms,
        )


def direction_spec(link: Any, direction: str, *, offset_ms: float = 0.0) -> DirectionSpec:
    """DirectionSpec of one direction ("up"/"down") of a profiles.LinkSpec."""
    if direction not in ("up", "down"):
        raise ValueError(f"direction: 'up' or 'down', got {direction!r}")
    trace_name = link.up_trace if direction == "up" else link.down_trace
    stamps: tuple[int, ...] | None = None
    period: int | None = None
    if trace_name is not None:
        from testbed.links.traces import load_named

        trace = load_named(trace_name)
        stamps = tuple(int(s) for s in trace.stamps_ms.tolist())
        period = int(trace.period_ms)
    return DirectionSpec(
        delay_ms=float(link.delay_ms),
        loss_pct=float(link.loss_pct),
        queue_packets=link.queue_packets,
        queue_bytes=link.queue_bytes,
        rate_kbit=None if trace_name is not None else link.rate_kbit,
        trace_name=trace_name,
        stamps_ms=stamps,
        period_ms=period,
        offset_ms=offset_ms,
    )


@dataclass
class HostLinks:
    name: str
    address: bytes  # 4-byte IPv4
    up: LinkQueue
    down: LinkQueue


@dataclass
class Fault:
    kind: str
    host: int
    until_ms: float
    rate: float  # fraction of the host's packets affected


def tcp_checksum(packet: bytes | bytearray) -> int:
    """The TCP checksum an IPv4 packet should carry (its checksum field taken as 0)."""
    ihl = (packet[0] & 0x0F) * 4
    segment = bytearray(packet[ihl:])
    segment[16:18] = b"\0\0"
    pseudo = bytes(packet[12:20]) + bytes([0, 6]) + len(segment).to_bytes(2, "big")
    data = pseudo + segment + (b"\0" if len(segment) % 2 else b"")
    total = sum(int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def corrupt_tcp_payload(packet: bytes, rng: random.Random) -> bytes | None:
    """One payload byte flipped, checksum fixed; None if not TCP with a payload."""
    if len(packet) < 40 or packet[9] != 6:
        return None
    ihl = (packet[0] & 0x0F) * 4
    offset = ihl + (packet[ihl + 12] >> 4) * 4
    if offset >= len(packet):
        return None
    out = bytearray(packet)
    out[rng.randrange(offset, len(out))] ^= 1 << rng.randrange(8)
    out[ihl + 16:ihl + 18] = tcp_checksum(out).to_bytes(2, "big")
    return bytes(out)


class EmulatorCore:
    """Routes packets between hosts: sender's uplink, then the receiver's downlink."""

    def __init__(self, hosts: Sequence[HostLinks], *, seed: int = 0) -> None:
        self.hosts = list(hosts)
        self._by_address = {h.address: i for i, h in enumerate(self.hosts)}
        self.unroutable = 0
        self.faults: list[Fault] = []
        self.faulted: dict[str, int] = dict.fromkeys(FAULT_KINDS, 0)
        self._held: list[tuple[float, int, int, bytes]] = []  # (release ms, n, src, packet)
        self._held_n = 0
        self._rng = random.Random(seed)

    def add_fault(self, kind: str, host: int, *, now_ms: float, seconds: float,
                  rate: float = 1.0) -> None:
        """Apply fault KIND to packets from or to HOST for SECONDS from NOW_MS."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault kind: {kind!r} not one of {', '.join(FAULT_KINDS)}")
        if not 0 <= host < len(self.hosts) or not seconds > 0 or not 0 < rate <= 1:
            raise ValueError("fault: host index in range, seconds > 0, 0 < rate <= 1")
        self.faults.append(Fault(kind, host, now_ms + seconds * 1000.0, rate))

    def _fault(self, kind: str, src: int, dst: int, now_ms: float) -> bool:
        if not self.faults:
            return False
        self.faults = [f for f in self.faults if f.until_ms > now_ms]
        for f in self.faults:
            if f.kind == kind and f.host in (src, dst) and self._rng.random() < f.rate:
                self.faulted[kind] += 1
                return True
        return False

    def receive(self, src: int, packet: bytes, now_ms: float) -> None:
        """A raw IP packet read from host SRC's TUN device at NOW_MS."""
        if len(packet) < 20 or packet[0] >> 4 != 4:
            self.unroutable += 1  # not IPv4 (e.g. IPv6 router solicitations): never forwarded
            return
        dst = self._by_address.get(packet[16:20])
        if dst is None or dst == src:
            self.unroutable += 1
            return
        if self.faults:
            if self._fault("partition", src, dst, now_ms):
                return
            if self._fault("corrupt", src, dst, now_ms):
                packet = corrupt_tcp_payload(packet, self._rng) or packet
            if self._fault("reorder", src, dst, now_ms):
                self._held_n += 1
                heapq.heappush(self._held, (now_ms + REORDER_HOLD_MS, self._held_n, src,
                                            packet))
                return
            if self._fault("duplicate", src, dst, now_ms):
                self.hosts[src].up.offer((dst, packet), len(packet), now_ms)
        self.hosts[src].up.offer((dst, packet), len(packet), now_ms)

    def advance(self, now_ms: float) -> list[tuple[float, int, bytes]]:
        """Move time to NOW_MS; returns (ideal exit ms, destination host, packet) to write."""
        hosts = self.hosts
        while self._held and self._held[0][0] <= now_ms:
            _, _, src, packet = heapq.heappop(self._held)
            dst = self._by_address[packet[16:20]]
            hosts[src].up.offer((dst, packet), len(packet), now_ms)
        for h in hosts:
            if not h.up.idle:
                for exit_ms, (dst, packet) in h.up.advance(now_ms):
                    hosts[dst].down.offer((dst, packet), len(packet), exit_ms)
        out: list[tuple[float, int, bytes]] = []
        for h in hosts:
            if not h.down.idle:
                out.extend((t, dst, pkt) for t, (dst, pkt) in h.down.advance(now_ms))
        return out

    def next_event_ms(self) -> float | None:
        times = [
            t
            for h in self.hosts
            for t in (h.up.next_event_ms(), h.down.next_event_ms())
            if t is not None
        ]
        if self._held:
            times.append(self._held[0][0])
        return min(times) if times else None

    def restart(self, now_ms: float) -> None:
        for h in self.hosts:
            h.up.restart(now_ms)
            h.down.restart(now_ms)

    def counters(self) -> dict[str, dict[str, int]]:
        return {
            h.name: {
                "up_packets": h.up.counters.packets,
                "up_bytes": h.up.counters.bytes,
                "up_drops": h.up.counters.drops,
                "down_packets": h.down.counters.packets,
                "down_bytes": h.down.counters.bytes,
                "down_drops": h.down.counters.drops,
            }
            for h in self.hosts
        }
