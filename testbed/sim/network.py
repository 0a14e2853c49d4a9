"""Every host's access link in virtual time: the userspace emulator's model, unchanged.

Rules:

1. Each host has an uplink and a downlink, each a :class:`testbed.links.model.LinkQueue`
   built by ``direction_spec`` from the network's definition (trace or rate, delay,
   queue, loss, order), so delivery opportunities, the drop-tail queue and the delay are
   the emulator's own arithmetic. A packet from A to B crosses A's uplink, then B's
   downlink, as in ``testbed.links.core``.
2. An unshaped network (loopback) delivers every packet the instant it is sent.
3. :meth:`SimNetwork.restart_trace` restarts every trace clock at the current instant
   (an episode starts at its offset whatever the setup took).
4. Loss draws come from one ``random.Random`` per direction, seeded from the campaign
   seed and the host's name, so a run is the same on any machine.
5. Counters per host and direction: packets and IP bytes that left, and drops (what the
   emulator counts), from the queues' own counters.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from testbed.links.model import LinkQueue, Opportunities, direction_spec
from testbed.links.profiles import NetworkProfile
from testbed.sim.kernel import Loop, ms_to_ns


@dataclass
class Packet:
    """One IP packet: SIZE bytes from SRC to DST, handed to ``deliver`` on arrival."""

    src: str
    dst: str
    size: int
    payload: Any


Deliver = Callable[[Packet], None]


class _Direction:
    """One LinkQueue and the loop event that wakes it (one pending wake at a time)."""

    __slots__ = ("queue", "wake_ms")

    def __init__(self, queue: LinkQueue) -> None:
        self.queue = queue
        self.wake_ms: float | None = None


class SimNetwork:
    """The hosts' links (module rules); ``deliver`` receives every arriving packet."""

    def __init__(self, loop: Loop, profile: NetworkProfile, hosts: Sequence[str], *,
                 trace_offset_s: float, seed: int, deliver: Deliver) -> None:
        self.loop = loop
        self.profile = profile
        self.deliver = deliver
        self.shaped = profile.link is not None
        self._up: dict[str, _Direction] = {}
        self._down: dict[str, _Direction] = {}
        offset_ms = trace_offset_s * 1000.0
        shared: dict[tuple[Any, ...], Opportunities | None] = {}  # one schedule per trace
        for index, host in enumerate(hosts):
            link = profile.link_of(host, index)
            if link is None:
                continue
            for direction, table in (("up", self._up), ("down", self._down)):
                spec = direction_spec(link, direction, offset_ms=offset_ms)
                key = (direction, spec.trace_name, spec.offset_ms, spec.rate_kbit)
                if key not in shared:
                    shared[key] = spec.opportunities()
                rng = random.Random(f"sim-link/{seed}/{host}/{direction}")
                table[host] = _Direction(spec.make_queue(rng, origin_ms=loop.now_ms,
                                                         opportunities=shared[key]))

    def send(self, packet: Packet) -> None:
        """Offer PACKET to its sender's uplink now (rule 1); True delivery is later."""
        if not self.shaped:
            self.loop.call_soon(self.deliver, packet)
            return
        self._offer(self._up[packet.src], packet, self.loop.now_ms)

    def _offer(self, direction: _Direction, packet: Packet, t_ms: float) -> None:
        direction.queue.offer(packet, packet.size, t_ms)  # a refused packet is a drop
        self._kick(direction)

    def _kick(self, direction: _Direction) -> None:
        nxt = direction.queue.next_event_ms()
        if nxt is None or (direction.wake_ms is not None and direction.wake_ms <= nxt):
            return
        direction.wake_ms = nxt
        self.loop.call_at(max(self.loop.now_ns, ms_to_ns(nxt)), self._wake, direction, nxt)

    def _wake(self, direction: _Direction, target_ms: float) -> None:
        if direction.wake_ms == target_ms:
            direction.wake_ms = None
        for exit_ms, packet in direction.queue.advance(target_ms):
            if direction is self._up.get(packet.src):
                self._offer(self._down[packet.dst], packet, exit_ms)
            else:
                self.deliver(packet)
        self._kick(direction)

    def restart_trace(self) -> None:
        """Replay time 0 is now for every link (rule 3)."""
        for table in (self._up, self._down):
            for direction in table.values():
                direction.queue.restart(self.loop.now_ms)
                direction.wake_ms = None
                self._kick(direction)

    def counters(self) -> dict[str, dict[str, int]]:
        """Per host: ``up_packets``, ``up_bytes``, ``up_drops`` and the same for down."""
        out: dict[str, dict[str, int]] = {}
        for side, table in (("up", self._up), ("down", self._down)):
            for host, direction in table.items():
                c = direction.queue.counters
                row = out.setdefault(host, {})
                row[f"{side}_packets"], row[f"{side}_bytes"] = c.packets, c.bytes
                row[f"{side}_drops"] = c.drops
        return out
