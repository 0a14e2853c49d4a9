"""Data-plane server: accept connections, run the responder handshake, serve requests.

Rules 1-4 of ``nodes/transport.py`` apply; this module is the server side of them,
plus the connection limits of ``nodes/limits.py``:

5. Before the handshake a connection holds at most one handshake-sized frame; it must
   finish the handshake within ``handshake_timeout_s``, send its first authenticated
   frame within ``first_frame_timeout_s`` of it, and then never be silent for
   ``idle_timeout_s``.
6. At ``max_connections`` (or ``max_connections_per_peer`` for one peer) the oldest
   connection that has not yet sent an authenticated frame is evicted; if there is
   none, the new connection is refused. ``refused`` counts both.
7. :meth:`DataPlaneServer.rekey` swaps identity and roster (a new episode) and closes
   every connection of the previous one; the listening socket stays bound.
8. A ``sync_handler`` (the node's) is answered inline by the connection's reader: no
   task per request, and the answer is written before the next frame is read, unless
   the socket or a frame still going out holds it back (then a task sends it, and
   counts against ``max_in_flight`` as a running request does, and the reader yields
   to the rest of the node before the next request).
9. Bytes held for peers are bounded (``nodes/holdings.py``): the partial frames of
   connections that have not yet sent an authenticated frame, per source address
   (``pre_auth_bytes_per_source``; past it the source's oldest such connection is
   closed), and answers waiting on a peer that does not read them, per connection and
   per peer (``answer_bytes_per_connection`` / ``answer_bytes_per_peer``; past them the
   connection, or the peer's connection holding the most, is closed). Each close is
   the peer's fault: ``rejected``, a rate-limited warning, the node keeps serving; what
   such connections held is given back to the kernel after them (``nodes/memory.py``).
10. One budget over all of it (``held_bytes_per_node``): the bytes every connection's
   decoder holds (partial and complete frames, proven or not: ``frames``) plus every
   answer waiting on a peer. Past it the live connections holding the most are closed
   until the node is back within it, whoever they belong to. A connection that held
   more than ``LARGE_HOLD_BYTES`` at once has its bytes given back after it closes,
   however it ended (an honest one holds at most about one artifact frame).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from nodes.holdings import Holding
from nodes.inbound import InboundConn, is_detached, peer_source
from nodes.limits import Limits, RateLimitedLog
from nodes.memory import MemoryReturn
from nodes.transport import (
    Counters,
    FramedStream,
    Handler,
    SyncHandler,
    error_body,
    pack_body,
    parse_request,
    set_congestion_control,
    set_nodelay,
)
from protocols.auth import HANDSHAKE1_MAX_BYTES, ChannelResponder, Session
from protocols.errors import RemoteCallError, RemoteProtocolError
from protocols.identity import Identity, Roster

log = logging.getLogger("nodes.transport.server")

#: A connection that held more than this at once is followed by a memory return.
LARGE_HOLD_BYTES = 1024 * 1024
_NODE = "node"


class DataPlaneServer:
    """The server's state; :func:`serve_data_plane` runs it."""

    def __init__(self, *, identity: Identity, roster: Roster, handler: Handler | None = None,
                 sync_handler: SyncHandler | None = None, counters: Counters,
                 limits: Limits) -> None:
        if (handler is None) == (sync_handler is None):
            raise TypeError("DataPlaneServer: pass exactly one of handler, sync_handler")
        self.identity = identity
        self.roster = roster
        self.handler: Handler = handler or self._call_sync
        self.sync_handler = sync_handler
        self.counters = counters
        self.limits = limits
        self.conns: dict[InboundConn, None] = {}  # insertion order = age
        self.logs = RateLimitedLog(log, rate_per_s=limits.log_lines_per_s)
        self.pre_auth = Holding("pre_auth", lambda c: c.source, per_connection=None,
                                per_group=limits.pre_auth_bytes_per_source, order="oldest",
                                detached=is_detached)
        self.answers = Holding("answers", lambda c: c.peer,
                               per_connection=limits.answer_bytes_per_connection,
                               per_group=limits.answer_bytes_per_peer, order="largest",
                               detached=is_detached)
        self.frames = Holding("frames", lambda c: _NODE, per_connection=None,
                              per_group=limits.held_bytes_per_node, order="largest",
                              detached=is_detached)
        self.memory = MemoryReturn()
        self._nursery: trio.Nursery | None = None  # the connections' (accept_loop's)

    async def _call_sync(self, peer: str, method: str, params: dict[str, Any]) -> Any:
        assert self.sync_handler is not None
        return self.sync_handler(peer, method, params)

    def rekey(self, identity: Identity, roster: Roster) -> None:
        """New pinned keys (a new episode): close every connection made under the old."""
        self.identity, self.roster = identity, roster
        for conn in list(self.conns):
            self._close(conn)

    # --- admission -----------------------------------------------------------------
    def _evict_one(self, peer: str | None) -> bool:
        """Evict the oldest unproven connection (of ``peer`` if given)."""
        for conn in self.conns:
            if not conn.proven and (peer is None or conn.peer == peer) \
                    and not conn.detached:
                self._close(conn)
                conn.faulted = True
                self.conns.pop(conn)
                self.counters.refused += 1
                self.logs.warning("evict", "evicted an unproven data-plane connection "
                                  "from %s to make room", conn.peer or "?")
                return True
        return False

    def _admit(self, source: str) -> InboundConn | None:
        if len(self.conns) >= self.limits.max_connections and not self._evict_one(None):
            self.counters.refused += 1
            self.logs.warning("refuse", "refused a data-plane connection: %d open "
                              "(max_connections)", len(self.conns))
            return None
        conn = InboundConn(source)
        self.conns[conn] = None
        self.counters.peak_connections = max(self.counters.peak_connections, len(self.conns))
        return conn

    def _admit_peer(self, conn: InboundConn, peer: str) -> bool:
        conn.peer = peer
        same = sum(1 for c in self.conns if c.peer == peer and c is not conn)
        if same < self.limits.max_connections_per_peer:
            counters = self.counters
            counters.peak_peer_connections = max(counters.peak_peer_connections, same + 1)
            return True
        if self._evict_one(peer):
            return True
        self.counters.refused += 1
        self.logs.warning("refuse-peer", "refused a data-plane connection from %s: %d open "
                          "(max_connections_per_peer)", peer, same)
        return False

    # --- bytes held for peers (rule 9) ------------------------------------------------
    def _hold_pre_auth(self, conn: InboundConn, held: int) -> None:
        """``conn`` (not yet proven) holds ``held`` bytes of a partial frame."""
        _, total = self.pre_auth.set(conn, held)
        conn.held_most = max(conn.held_most, held + conn.answers)
        counters = self.counters
        counters.peak_pre_auth_bytes = max(counters.peak_pre_auth_bytes, total)
        for victim in self.pre_auth.to_close(conn, self.conns):
            if victim is conn:
                self._detach(conn)
                raise RemoteProtocolError(
                    f"unauthenticated connections from {conn.source} hold more than "
                    f"{self.limits.pre_auth_bytes_per_source} bytes "
                    "(pre_auth_bytes_per_source)")
            self._close_for_holding(victim, "unauthenticated connections from that "
                                    "source hold more than pre_auth_bytes_per_source")

    def _hold_frames(self, conn: InboundConn, held: int) -> None:
        """``conn``'s decoder holds ``held`` bytes (rules 9 and 10)."""
        if not conn.proven:
            self._hold_pre_auth(conn, held)
        self.frames.set(conn, held)
        conn.held_most = max(conn.held_most, held + conn.answers)
        self._within_node_budget(conn)

    def node_held_bytes(self) -> int:
        """What live connections hold for peers now (rule 10)."""
        return self.frames.total(_NODE) + sum(self.answers.totals.values())

    def _within_node_budget(self, conn: InboundConn) -> None:
        """Rule 10: close the connections holding the most while the node is past
        ``held_bytes_per_node``; raises if ``conn`` itself is one of them."""
        total = self.node_held_bytes()
        counters = self.counters
        counters.peak_node_held_bytes = max(counters.peak_node_held_bytes, total)
        cap = self.limits.held_bytes_per_node
        if total <= cap:
            return
        live = [c for c in self.conns if not c.detached and c.frames + c.answers > 0]
        if conn not in live and not conn.detached:
            live.append(conn)
        live.sort(key=lambda c: c.frames + c.answers, reverse=True)
        close_self = False
        for victim in live:
            if total <= cap:
                break
            total -= victim.frames + victim.answers
            if victim is conn:
                close_self = True
                continue
            self._close_for_holding(victim, "the node holds more than held_bytes_per_node "
                                    "for its peers and this connection holds the most")
        if close_self:
            self._detach(conn)
            raise RemoteProtocolError(
                f"the node holds more than {self.limits.held_bytes_per_node} bytes for "
                "its peers and this connection holds the most (held_bytes_per_node)")

    def _queue_answer(self, conn: InboundConn, size: int) -> None:
        """``size`` more bytes of answers wait on ``conn``'s peer."""
        held, total = self.answers.change(conn, size)
        conn.held_most = max(conn.held_most, held + conn.pre_auth)
        counters = self.counters
        counters.peak_answer_bytes = max(counters.peak_answer_bytes, held)
        counters.peak_peer_answer_bytes = max(counters.peak_peer_answer_bytes, total)
        for victim in self.answers.to_close(conn, self.conns):
            if victim is conn:
                self._detach(conn)
                which = "connection" if held > self.limits.answer_bytes_per_connection \
                    else "peer"
                raise RemoteProtocolError(
                    f"{held if which == 'connection' else total} bytes of answers wait "
                    f"on a peer that does not read them (answer_bytes_per_{which})")
            self._close_for_holding(victim, "answers waiting on it exceed "
                                    "answer_bytes_per_peer (it does not read them)")
        if size > 0:
            self._within_node_budget(conn)

    def _detach(self, conn: InboundConn) -> None:
        """``conn`` is closing: its bytes stop counting against the caps (they are let
        go as soon as its tasks see the close)."""
        if not conn.detached:
            self.pre_auth.detach(conn)
            self.answers.detach(conn)
            self.frames.detach(conn)
            conn.detached = True

    def _close(self, conn: InboundConn) -> None:
        self._detach(conn)
        conn.scope.cancel()

    def _close_for_holding(self, conn: InboundConn, why: str) -> None:
        self._close(conn)
        conn.faulted = True
        self.counters.rejected += 1
        self.logs.warning("hold", "closing data-plane connection from %s: %s",
                          conn.peer or conn.source, why)

    # --- serving -----------------------------------------------------------------------
    async def accept_loop(self, listener: trio.SocketListener,
                          nursery: trio.Nursery) -> None:
        self._nursery = nursery
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # e.g. EMFILE: keep serving the connections we have
                self.logs.warning("accept", "accept failed: %s (errno %s)", exc, exc.errno)
                await trio.sleep(0.01)
                continue
            self.counters.connections_accepted += 1
            conn = self._admit(peer_source(stream))
            if conn is None:
                await trio.aclose_forcefully(stream)
                continue
            nursery.start_soon(self.serve_connection, stream, conn)

    async def serve_connection(self, stream: trio.SocketStream, conn: InboundConn) -> None:
        framed = FramedStream(stream, self.counters, pre_auth_max_bytes=HANDSHAKE1_MAX_BYTES)
        peer = "?"
        limits = self.limits
        try:
            with conn.scope:
                set_nodelay(stream)
                with trio.fail_after(limits.handshake_timeout_s):
                    first = await framed.receive_body()
                    if first is None:
                        return
                    responder = ChannelResponder(identity=self.identity, roster=self.roster)
                    try:
                        reply, session = responder.respond(first)
                    finally:
                        peer = responder.peer_id or "?"
                    if not self._admit_peer(conn, session.peer_id):
                        return
                    await framed.send_body(reply)
                framed.authenticated()
                framed.on_buffered = lambda held: self._hold_frames(conn, held)
                await self._serve_requests(framed, session, conn)
        except RemoteProtocolError as exc:
            conn.faulted = True
            self.counters.rejected += 1
            self.logs.warning("reject", "closing data-plane connection from %s: %s", peer, exc)
        except trio.TooSlowError:
            conn.faulted = True
            self.counters.rejected += 1
            self.logs.warning("timeout", "closing data-plane connection from %s: %s", peer,
                              "idle too long" if conn.proven
                              else "no authenticated frame in time" if conn.peer
                              else "handshake timed out")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.debug("data-plane connection from %s ended: %r", peer, exc)
        finally:
            self.conns.pop(conn, None)
            self.pre_auth.release(conn)
            self.frames.release(conn)
            await framed.aclose()
            if conn.faulted or not conn.proven or conn.held_most > LARGE_HOLD_BYTES:
                self.memory.released(conn.held_most, self._nursery)  # let go (rule 10)

    def _answer_now(self, peer: str, rid: int, method: str, params: dict[str, Any]) -> bytes:
        """The response body of one request from :attr:`sync_handler` (raises
        RemoteProtocolError for a request that closes the connection)."""
        assert self.sync_handler is not None
        try:
            return pack_body({"i": rid, "r": self.sync_handler(peer, method, params)})
        except RemoteCallError as exc:
            return error_body(rid, exc.code, exc.message)
        except RemoteProtocolError:
            raise
        except Exception as exc:  # our handler's bug: answer, log, keep serving
            log.exception("handler for %r from %s failed", method, peer)
            return error_body(rid, "internal", f"{type(exc).__name__}: {exc}")

    async def _serve_requests(self, framed: FramedStream, session: Session,
                              conn: InboundConn) -> None:
        fault: list[RemoteProtocolError] = []
        limits = self.limits
        timed_out = False
        async with trio.open_nursery() as nursery:
            in_flight = 0

            async def run_one(rid: int, method: str, params: dict[str, Any]) -> None:
                nonlocal in_flight
                try:
                    await answer(rid, method, params)
                finally:
                    in_flight -= 1

            async def answer(rid: int, method: str, params: dict[str, Any]) -> None:
                try:
                    result = await self.handler(session.peer_id, method, params)
                    body = pack_body({"i": rid, "r": result})
                except RemoteCallError as exc:
                    body = error_body(rid, exc.code, exc.message)
                except RemoteProtocolError as exc:
                    fault.append(exc)
                    nursery.cancel_scope.cancel()
                    return
                except Exception as exc:  # our handler's bug: answer, log, keep serving
                    log.exception("handler for %r from %s failed", method, session.peer_id)
                    body = error_body(rid, "internal", f"{type(exc).__name__}: {exc}")
                try:
                    self._queue_answer(conn, len(body))
                except RemoteProtocolError as exc:
                    self.answers.change(conn, -len(body))
                    fault.append(exc)
                    nursery.cancel_scope.cancel()
                    return
                try:
                    await send(framed.send_sealed, session, body)
                finally:
                    self.answers.change(conn, -len(body))

            async def send(fn: Callable[..., Awaitable[None]], *args: Any) -> None:
                try:
                    await fn(*args)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    nursery.cancel_scope.cancel()

            async def send_later(size: int, fn: Callable[..., Awaitable[None]],
                                 *args: Any) -> None:
                nonlocal in_flight
                try:
                    await send(fn, *args)
                finally:
                    in_flight -= 1
                    self.answers.change(conn, -size)

            def queue(size: int, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
                nonlocal in_flight
                in_flight += 1
                nursery.start_soon(send_later, size, fn, *args)
                self._queue_answer(conn, size)  # raises past the caps: closes this one

            idle = trio.CancelScope()  # one scope, its deadline moved per frame
            try:
                with idle:
                    while True:
                        idle.deadline = trio.current_time() + (
                            limits.idle_timeout_s if conn.proven
                            else limits.first_frame_timeout_s)
                        msg = await framed.receive_opened(session)
                        if not conn.proven:
                            conn.proven = True
                            self.pre_auth.release(conn)
                        if msg is None:
                            break
                        rid, method, params = parse_request(msg)
                        if in_flight >= limits.max_in_flight:
                            raise RemoteProtocolError(
                                f"more than {limits.max_in_flight} requests in flight")
                        if self.sync_handler is None:
                            in_flight += 1
                            nursery.start_soon(run_one, rid, method, params)
                            continue
                        # Rule 2 with a synchronous handler: it cannot wait, and its
                        # answer goes out now unless the socket or another frame holds
                        # it back; then a task finishes it and the next request is read.
                        body = self._answer_now(session.peer_id, rid, method, params)
                        if not framed.send_sealed_nowait(session, body):
                            queue(len(body), framed.send_sealed, session, body)
                        elif framed.unsent:
                            queue(framed.unsent_bytes, framed.flush)
                        else:
                            continue
                        # An answer waits on the peer: let the rest of the node run before
                        # the next request (pipelined requests of a peer that does not
                        # read must not hold the node's loop, its pings included).
                        await trio.lowlevel.checkpoint()
                if idle.cancelled_caught:
                    timed_out = True
                    nursery.cancel_scope.cancel()
            except RemoteProtocolError as exc:
                fault.append(exc)
                nursery.cancel_scope.cancel()
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                log.debug("data-plane connection from %s ended: %r", session.peer_id, exc)
                nursery.cancel_scope.cancel()
        if fault:
            raise fault[0]
        if timed_out:
            raise trio.TooSlowError


async def serve_data_plane(*, host: str, port: int, server: DataPlaneServer | None = None,
                           identity: Identity | None = None, roster: Roster | None = None,
                           handler: Handler | None = None,
                           sync_handler: SyncHandler | None = None,
                           counters: Counters | None = None,
                           limits: Limits | None = None,
                           handshake_timeout_s: float | None = None,
                           max_in_flight: int | None = None,
                           congestion_control: str | None = None,
                           task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
                           ) -> None:
    """Serve authenticated RPCs until cancelled; ``task_status.started(bound_port)``.

    Pass a ready :class:`DataPlaneServer` (the node does, to rekey it later) or the
    pieces to build one (``handshake_timeout_s``/``max_in_flight`` override ``limits``).
    ``congestion_control`` is set on the listeners (accepted connections inherit it).
    """
    if server is None:
        if identity is None or roster is None or counters is None \
                or (handler is None and sync_handler is None):
            raise TypeError("serve_data_plane: pass server= or identity, roster, handler "
                            "(or sync_handler) and counters")
        changes: dict[str, Any] = {}
        if handshake_timeout_s is not None:
            changes["handshake_timeout_s"] = handshake_timeout_s
        if max_in_flight is not None:
            changes["max_in_flight"] = max_in_flight
        server = DataPlaneServer(identity=identity, roster=roster, handler=handler,
                                 sync_handler=sync_handler, counters=counters,
                                 limits=(limits or Limits()).override(changes))
    listeners = await trio.open_tcp_listeners(port, host=host)
    try:
        for listener in listeners:
            set_congestion_control(listener.socket, congestion_control)
        bound_port: int = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(server.accept_loop, listener, nursery)
            task_status.started(bound_port)
    finally:
        for listener in listeners:
            await trio.aclose_forcefully(listener)
