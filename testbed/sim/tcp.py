"""TCP at the level the measurements need, over :class:`testbed.sim.network.SimNetwork`.

Rules (what is modelled; everything else is left out and named in docs/sim.md):

1. A connection opens with SYN (client) and SYN-ACK (server), each a 60-byte IP packet
   (the 40 bytes of IPv4 and TCP headers and 20 of options); the client's connect
   returns when the SYN-ACK arrives and it answers with a pure ACK.
2. Data is the frames the transport writes, one write per frame (TCP_NODELAY): each
   frame is cut into segments of at most :data:`MSS_BYTES`, each an IP packet of its
   payload plus :data:`HEADER_BYTES` (IPv4, TCP and the timestamp option). A message is
   handed to the receiver when its last segment arrives in order.
3. ACKs are cumulative and ride on every packet; a data segment is acknowledged at once
   by a pure ACK (Linux's quick-ack mode at the start of a connection, which is where
   every exchange of a fresh connection is).
4. Segments in flight are bounded by the congestion window: 10 segments at first, +1
   per segment acknowledged (slow start) up to the slow-start threshold, then +1/cwnd.
5. Loss (a full queue, or the link's loss) is repaired by the retransmission timer
   alone: the oldest unacknowledged segment is sent again when it expires (1 s before
   the first RTT sample, then srtt + max(4 rttvar, 200 ms) as Linux computes it,
   doubled per expiry); the window drops to one segment. No fast retransmit, no SACK.
6. Closing: the closer sends FIN (a 52-byte packet); the peer answers with its own FIN
   and the closer ACKs it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from testbed.sim.kernel import NS_PER_MS, Future, Loop
from testbed.sim.network import Packet, SimNetwork

HEADER_BYTES = 52
SYN_BYTES = 60
MTU_BYTES = 1500
MSS_BYTES = MTU_BYTES - HEADER_BYTES
INITIAL_CWND = 10
INITIAL_RTO_MS = 1000.0
MIN_RTO_MS = 200.0
MAX_RTO_MS = 120_000.0

CLIENT, SERVER = 0, 1


@dataclass
class Segment:
    seq: int
    size: int  # IP bytes
    kind: str  # "syn" | "data" | "fin"
    message: Any = None  # set on a message's last segment
    last: bool = False
    sent_ns: int = 0
    retransmitted: bool = False


@dataclass
class Wire:
    """What a packet carries: the connection, the sender's side, a segment or none (a
    pure ACK), and the sender's cumulative ACK of the other direction."""

    conn: int
    side: int
    segment: Segment | None
    ack: int


@dataclass
class _Side:
    host: str
    next_seq: int = 0
    unacked: dict[int, Segment] = field(default_factory=dict)
    waiting: list[Segment] = field(default_factory=list)  # beyond the window
    cwnd: float = INITIAL_CWND
    ssthresh: float = float("inf")
    rcv_next: int = 0
    out_of_order: dict[int, Segment] = field(default_factory=dict)
    srtt_ms: float | None = None
    rttvar_ms: float = 0.0
    rto_ms: float = INITIAL_RTO_MS
    timer_gen: int = 0
    timer_armed: bool = False
    on_message: Callable[[Any], None] | None = None
    fin_sent: bool = False
    fin_received: bool = False


class Connection:
    """One TCP connection between a client host and a server host."""

    def __init__(self, tcp: TcpLayer, cid: int, client: str, server: str) -> None:
        self.tcp = tcp
        self.id = cid
        self.sides = (_Side(client), _Side(server))
        self.established: Future[None] = Future()
        self.closed = False

    @property
    def client(self) -> str:
        return self.sides[CLIENT].host

    @property
    def server(self) -> str:
        return self.sides[SERVER].host

    def on_message(self, side: int, callback: Callable[[Any], None]) -> None:
        self.sides[side].on_message = callback

    def send(self, side: int, frame_bytes: int, message: Any) -> None:
        """Write one frame of FRAME_BYTES from SIDE; MESSAGE reaches the peer's
        ``on_message`` when the frame has arrived (rule 2)."""
        remaining = frame_bytes
        while remaining > 0:
            payload = min(MSS_BYTES, remaining)
            remaining -= payload
            self._queue(side, HEADER_BYTES + payload, "data",
                        message if remaining == 0 else None, remaining == 0)

    def close(self, side: int) -> None:
        me = self.sides[side]
        if not me.fin_sent:
            me.fin_sent = True
            self._queue(side, HEADER_BYTES, "fin", None, True)

    # --- sending -----------------------------------------------------------------------
    def _queue(self, side: int, size: int, kind: str, message: Any, last: bool) -> None:
        me = self.sides[side]
        segment = Segment(me.next_seq, size, kind, message, last)
        me.next_seq += 1
        me.waiting.append(segment)
        self._push(side)

    def _push(self, side: int) -> None:
        me = self.sides[side]
        while me.waiting and len(me.unacked) < int(me.cwnd):
            segment = me.waiting.pop(0)
            me.unacked[segment.seq] = segment
            self._transmit(side, segment)

    def _transmit(self, side: int, segment: Segment) -> None:
        me = self.sides[side]
        segment.sent_ns = self.tcp.loop.now_ns
        self.tcp.emit(self, side, segment, me.rcv_next)
        if not me.timer_armed:
            self._arm(side)

    def _arm(self, side: int) -> None:
        me = self.sides[side]
        me.timer_gen += 1
        me.timer_armed = True
        loop = self.tcp.loop
        loop.call_at(loop.now_ns + round(me.rto_ms * NS_PER_MS), self._expire, side,
                     me.timer_gen)

    def _expire(self, side: int, gen: int) -> None:
        me = self.sides[side]
        if gen != me.timer_gen or not me.timer_armed or not me.unacked:
            return
        oldest = me.unacked[min(me.unacked)]
        oldest.retransmitted = True
        self.tcp.retransmits += 1
        me.ssthresh = max(2.0, len(me.unacked) / 2)
        me.cwnd = 1.0
        me.rto_ms = min(MAX_RTO_MS, me.rto_ms * 2)
        me.timer_armed = False
        self._transmit(side, oldest)

    # --- receiving ---------------------------------------------------------------------
    def receive(self, wire: Wire) -> None:
        side = 1 - wire.side  # the receiving side
        me = self.sides[side]
        self._acked(side, wire.ack)
        segment = wire.segment
        if segment is None:
            return
        if segment.seq >= me.rcv_next:
            me.out_of_order[segment.seq] = segment
        delivered: list[Segment] = []
        while me.rcv_next in me.out_of_order:
            delivered.append(me.out_of_order.pop(me.rcv_next))
            me.rcv_next += 1
        for got in delivered:
            self._deliver(side, got)

    def _deliver(self, side: int, segment: Segment) -> None:
        me = self.sides[side]
        if segment.kind == "syn":
            if side == SERVER:  # SYN-ACK
                self._queue(side, SYN_BYTES, "syn", None, True)
            elif not self.established.done:  # the handshake's ACK; connect returns
                self.tcp.emit(self, side, None, me.rcv_next)
                self.established.set_result(None)
        elif segment.kind == "fin":
            me.fin_received = True
            if me.fin_sent:
                self.tcp.emit(self, side, None, me.rcv_next)  # ACK of the peer's FIN
                self.closed = True
            else:  # the peer closed first: its reader sees the end of the stream
                me.fin_sent = True
                self._queue(side, HEADER_BYTES, "fin", None, True)
                if me.on_message is not None:
                    me.on_message(("closed", "the peer closed the connection"))
        else:
            self.tcp.emit(self, side, None, me.rcv_next)  # quick ACK (rule 3)
            if segment.last and me.on_message is not None:
                me.on_message(segment.message)

    def _acked(self, side: int, ack: int) -> None:
        me = self.sides[side]
        newly = [seq for seq in me.unacked if seq < ack]
        if not newly:
            return
        now = self.tcp.loop.now_ns
        for seq in newly:
            segment = me.unacked.pop(seq)
            if not segment.retransmitted:
                self._sample(me, (now - segment.sent_ns) / NS_PER_MS)
            if segment.kind == "data":
                me.cwnd += 1.0 if me.cwnd < me.ssthresh else 1.0 / me.cwnd
        me.timer_armed = False
        me.timer_gen += 1
        if me.unacked:
            self._arm(side)
        self._push(side)

    @staticmethod
    def _sample(me: _Side, rtt_ms: float) -> None:
        if me.srtt_ms is None:
            me.srtt_ms, me.rttvar_ms = rtt_ms, rtt_ms / 2
        else:
            me.rttvar_ms = 0.75 * me.rttvar_ms + 0.25 * abs(me.srtt_ms - rtt_ms)
            me.srtt_ms = 0.875 * me.srtt_ms + 0.125 * rtt_ms
        me.rto_ms = min(MAX_RTO_MS, me.srtt_ms + max(4 * me.rttvar_ms, MIN_RTO_MS))


class TcpLayer:
    """Connections between the hosts of one network; ``on_accept`` is the server app."""

    def __init__(self, loop: Loop, network_factory: Callable[[Callable[[Packet], None]],
                                                             SimNetwork]) -> None:
        self.loop = loop
        self.network = network_factory(self._arrived)
        self._conns: dict[int, Connection] = {}
        self._ids = itertools.count(1)
        self.on_accept: Callable[[Connection], None] | None = None
        self.retransmits = 0

    def connect(self, client: str, server: str) -> Connection:
        """Open a connection (rule 1): await ``established`` before sending on it."""
        conn = Connection(self, next(self._ids), client, server)
        self._conns[conn.id] = conn
        conn._queue(CLIENT, SYN_BYTES, "syn", None, True)
        return conn

    def emit(self, conn: Connection, side: int, segment: Segment | None, ack: int) -> None:
        size = segment.size if segment is not None else HEADER_BYTES
        src, dst = conn.sides[side].host, conn.sides[1 - side].host
        self.network.send(Packet(src, dst, size, Wire(conn.id, side, segment, ack)))

    def _arrived(self, packet: Packet) -> None:
        wire: Wire = packet.payload
        conn = self._conns.get(wire.conn)
        if conn is None:
            return
        first = (wire.side == CLIENT and wire.segment is not None
                 and wire.segment.kind == "syn" and conn.sides[SERVER].rcv_next == 0)
        conn.receive(wire)
        if first and self.on_accept is not None:
            self.on_accept(conn)
        if conn.closed and not any(s.unacked or s.waiting for s in conn.sides):
            self._conns.pop(conn.id, None)

    @property
    def open_connections(self) -> int:
        return len(self._conns)
