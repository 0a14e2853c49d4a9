"""The emulator core: packets routed across the hosts' links, and injected faults (pure).

`EmulatorCore` joins the per-host links (``testbed.links.model.LinkQueue``): a packet
read from host A's TUN device crosses A's uplink, then the downlink of the host that
owns its IPv4 destination address. Time is an input, as in the model.

Faults (the fault suite's emulator ops, :meth:`EmulatorCore.add_fault`), each for a
stretch of time and for the packets from or to one host, chosen with a seeded RNG:
``partition`` drops every packet; ``corrupt`` flips one byte of a TCP payload and fixes
the TCP checksum, so TCP delivers the altered bytes and only the channel's AEAD can
catch them; ``duplicate`` offers a packet twice; ``reorder`` holds a packet back
``REORDER_HOLD_MS`` so the ones after it overtake it.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.links.model import LinkQueue

FAULT_KINDS = ("partition", "corrupt", "duplicate", "reorder")
REORDER_HOLD_MS = 20.0


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
