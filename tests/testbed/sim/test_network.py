"""The simulated links against trace arithmetic: a fixed rate, an outage, an overflow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.links.netdef import parse_network
from testbed.sim.kernel import NS_PER_MS, Loop
from testbed.sim.network import Packet, SimNetwork


def _network(table: dict[str, Any], *, hosts: tuple[str, ...] = ("a", "b")
             ) -> tuple[Loop, SimNetwork, list[tuple[float, Packet]]]:
    loop = Loop()
    arrived: list[tuple[float, Packet]] = []
    profile = parse_network("t", table)
    net = SimNetwork(loop, profile, hosts, trace_offset_s=0.0, seed=1,
                     deliver=lambda p: arrived.append((loop.now_ns / NS_PER_MS, p)))
    net.restart_trace()
    return loop, net, arrived


def test_a_12_mbit_link_carries_one_full_packet_per_ms() -> None:
    # 1500 * 8 bit / 12000 kbit/s = 1 ms per opportunity on each direction; packet i
    # leaves A's uplink at i ms, reaches B's downlink 10 ms later (an opportunity then),
    # and arrives 10 ms after that.
    loop, net, arrived = _network({"rate_kbit": 12000, "delay_ms": 10,
                                   "queue": {"kind": "droptail", "packets": 100}})
    for i in range(5):
        net.send(Packet("a", "b", 1500, i))
    loop.run_until(100 * NS_PER_MS)
    assert [(t, p.payload) for t, p in arrived] == [(20.0 + i, i) for i in range(5)]
    assert net.counters()["a"]["up_bytes"] == 5 * 1500


def _trace(path: Path, stamps: list[int]) -> str:
    path.write_text("".join(f"{s}\n" for s in stamps))
    return str(path)


def test_a_packet_waits_out_an_outage_in_the_trace(tmp_path: Path) -> None:
    # uplink opportunities every ms to 100 ms, none until 5000 ms (period 6000 ms)
    up = _trace(tmp_path / "up", [*range(1, 101), 5000, 6000])
    down = _trace(tmp_path / "down", list(range(1, 6001)))
    loop, net, arrived = _network({"up_trace": up, "down_trace": down, "delay_ms": 20})
    loop.run_until(200 * NS_PER_MS)
    net.send(Packet("a", "b", 100, "late"))
    loop.run_until(10_000 * NS_PER_MS)
    # released at the 5000 ms opportunity, +20 ms, the downlink's opportunity at
    # 5020 ms, +20 ms
    assert [t for t, _ in arrived] == [5040.0]


def test_a_full_droptail_queue_drops_what_does_not_fit() -> None:
    loop, net, arrived = _network({"rate_kbit": 120, "delay_ms": 0,
                                   "queue": {"kind": "droptail", "packets": 5}})
    for i in range(8):
        net.send(Packet("a", "b", 1500, i))
    loop.run_until(2000 * NS_PER_MS)
    assert [p.payload for _, p in arrived] == [0, 1, 2, 3, 4]
    assert net.counters()["a"]["up_drops"] == 3


def test_an_unshaped_network_delivers_at_once() -> None:
    loop, net, arrived = _network({"unshaped": True})
    net.send(Packet("a", "b", 1500, "now"))
    loop.run_until(1)
    assert [(t, p.payload) for t, p in arrived] == [(0.0, "now")]
