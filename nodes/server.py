"""Data-plane server: accept connections, run the responder handshake, serve requests.

Rules 1-4 of ``nodes/transport.py`` apply; this module is the server side of them.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from nodes.transport import (
    HANDSHAKE_TIMEOUT_S,
    MAX_IN_FLIGHT_PER_CONNECTION,
    Counters,
    FramedStream,
    Handler,
    error_body,
    pack_body,
    parse_request,
    set_congestion_control,
    set_nodelay,
)
from protocols.auth import ChannelResponder, Session
from protocols.errors import RemoteCallError, RemoteProtocolError
from protocols.identity import Identity, Roster

log = logging.getLogger("nodes.transport.server")


async def serve_data_plane(*, identity: Identity, roster: Roster, host: str, port: int,
                           handler: Handler, counters: Counters,
                           handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
                           max_in_flight: int = MAX_IN_FLIGHT_PER_CONNECTION,
                           congestion_control: str | None = None,
                           task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
                           ) -> None:
    """Serve authenticated RPCs until cancelled; ``task_status.started(bound_port)``.

    A peer that has not finished its handshake after ``handshake_timeout_s``, or that
    keeps more than ``max_in_flight`` requests unanswered on one connection, is cut off.
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    try:
        for listener in listeners:  # accepted connections inherit it
            set_congestion_control(listener.socket, congestion_control)
        bound_port: int = listeners[0].socket.getsockname()[1]
        server = _Server(identity, roster, handler, counters, handshake_timeout_s,
                         max_in_flight)
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(server.accept_loop, listener, nursery)
            task_status.started(bound_port)
    finally:
        for listener in listeners:
            await trio.aclose_forcefully(listener)


class _Server:
    def __init__(self, identity: Identity, roster: Roster, handler: Handler,
                 counters: Counters, handshake_timeout_s: float, max_in_flight: int) -> None:
        self.identity = identity
        self.roster = roster
        self.handler = handler
        self.counters = counters
        self.handshake_timeout_s = handshake_timeout_s
        self.max_in_flight = max_in_flight

    async def accept_loop(self, listener: trio.SocketListener,
                          nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # e.g. EMFILE: keep serving the connections we have
                log.error("accept failed: %s (errno %s)", exc, exc.errno)
                await trio.sleep(0.01)
                continue
            self.counters.connections_accepted += 1
            nursery.start_soon(self.serve_connection, stream)

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        framed = FramedStream(stream, self.counters)
        peer = "?"
        try:
            set_nodelay(stream)
            with trio.fail_after(self.handshake_timeout_s):
                first = await framed.receive_body()
                if first is None:
                    return
                responder = ChannelResponder(identity=self.identity, roster=self.roster)
                try:
                    reply, session = responder.respond(first)
                finally:
                    peer = responder.peer_id or "?"
                await framed.send_body(reply)
            await self._serve_requests(framed, session)
        except RemoteProtocolError as exc:
            self.counters.rejected += 1
            log.warning("closing data-plane connection from %s: %s", peer, exc)
        except trio.TooSlowError:
            self.counters.rejected += 1
            log.warning("closing data-plane connection from %s: handshake timed out", peer)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.debug("data-plane connection from %s ended: %r", peer, exc)
        finally:
            await framed.aclose()

    async def _serve_requests(self, framed: FramedStream, session: Session) -> None:
        fault: list[RemoteProtocolError] = []
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
                    await framed.send_sealed(session, body)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    nursery.cancel_scope.cancel()

            try:
                while True:
                    msg = await framed.receive_opened(session)
                    if msg is None:
                        break
                    request = parse_request(msg)
                    if in_flight >= self.max_in_flight:
                        raise RemoteProtocolError(
                            f"more than {self.max_in_flight} requests in flight")
                    in_flight += 1
                    nursery.start_soon(run_one, *request)
            except RemoteProtocolError as exc:
                fault.append(exc)
                nursery.cancel_scope.cancel()
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                log.debug("data-plane connection from %s ended: %r", session.peer_id, exc)
                nursery.cancel_scope.cancel()
        if fault:
            raise fault[0]
