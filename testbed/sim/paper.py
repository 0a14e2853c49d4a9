"""The paper's harness as a sim model (its appendix H): every framed exchange is
delayed by one trace delay, and nothing else.

Rules (``testbed.links.exchange`` rules 1-2, in virtual time):

1. A call from A to B started at replay time t reaches B when one small packet has
   crossed A's uplink and B's downlink (the first delivery opportunity at or after
   each arrival, plus the delay), and its answer is back when one has crossed B's
   uplink and A's downlink from there. B answers from its store as it is when the
   request reaches it.
2. No TCP and no channel handshake (no connection is counted, so no handshake round),
   no serialization of more than one packet, no queue ahead, no loss, no CPU time.
3. Frames are still the testbed's own bytes (request ids counted per peer, as on a
   pooled connection), so traffic columns are comparable; an answer later than
   ``rpc_timeout_s`` is an ``RpcTimeout`` at the deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from nodes.transport import unwrap_response
from protocols.errors import LocalProtocolError, PeerUnavailable, RpcTimeout
from testbed.links.exchange import Crossing, crossing_of
from testbed.links.linkspec import DIRECTIONS
from testbed.links.profiles import NetworkProfile
from testbed.sim import frames
from testbed.sim.kernel import NS_PER_S, Loop, ms_to_ns
from testbed.sim.node import SimNode

MODEL = "paper"


class PaperLinks:
    """Each host's two crossings (None: unshaped), and replay time 0 on the loop."""

    def __init__(self, loop: Loop, profile: NetworkProfile, hosts: list[str], *,
                 trace_offset_s: float) -> None:
        self.loop = loop
        self.origin_ms = 0.0
        self._up: dict[str, Crossing | None] = {}
        self._down: dict[str, Crossing | None] = {}
        built: dict[tuple[Any, str], Crossing] = {}
        up, down = DIRECTIONS
        for index, host in enumerate(hosts):
            link = profile.link_of(host, index)
            for direction, table in ((up, self._up), (down, self._down)):
                if link is None:
                    table[host] = None
                    continue
                key = (link, direction)
                if key not in built:
                    built[key] = crossing_of(link.side(direction), trace_offset_s)
                table[host] = built[key]

    def restart_trace(self) -> None:
        self.origin_ms = self.loop.now_ms

    def crossed(self, src: str, dst: str, t_ms: float) -> float:
        """Loop time (ms) a packet offered at loop time T_MS from SRC reaches DST."""
        for crossing in (self._up[src], self._down[dst]):
            if crossing is not None:
                t_ms = crossing.exit_ms(t_ms - self.origin_ms) + self.origin_ms
        return t_ms


class PaperClient:
    """A node's client in the paper's harness (module rules)."""

    def __init__(self, node: SimNode, links: PaperLinks, peers: Mapping[str, SimNode]
                 ) -> None:
        self.node = node
        self.links = links
        self.peers = peers
        self._next_id: dict[str, int] = {}

    async def call(self, peer_id: str, method: str, params: dict[str, Any]) -> Any:
        node, loop = self.node, self.node.loop
        peer = self.peers.get(peer_id)
        if peer is None or peer_id not in node.roster.members:
            raise LocalProtocolError(f"peer_id {peer_id!r} is not a roster member")
        deadline = loop.now_ns + round(node.rpc_timeout_s * NS_PER_S)
        rid = self._next_id[peer_id] = self._next_id.get(peer_id, 0) + 1
        node.count_sent(frames.request_bytes(rid, method, params))
        arrives = ms_to_ns(self.links.crossed(node.agent_id, peer_id, loop.now_ms))
        await self._until(min(arrives, deadline), deadline, method, peer_id)
        body = peer.answer(node.agent_id, rid, method, params)
        if body is None:
            raise PeerUnavailable(f"{peer_id} rejected the request and closed")
        size = peer.answer_size(body)
        back = ms_to_ns(self.links.crossed(peer_id, node.agent_id, loop.now_ms))
        await self._until(min(back, deadline), deadline, method, peer_id)
        node.count_received(size)
        _, result, error = unwrap_response(body)
        if error is not None:
            raise error
        return result

    async def _until(self, t_ns: int, deadline: int, method: str, peer_id: str) -> None:
        loop = self.node.loop
        await loop.sleep_ns(t_ns - loop.now_ns)
        if t_ns >= deadline:
            self.node.counters.rpc_timeouts += 1
            raise RpcTimeout(f"{method} to {peer_id}: no answer within "
                             f"{self.node.rpc_timeout_s} s")

    async def warm(self) -> int:
        return 0  # nothing to open: the harness has no connections


def paper_client(links: PaperLinks, peers: Mapping[str, SimNode]
                 ) -> Callable[[SimNode], PaperClient]:
    return lambda node: PaperClient(node, links, peers)


__all__ = ["MODEL", "PaperClient", "PaperLinks", "paper_client"]
