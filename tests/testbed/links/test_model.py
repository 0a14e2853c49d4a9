"""The userspace link model, pure: no kernel, explicit times."""

from __future__ import annotations

import random
import socket
import struct

import pytest

from testbed.links.core import EmulatorCore, HostLinks
from testbed.links.model import (
    PACKET_BYTES,
    DirectionSpec,
    LinkQueue,
    RateOpportunities,
    TraceOpportunities,
)
from testbed.links.traces import load_named


def drain(q: LinkQueue, until_ms: float = 1e9) -> list[tuple[float, object]]:
    """Step through every event up to UNTIL_MS, as the emulator loop would."""
    out: list[tuple[float, object]] = []
    while (nxt := q.next_event_ms()) is not None and nxt <= until_ms:
        out.extend(q.advance(nxt))
    return out


def test_unlimited_link_only_delays() -> None:
    q = LinkQueue(None, delay_ms=20.0)
    q.offer("p", 100, 5.0)
    assert q.advance(24.9) == []
    assert q.advance(25.0) == [(25.0, "p")]
    assert (q.counters.packets, q.counters.bytes, q.counters.drops) == (1, 100, 0)


def test_exit_times_are_ideal_even_when_advanced_late() -> None:
    q = LinkQueue(RateOpportunities(12_000.0), delay_ms=20.0)  # one opportunity per ms
    q.offer("p", 1500, 0.5)
    assert q.advance(100.0) == [(21.0, "p")]  # released at 1 ms, not at 100 ms


def test_rate_schedule_one_full_packet_per_opportunity() -> None:
    interval = PACKET_BYTES * 8 / 2000.0  # 2 Mbit/s: 6 ms
    q = LinkQueue(RateOpportunities(2000.0))
    for i in range(3):
        q.offer(i, 1500, 0.0)
    assert [t for t, _ in drain(q)] == pytest.approx([0.0, interval, 2 * interval])


def test_small_packets_share_an_opportunity_and_large_ones_span_two() -> None:
    q = LinkQueue(TraceOpportunities([10, 20, 30], 30))
    for name in ("a", "b", "c"):
        q.offer(name, 500, 0.0)
    q.offer("big", 2000, 0.0)  # 0 bytes left at 10 ms; 1500 at 20; last 500 at 30
    assert drain(q) == [(10.0, "a"), (10.0, "b"), (10.0, "c"), (30.0, "big")]


def test_opportunity_serves_only_packets_already_arrived() -> None:
    q = LinkQueue(TraceOpportunities([10, 20], 20))
    q.offer("late", 100, 10.5)
    assert drain(q) == [(20.0, "late")]


def test_unused_opportunities_are_lost() -> None:
    q = LinkQueue(TraceOpportunities([1, 2, 3, 1000], 1000))
    q.offer("p", 100, 3.5)  # the three early opportunities passed unused
    assert drain(q) == [(1000.0, "p")]


def test_zero_capacity_stretch_holds_packets_until_next_opportunity() -> None:
    q = LinkQueue(TraceOpportunities([5, 5000], 5000), queue_packets=10)
    for i in range(3):
        q.offer(i, 1500, 6.0)
    assert q.advance(4999.0) == []
    assert q.queued_packets == 3
    assert drain(q) == [(5000.0, 0), (5005.0, 1), (10000.0, 2)]


def test_drop_tail_by_packets_and_bytes() -> None:
    q = LinkQueue(RateOpportunities(1000.0), queue_packets=2)
    assert [q.offer(i, 100, 0.5) for i in range(4)] == [True, True, False, False]
    assert q.counters.drops == 2
    qb = LinkQueue(RateOpportunities(1000.0), queue_bytes=3000)
    assert [qb.offer(i, 1400, 0.5) for i in range(3)] == [True, True, False]
    assert qb.queued_bytes == 2800
    assert [i for _, i in drain(qb)] == [0, 1]  # FIFO, the dropped one never appears


def test_trace_wraps_around_with_last_stamp_as_period() -> None:
    s = TraceOpportunities([5, 10], 10)
    assert [s.time_of(k) for k in range(6)] == [5, 10, 15, 20, 25, 30]
    assert s.first_at_or_after(11.0) == 2
    assert s.first_at_or_after(20.0) == 3


def test_offset_starts_replay_inside_the_trace() -> None:
    s = TraceOpportunities([5, 10], 10, offset_ms=7.0)
    k = s.first_at_or_after(0.0)
    assert [s.time_of(k + i) for i in range(3)] == [3.0, 8.0, 13.0]


@pytest.mark.parametrize(
    ("name", "offset_ms"),
    [("ATT-LTE-driving.up", 0.0), ("TMobile-LTE-short.down", 12_345.0),
     ("Verizon-LTE-short.up", 139_000.0)],
)
def test_schedule_agrees_with_the_trace_loader(name: str, offset_ms: float) -> None:
    trace = load_named(name)
    expected = trace.opportunities(0.0, trace.period_ms + 5000.0, offset_ms)
    s = TraceOpportunities(trace.stamps_ms.tolist(), trace.period_ms, offset_ms)
    k = s.first_at_or_after(0.0)
    got = [s.time_of(k + i) for i in range(len(expected))]
    assert got == pytest.approx(expected.tolist())


def test_restart_moves_the_trace_clock() -> None:
    q = LinkQueue(TraceOpportunities([10, 20], 20))
    q.restart(1000.0)
    q.offer("p", 100, 1000.0)
    assert drain(q) == [(1010.0, "p")]


def test_loss_is_seeded_and_counted() -> None:
    def run(seed: int) -> list[object]:
        q = LinkQueue(None, loss_pct=30.0, rng=random.Random(seed))
        for i in range(1000):
            q.offer(i, 100, float(i))
        return [item for _, item in q.advance(1e9)]

    first, again = run(7), run(7)
    assert first == again
    assert 600 < len(first) < 800


def _ipv4(src: str, dst: str, payload: bytes = b"x" * 20) -> bytes:
    header = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0, 64, 17, 0,
        socket.inet_aton(src), socket.inet_aton(dst),
    )
    return header + payload


def test_core_routes_up_then_down_and_counts() -> None:
    spec = DirectionSpec(delay_ms=20.0)
    rng = random.Random(0)
    hosts = [
        HostLinks(n, socket.inet_aton(a), spec.make_queue(rng), spec.make_queue(rng))
        for n, a in (("a", "198.18.0.1"), ("b", "198.18.0.2"))
    ]
    core = EmulatorCore(hosts)
    packet = _ipv4("198.18.0.1", "198.18.0.2")
    core.receive(0, packet, 0.0)
    core.receive(0, _ipv4("198.18.0.1", "198.18.0.9"), 0.0)  # nobody owns it
    core.receive(0, b"\x60" + bytes(39), 0.0)  # IPv6: ignored
    assert core.advance(39.9) == []
    assert core.next_event_ms() == pytest.approx(40.0)
    assert core.advance(40.0) == [(40.0, 1, packet)]
    counters = core.counters()
    assert counters["a"]["up_bytes"] == counters["b"]["down_bytes"] == len(packet)
    assert counters["b"]["up_packets"] == counters["a"]["down_packets"] == 0
    assert core.unroutable == 2
