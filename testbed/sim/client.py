"""A node's data-plane client in virtual time (``testbed.sim.node`` rule 3; the
``nodes.client`` it mirrors): ``fresh`` opens a connection per call, ``reuse`` keeps one
per peer with concurrent calls multiplexed, ``reuse_warm`` opens them at setup."""

from __future__ import annotations

from functools import partial
from typing import Any, Protocol, TypeVar

from nodes.transport import Counters, unwrap_response
from protocols.errors import LocalProtocolError, PeerUnavailable, RpcTimeout
from protocols.identity import Roster
from testbed.sim import frames
from testbed.sim.calibration import Calibration
from testbed.sim.kernel import NS_PER_S, Future, Loop, gather
from testbed.sim.tcp import CLIENT, Connection, TcpLayer

T = TypeVar("T")


class ClientHost(Protocol):
    """What the client uses of its node (``testbed.sim.node.SimNode``)."""

    loop: Loop
    tcp: TcpLayer
    roster: Roster
    connection: str
    rpc_timeout_s: float
    calibration: Calibration
    counters: Counters

    @property
    def agent_id(self) -> str: ...

    def count_sent(self, size: int, *, handshake: bool = False) -> None: ...

    def count_received(self, size: int) -> None: ...

    def cpu(self, ms: float) -> Future[None]: ...


async def wait_until(loop: Loop, future: Future[T], deadline_ns: int, what: str) -> T:
    """FUTURE's value, or RpcTimeout once the loop passes DEADLINE_NS."""
    if not future.done:
        timer: Future[None] = Future()

        def expire() -> None:
            if not future.done and not timer.done:
                timer.set_result(None)

        loop.call_at(max(loop.now_ns, deadline_ns), expire)
        either: Future[None] = Future()
        for f in (future, timer):
            f.add_callback(lambda _f: None if either.done else either.set_result(None))
        await either
        if not future.done:
            raise RpcTimeout(what)
    return future.result()


class Pooled:
    """A pooled connection (``nodes.client._PooledConnection``)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.next_id = 0
        self.pending: dict[int, Future[Any]] = {}
        self.broken: BaseException | None = None


class SimClient:
    """The node's data-plane client in virtual time (rule 3)."""

    def __init__(self, node: ClientHost) -> None:
        self.node = node
        self._pool: dict[str, Pooled] = {}
        self._opening: dict[str, Future[None]] = {}

    async def call(self, peer_id: str, method: str, params: dict[str, Any]) -> Any:
        node = self.node
        if peer_id not in node.roster.members:
            raise LocalProtocolError(f"peer_id {peer_id!r} is not a roster member")
        deadline = node.loop.now_ns + round(node.rpc_timeout_s * NS_PER_S)
        try:
            if node.connection == "fresh":
                return await self._fresh(peer_id, method, params, deadline)
            return await self._reuse(peer_id, method, params, deadline)
        except RpcTimeout:
            node.counters.rpc_timeouts += 1
            raise RpcTimeout(f"{method} to {peer_id}: no answer within "
                             f"{node.rpc_timeout_s} s") from None

    async def _connect(self, peer_id: str, deadline: int) -> tuple[Connection, list[Any]]:
        """Open a connection and run the channel handshake; the connection and its inbox."""
        node = self.node
        conn = node.tcp.connect(node.agent_id, peer_id)
        inbox: list[Any] = []
        waiter: list[Future[None]] = []

        def got(message: Any) -> None:
            inbox.append(message)
            if waiter and not waiter[0].done:
                waiter.pop().set_result(None)

        conn.on_message(CLIENT, got)
        await wait_until(node.loop, conn.established, deadline, "connect")
        node.counters.connections_opened += 1
        await node.cpu(node.calibration.handshake_ms / 2)
        hello = frames.handshake1_bytes(node.agent_id)
        node.count_sent(hello, handshake=True)
        conn.send(CLIENT, hello, ("hs1", node.agent_id))
        while not inbox:
            waiter.append(Future())
            await wait_until(node.loop, waiter[-1], deadline, "handshake")
        reply = inbox.pop(0)
        if reply[0] == "closed":
            raise PeerUnavailable(f"{peer_id} closed the connection during the handshake")
        node.count_received(frames.HANDSHAKE2_FRAME_BYTES)
        return conn, inbox

    async def _fresh(self, peer_id: str, method: str, params: dict[str, Any],
                     deadline: int) -> Any:
        node = self.node
        conn, inbox = await self._connect(peer_id, deadline)
        try:
            await node.cpu(node.calibration.exchange_ms / 2)
            size = frames.request_bytes(1, method, params)
            node.count_sent(size)
            answered: Future[Any] = Future()
            conn.on_message(CLIENT, answered.set_result)
            if inbox:
                answered.set_result(inbox.pop(0))
            conn.send(CLIENT, size, ("req", 1, method, params))
            reply = await wait_until(node.loop, answered, deadline, method)
        finally:
            conn.close(CLIENT)
        return self._answer(reply)

    def _answer(self, reply: tuple[Any, ...]) -> Any:
        if reply[0] == "closed":
            raise PeerUnavailable(f"connection closed by the peer: {reply[1]}")
        _, size, body = reply
        self.node.count_received(size)
        _, result, error = unwrap_response(body)
        if error is not None:
            raise error
        return result

    async def _pooled(self, peer_id: str, deadline: int) -> Pooled:
        pooled = self._pool.get(peer_id)
        while pooled is None:
            opening = self._opening.get(peer_id)
            if opening is not None:  # another call is opening it (the pool's lock)
                await wait_until(self.node.loop, opening, deadline, "connect")
                pooled = self._pool.get(peer_id)
                if pooled is None:
                    raise PeerUnavailable(f"connection to {peer_id} failed to open")
                break
            done: Future[None] = Future()
            self._opening[peer_id] = done
            try:
                conn, _ = await self._connect(peer_id, deadline)
                pooled = Pooled(conn)
                self._pool[peer_id] = pooled
                conn.on_message(CLIENT, partial(self._dispatch, pooled))
            finally:
                del self._opening[peer_id]
                done.set_result(None)
        return pooled

    def _dispatch(self, pooled: Pooled, reply: tuple[Any, ...]) -> None:
        if reply[0] == "closed":
            pooled.broken = PeerUnavailable(f"connection closed by the peer: {reply[1]}")
            for future in pooled.pending.values():
                future.set_result(reply)
            pooled.pending.clear()
            self._pool = {k: v for k, v in self._pool.items() if v is not pooled}
            return
        rid = reply[2]["i"]
        waiting = pooled.pending.pop(rid, None)
        if waiting is not None:
            waiting.set_result(reply)

    async def _reuse(self, peer_id: str, method: str, params: dict[str, Any],
                     deadline: int) -> Any:
        pooled = await self._pooled(peer_id, deadline)
        if pooled.broken is not None:
            raise pooled.broken
        await self.node.cpu(self.node.calibration.exchange_ms / 2)
        pooled.next_id += 1
        rid = pooled.next_id
        size = frames.request_bytes(rid, method, params)
        self.node.count_sent(size)
        answered: Future[Any] = Future()
        pooled.pending[rid] = answered
        pooled.conn.send(CLIENT, size, ("req", rid, method, params))
        try:
            reply = await wait_until(self.node.loop, answered, deadline, method)
        finally:
            pooled.pending.pop(rid, None)
        return self._answer(reply)

    async def warm(self) -> int:
        """Open a pooled connection to every other roster member (``reuse_warm``)."""
        node = self.node
        peers = [m for m in node.roster.members if m != node.agent_id]
        deadline = node.loop.now_ns + round(node.rpc_timeout_s * NS_PER_S)

        async def one(peer: str) -> None:
            await self._reuse(peer, "ping", {}, deadline)

        for failed in await gather(node.loop, [partial(one, p) for p in peers]):
            if isinstance(failed, BaseException):
                raise failed
        return len(peers)
