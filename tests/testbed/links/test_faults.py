"""The emulator's fault ops in the pure link model (partition, corrupt, duplicate,
reorder), and that a corrupted TCP segment still carries a valid checksum (so only the
channel's AEAD can catch it)."""

from __future__ import annotations

import random
import socket
import struct

import pytest

from testbed.links.core import (
    REORDER_HOLD_MS,
    EmulatorCore,
    HostLinks,
    corrupt_tcp_payload,
    tcp_checksum,
)
from testbed.links.model import DirectionSpec

A, B = "198.18.0.1", "198.18.0.2"


def _core() -> EmulatorCore:
    spec = DirectionSpec(delay_ms=10.0)
    rng = random.Random(0)
    hosts = [HostLinks(n, socket.inet_aton(a), spec.make_queue(rng), spec.make_queue(rng))
             for n, a in (("a", A), ("b", B))]
    return EmulatorCore(hosts, seed=1)


def _tcp(payload: bytes, seq: int = 0) -> bytes:
    tcp = struct.pack("!HHIIBBHHH", 1234, 80, seq, 0, 5 << 4, 0x18, 65535, 0, 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, 6, 0,
                     socket.inet_aton(A), socket.inet_aton(B))
    packet = bytearray(ip + tcp)
    packet[36:38] = tcp_checksum(packet).to_bytes(2, "big")
    return bytes(packet)


def _delivered(core: EmulatorCore, until_ms: float) -> list[bytes]:
    return [p for _, _, p in core.advance(until_ms)]


def test_partition_drops_everything_for_its_seconds_then_heals() -> None:
    core = _core()
    core.add_fault("partition", 1, now_ms=0.0, seconds=1.0)
    core.receive(0, _tcp(b"lost"), 10.0)
    assert _delivered(core, 500.0) == []
    late = _tcp(b"after")
    core.receive(0, late, 1500.0)
    assert _delivered(core, 1600.0) == [late]
    assert core.faulted["partition"] == 1


def test_duplicate_and_reorder() -> None:
    core = _core()
    core.add_fault("duplicate", 0, now_ms=0.0, seconds=1.0)
    one = _tcp(b"one")
    core.receive(0, one, 0.0)
    assert _delivered(core, 100.0) == [one, one]
    core = _core()
    core.add_fault("reorder", 0, now_ms=0.0, seconds=0.001)  # only the first packet
    first, second = _tcp(b"first", 1), _tcp(b"second", 2)
    core.receive(0, first, 0.0)
    core.receive(0, second, 1.0)
    got = []
    for t in range(0, 200, 5):  # the emulator wakes at each next event
        got += _delivered(core, float(t))
    assert got == [second, first]
    assert REORDER_HOLD_MS > 1.0


def test_corruption_alters_the_payload_and_keeps_the_checksum_valid() -> None:
    packet = _tcp(b"x" * 100)
    out = corrupt_tcp_payload(packet, random.Random(3))
    assert out is not None
    assert out[:40] != packet[:40] or out[40:] != packet[40:]
    assert out[40:] != packet[40:]  # the payload changed ...
    assert int.from_bytes(out[36:38], "big") == tcp_checksum(out)  # ... TCP accepts it
    assert corrupt_tcp_payload(_tcp(b""), random.Random(3)) is None  # nothing to alter


def test_bad_fault_arguments_are_refused() -> None:
    core = _core()
    with pytest.raises(ValueError, match="fault kind"):
        core.add_fault("melt", 0, now_ms=0.0, seconds=1.0)
    with pytest.raises(ValueError, match="seconds > 0"):
        core.add_fault("partition", 5, now_ms=0.0, seconds=1.0)
