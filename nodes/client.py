"""Data-plane client: calls to other nodes, ``fresh`` or pooled (``reuse``, ``reuse_warm``).

Rules 1, 2, 4 and 5 of ``nodes/transport.py`` apply; this module is the client side.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import trio

from nodes.transport import (
    CONNECTION_SETTINGS,
    POOLED_CONNECTIONS,
    Connection,
    Counters,
    FramedStream,
    open_tcp,
    pack_body,
    set_nodelay,
    unwrap_response,
)
from protocols.auth import HANDSHAKE2_BYTES, ChannelInitiator, Session
from protocols.errors import (
    LocalProtocolError,
    PeerUnavailable,
    RemoteProtocolError,
    RpcError,
    RpcTimeout,
)
from protocols.identity import Identity, Roster

log = logging.getLogger("nodes.transport.client")


class _Pending:
    """A request waiting for its response on a pooled connection."""

    __slots__ = ("error", "event", "result")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class _PooledConnection:
    def __init__(self, peer_id: str, framed: FramedStream, session: Session,
                 counters: Counters) -> None:
        self.peer_id = peer_id
        self.framed = framed
        self.session = session
        self.counters = counters
        self.pending: dict[int, _Pending] = {}
        self.next_id = itertools.count(1)
        self.issued = 0
        self.broken: BaseException | None = None
        self.cancel_scope = trio.CancelScope()

    async def reader(self, on_broken: Callable[[_PooledConnection], None]) -> None:
        error: BaseException
        try:
            with self.cancel_scope:
                while True:
                    msg = await self.framed.receive_opened(self.session)
                    if msg is None:
                        raise PeerUnavailable(f"{self.peer_id} closed the connection")
                    rid, result, call_error = unwrap_response(msg)
                    slot = self.pending.pop(rid, None)
                    if slot is None:
                        if not 0 < rid <= self.issued:
                            raise RemoteProtocolError(f"response to unknown request {rid}")
                        continue  # the caller gave up (timeout); drop the late answer
                    slot.result, slot.error = result, call_error
                    slot.event.set()
            error = PeerUnavailable(f"connection to {self.peer_id} closed locally")
        except RemoteProtocolError as exc:
            self.counters.rejected += 1
            log.warning("closing data-plane connection to %s: %s", self.peer_id, exc)
            error = exc
        except PeerUnavailable as exc:
            error = exc
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            error = PeerUnavailable(f"connection to {self.peer_id} broke: {exc!r}")
        self.fail(error)
        on_broken(self)
        await self.framed.aclose()

    def fail(self, error: BaseException) -> None:
        if self.broken is None:
            self.broken = error
        for slot in self.pending.values():
            slot.error = error
            slot.event.set()
        self.pending.clear()
        self.cancel_scope.cancel()

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        if self.broken is not None:
            raise PeerUnavailable(f"connection to {self.peer_id} is closed")
        rid = next(self.next_id)
        self.issued = rid
        slot = _Pending()
        self.pending[rid] = slot
        try:
            body = pack_body({"i": rid, "m": method, "p": params})
            try:
                await self.framed.send_sealed(self.session, body)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                error = PeerUnavailable(f"send to {self.peer_id} failed: {exc!r}")
                self.fail(error)
                raise error from None
            except trio.Cancelled:
                if self.framed.torn:  # half a frame went out: nobody can use this stream
                    self.fail(PeerUnavailable(f"send to {self.peer_id} was interrupted"))
                raise
            await slot.event.wait()
        finally:
            self.pending.pop(rid, None)
        if slot.error is not None:
            raise slot.error
        return slot.result


class RpcClient:
    """Calls other nodes; open with :func:`open_rpc_client`."""

    def __init__(self, *, identity: Identity, roster: Roster, connection: Connection,
                 counters: Counters, timeout_s: float, nursery: trio.Nursery,
                 congestion_control: str | None = None) -> None:
        self.congestion_control = congestion_control
        self.identity = identity
        self.roster = roster
        self.connection = connection
        self.counters = counters
        self.timeout_s = timeout_s
        self._nursery = nursery
        self._pool: dict[str, _PooledConnection] = {}
        self._open_locks: dict[str, trio.Lock] = {}

    async def call(self, peer_id: str, method: str, params: dict[str, Any]) -> Any:
        """One RPC; returns the ``r`` value. Raises an RpcError or RemoteProtocolError."""
        if peer_id not in self.roster.members:
            raise LocalProtocolError(f"peer_id {peer_id!r} is not a roster member")
        # trio.fail_after, without its generator-based context manager (per call cost)
        with trio.CancelScope(deadline=trio.current_time() + self.timeout_s):
            if self.connection == "fresh":
                return await self._call_fresh(peer_id, method, params)
            return await self._call_reuse(peer_id, method, params)
        self.counters.rpc_timeouts += 1  # reached only when the deadline cancelled the call
        raise RpcTimeout(f"{method} to {peer_id}: no answer within {self.timeout_s} s")

    async def rekey(self, identity: Identity, roster: Roster) -> None:
        """New pinned keys (a new episode): close the pool, connect with these keys."""
        await self.close_pooled()
        self.identity, self.roster = identity, roster

    async def close_pooled(self) -> None:
        """Close every pooled connection (between episodes)."""
        pool, self._pool = self._pool, {}
        for conn in pool.values():
            conn.fail(PeerUnavailable(f"connection to {conn.peer_id} closed locally"))
            await conn.framed.aclose()

    async def _connect(self, peer_id: str) -> tuple[FramedStream, Session]:
        member = self.roster.members[peer_id]
        try:
            stream = await open_tcp(member.host, member.port,
                                    congestion_control=self.congestion_control)
        except OSError as exc:
            raise PeerUnavailable(f"cannot connect to {peer_id} at "
                                  f"{member.host}:{member.port}: {exc}") from None
        self.counters.connections_opened += 1
        framed = FramedStream(stream, self.counters, pre_auth_max_bytes=HANDSHAKE2_BYTES)
        try:
            set_nodelay(stream)
            initiator = ChannelInitiator(identity=self.identity, roster=self.roster,
                                         peer_id=peer_id)
            await framed.send_body(initiator.start())
            reply = await framed.receive_body()
            if reply is None:
                raise PeerUnavailable(f"{peer_id} closed the connection during the handshake")
            session = initiator.finish(reply)
            framed.authenticated()
        except RemoteProtocolError as exc:
            self.counters.rejected += 1
            log.warning("handshake with %s failed: %s", peer_id, exc)
            await framed.aclose()
            raise
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            await framed.aclose()
            raise PeerUnavailable(f"handshake with {peer_id} broke: {exc!r}") from None
        except BaseException:
            await framed.aclose()
            raise
        return framed, session

    async def _call_fresh(self, peer_id: str, method: str, params: dict[str, Any]) -> Any:
        body = pack_body({"i": 1, "m": method, "p": params})
        framed, session = await self._connect(peer_id)
        try:
            await framed.send_sealed(session, body)
            msg = await framed.receive_opened(session)
            if msg is None:
                raise PeerUnavailable(f"{peer_id} closed the connection before answering")
            rid, result, call_error = unwrap_response(msg)
            if rid != 1:
                raise RemoteProtocolError(f"response to unknown request {rid}")
        except RemoteProtocolError as exc:
            self.counters.rejected += 1
            log.warning("closing data-plane connection to %s: %s", peer_id, exc)
            raise
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise PeerUnavailable(f"connection to {peer_id} broke: {exc!r}") from None
        finally:
            await framed.aclose()
        if call_error is not None:
            raise call_error
        return result

    async def _pooled(self, peer_id: str) -> _PooledConnection:
        """The pool's connection to ``peer_id``, opened if there is none."""
        conn = self._pool.get(peer_id)
        if conn is None:
            lock = self._open_locks.setdefault(peer_id, trio.Lock())
            async with lock:
                conn = self._pool.get(peer_id)
                if conn is None:
                    framed, session = await self._connect(peer_id)
                    conn = _PooledConnection(peer_id, framed, session, self.counters)
                    self._pool[peer_id] = conn
                    self._nursery.start_soon(conn.reader, self._drop)
        return conn

    async def _call_reuse(self, peer_id: str, method: str, params: dict[str, Any]) -> Any:
        return await (await self._pooled(peer_id)).call(method, params)

    async def warm_roster(self) -> int:
        """:meth:`warm` to every other roster member with an address."""
        return await self.warm(m.agent_id for m in self.roster.members.values()
                               if m.agent_id != self.identity.agent_id and m.port)

    async def warm(self, peer_ids: Iterable[str]) -> int:
        """Open the pooled connection to every peer in ``peer_ids`` at once (the
        ``reuse_warm`` setting's setup); returns how many were opened. Each open is
        bounded by ``timeout_s``; a failure raises as a call would."""
        if self.connection not in POOLED_CONNECTIONS:
            raise LocalProtocolError(f"connection: {self.connection!r} keeps no pool to warm")
        peers = sorted(set(peer_ids))
        for peer_id in peers:
            if peer_id not in self.roster.members:
                raise LocalProtocolError(f"peer_id {peer_id!r} is not a roster member")
        opened_before = self.counters.connections_opened
        failures: list[Exception] = []

        async def one(peer_id: str) -> None:
            try:
                with trio.fail_after(self.timeout_s):
                    # one request proves the connection to the server, which would
                    # otherwise close it after first_frame_timeout_s without one
                    await (await self._pooled(peer_id)).call("ping", {})
            except trio.TooSlowError:
                self.counters.rpc_timeouts += 1
                failures.append(RpcTimeout(
                    f"warm: no connection to {peer_id} within {self.timeout_s} s"))
            except (RpcError, RemoteProtocolError) as exc:
                failures.append(exc)

        async with trio.open_nursery() as nursery:
            for peer_id in peers:
                nursery.start_soon(one, peer_id)
        if failures:
            raise failures[0]
        return self.counters.connections_opened - opened_before

    def _drop(self, conn: _PooledConnection) -> None:
        if self._pool.get(conn.peer_id) is conn:
            del self._pool[conn.peer_id]


@asynccontextmanager
async def open_rpc_client(*, identity: Identity, roster: Roster, connection: Connection,
                          counters: Counters, timeout_s: float = 10.0,
                          congestion_control: str | None = None,
                          ) -> AsyncIterator[RpcClient]:
    """An :class:`RpcClient` whose pooled connections close when the block exits."""
    if connection not in CONNECTION_SETTINGS:
        raise LocalProtocolError(
            f"connection: {connection!r} is not one of {', '.join(CONNECTION_SETTINGS)}")
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s)
            and timeout_s > 0):
        raise LocalProtocolError(f"timeout_s: {timeout_s!r} must be a positive number")
    async with trio.open_nursery() as nursery:
        client = RpcClient(identity=identity, roster=roster, connection=connection,
                           counters=counters, timeout_s=float(timeout_s), nursery=nursery,
                           congestion_control=congestion_control)
        try:
            yield client
        finally:
            with trio.CancelScope(shield=True):
                await client.close_pooled()
            nursery.cancel_scope.cancel()
