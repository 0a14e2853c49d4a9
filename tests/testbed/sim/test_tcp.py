"""The TCP model over a fixed 20 ms link (80 ms round trip): handshake rounds, reuse,
segmentation, and a loss repaired by the retransmission timer."""

from __future__ import annotations

from typing import Any

from testbed.links.netdef import parse_network
from testbed.sim.kernel import NS_PER_MS, Future, Loop
from testbed.sim.network import SimNetwork
from testbed.sim.tcp import CLIENT, HEADER_BYTES, MSS_BYTES, SERVER, Connection, TcpLayer


def _layer(table: dict[str, Any]) -> tuple[Loop, TcpLayer]:
    loop = Loop()
    profile = parse_network("t", table)
    tcp = TcpLayer(loop, lambda deliver: SimNetwork(loop, profile, ("c", "s"),
                                                    trace_offset_s=0.0, seed=3,
                                                    deliver=deliver))

    def accept(conn: Connection) -> None:  # an echo server: answers every message at once
        conn.on_message(SERVER, lambda m: None if m[0] == "closed" else
                        conn.send(SERVER, m[1], ("answer", m[1])))

    tcp.on_accept = accept
    tcp.network.restart_trace()
    return loop, tcp


async def _exchange(loop: Loop, conn: Connection, size: int) -> float:
    started = loop.now_ns
    answered: Future[Any] = Future()
    conn.on_message(CLIENT, lambda m: None if answered.done else answered.set_result(m))
    conn.send(CLIENT, size, ("ask", size))
    await answered
    return (loop.now_ns - started) / NS_PER_MS


FIXED = {"delay_ms": 20, "queue": {"kind": "droptail", "packets": 1000}}


def test_a_new_connection_costs_one_round_trip_before_its_first_exchange() -> None:
    loop, tcp = _layer(FIXED)

    async def fresh() -> tuple[float, float]:
        conn = tcp.connect("c", "s")
        await conn.established
        connected = loop.now_ns / NS_PER_MS
        took = await _exchange(loop, conn, 200)
        conn.close(CLIENT)
        return connected, took

    assert loop.run(fresh()) == (80.0, 80.0)


def test_a_reused_connection_answers_in_one_round_trip_and_closes_cleanly() -> None:
    loop, tcp = _layer(FIXED)

    async def two() -> list[float]:
        conn = tcp.connect("c", "s")
        await conn.established
        times = [await _exchange(loop, conn, 300), await _exchange(loop, conn, 300)]
        conn.close(CLIENT)
        return times

    assert loop.run(two()) == [80.0, 80.0]
    loop.run_until(loop.now_ns + 1000 * NS_PER_MS)
    assert tcp.open_connections == 0
    assert tcp.retransmits == 0


def test_a_large_frame_is_cut_into_mss_segments() -> None:
    loop, tcp = _layer(FIXED)
    size = 3 * MSS_BYTES + 10

    async def big() -> None:
        conn = tcp.connect("c", "s")
        await conn.established
        await _exchange(loop, conn, size)

    loop.run(big())
    loop.run_until(loop.now_ns + 1000 * NS_PER_MS)  # the last ACKs cross too
    up = tcp.network.counters()["c"]
    # SYN (60) + handshake ACK (52) + four segments + pure ACKs of the answer's segments
    assert up["up_bytes"] == 60 + 52 + (size + 4 * HEADER_BYTES) + 4 * HEADER_BYTES


def test_a_loss_is_repaired_by_the_retransmission_timer() -> None:
    # A 5-packet queue at 1.2 Mbit/s: 10 segments offered at once overflow it; TCP
    # sends them again after its timeout and the answer still arrives.
    loop, tcp = _layer({"rate_kbit": 1200, "delay_ms": 10,
                        "queue": {"kind": "droptail", "packets": 5}})
    size = 10 * MSS_BYTES

    async def flood() -> float:
        conn = tcp.connect("c", "s")
        await conn.established
        return await _exchange(loop, conn, size)

    took = loop.run(flood())
    assert tcp.retransmits > 0
    assert tcp.network.counters()["c"]["up_drops"] > 0
    assert took > 200.0  # at least one timeout (>= 200 ms) on top of the transfer
