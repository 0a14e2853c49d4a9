"""Data-plane transport: trio TCP streams <-> frames (protocols.wire) + channel (protocols.auth).

Rules this module enforces:

1. Every connection starts with the KK handshake (client = initiator, knows the
   server's pinned key; server = responder, accepts roster members only), then each
   frame body is one AEAD ciphertext of one msgpack body.
2. Requests are ``{"i": int, "m": str, "p": map}``; responses ``{"i", "r"}`` or
   ``{"i", "e": {"code", "msg"}}``. The server runs each request as its own task, so
   requests multiplexed on one connection never wait for each other.
3. Bad peer input (frame, MAC, replay, unknown peer, request/response shape, a
   handler raising RemoteProtocolError/IntegrityError) closes *that* connection with a
   logged reason and ``rejected += 1``; the node keeps serving everyone else.
4. Traffic counters count whole frames on the wire (4-byte prefix + ciphertext),
   handshake frames included, at the sender and at the receiver.
5. Client ``fresh``: one TCP connection + handshake per call, closed after the
   response. ``reuse``: one lazily opened connection per peer, requests multiplexed
   by id, a reader task per connection; no response caching; a broken connection is
   dropped from the pool and the next call opens a new one.
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import math
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from typing import Any, Literal

import trio

from protocols import wire
from protocols.auth import TAG_BYTES, ChannelInitiator, ChannelResponder, Session
from protocols.errors import (
    LocalProtocolError,
    PeerUnavailable,
    RemoteCallError,
    RemoteProtocolError,
    RpcTimeout,
)
from protocols.identity import Identity, Roster

log = logging.getLogger("nodes.transport")

Handler = Callable[[str, str, dict[str, Any]], Awaitable[Any]]
Connection = Literal["fresh", "reuse"]
CONNECTION_SETTINGS: tuple[str, ...] = ("fresh", "reuse")
HANDSHAKE_TIMEOUT_S = 10.0
MAX_IN_FLIGHT_PER_CONNECTION = 4096  # per-key validation of 128 keys needs 128
MAX_REQUEST_ID = 2**63 - 1
MAX_ERROR_CHARS = 1000
MAX_BODY_BYTES = wire.MAX_FRAME_BYTES - TAG_BYTES  # plaintext cap so a sealed frame fits


@dataclass
class Counters:
    """Per-node data-plane counters (see rule 4)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    frames_sent: int = 0
    frames_received: int = 0
    connections_opened: int = 0
    connections_accepted: int = 0
    rejected: int = 0

    def snapshot(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)


class _FramedStream:
    """A TCP stream speaking length-prefixed frames, counting them, one sender at a time."""

    def __init__(self, stream: trio.SocketStream, counters: Counters) -> None:
        self.stream = stream
        self._counters = counters
        self._decoder = wire.FrameDecoder()
        self._send_lock = trio.Lock()
        self._torn = False  # a send was interrupted mid-frame: the stream is unusable

    @property
    def torn(self) -> bool:
        return self._torn

    async def _send_frame(self, frame: bytes) -> None:
        if self._torn:
            raise trio.ClosedResourceError("an earlier send was interrupted mid-frame")
        # Count before writing: once the bytes are in the kernel the peer may count them
        # and a counters snapshot may run before this task resumes.
        self._counters.bytes_sent += len(frame)
        self._counters.frames_sent += 1
        self._torn = True
        await self.stream.send_all(frame)
        self._torn = False

    async def send_body(self, body: bytes) -> None:
        async with self._send_lock:
            await self._send_frame(wire.encode_frame(body))

    async def send_sealed(self, session: Session, body: bytes) -> None:
        """Encrypt and send under one lock, so nonces go out in counter order."""
        async with self._send_lock:
            await self._send_frame(wire.encode_frame(session.encrypt(body)))

    async def receive_body(self) -> bytes | None:
        body = await wire.read_frame(self.stream, self._decoder)
        if body is not None:
            self._counters.bytes_received += wire.PREFIX_BYTES + len(body)
            self._counters.frames_received += 1
        return body

    async def receive_opened(self, session: Session) -> Any | None:
        """Next frame, authenticated and decoded; None at a clean end of stream."""
        body = await self.receive_body()
        if body is None:
            return None
        return wire.unpack(session.decrypt(body))

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


def _set_nodelay(stream: trio.SocketStream) -> None:
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)


async def _open_tcp(host: str, port: int) -> trio.SocketStream:
    """Connect; an IP literal skips the resolver and happy-eyeballs machinery (fresh
    connections are on the measured path)."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 \
            else socket.AF_INET
    except ValueError:
        return await trio.open_tcp_stream(host, port)
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        await sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


def _is_request_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) \
        and 0 <= value <= MAX_REQUEST_ID


def _parse_request(msg: Any) -> tuple[int, str, dict[str, Any]]:
    if not (isinstance(msg, dict) and set(msg) == {"i", "m", "p"}):
        raise RemoteProtocolError("request must be a map with exactly i, m, p")
    rid, method, params = msg["i"], msg["m"], msg["p"]
    if not _is_request_id(rid):
        raise RemoteProtocolError("request id must be a non-negative 63-bit integer")
    if not isinstance(method, str) or not isinstance(params, dict):
        raise RemoteProtocolError("request method must be a string and params a map")
    return rid, method, params


def _pack(obj: Any) -> bytes:
    return wire.pack(obj, max_frame_bytes=MAX_BODY_BYTES)


def _error_body(rid: int, code: str, message: str) -> bytes:
    return _pack({"i": rid, "e": {"code": code[:MAX_ERROR_CHARS],
                                  "msg": message[:MAX_ERROR_CHARS]}})


# --- server ---------------------------------------------------------------------------------

async def serve_data_plane(*, identity: Identity, roster: Roster, host: str, port: int,
                           handler: Handler, counters: Counters,
                           handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
                           max_in_flight: int = MAX_IN_FLIGHT_PER_CONNECTION,
                           task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
                           ) -> None:
    """Serve authenticated RPCs until cancelled; ``task_status.started(bound_port)``.

    A peer that has not finished its handshake after ``handshake_timeout_s``, or that
    keeps more than ``max_in_flight`` requests unanswered on one connection, is cut off.
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    try:
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
        framed = _FramedStream(stream, self.counters)
        peer = "?"
        try:
            _set_nodelay(stream)
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

    async def _serve_requests(self, framed: _FramedStream, session: Session) -> None:
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
                    body = _pack({"i": rid, "r": result})
                except RemoteCallError as exc:
                    body = _error_body(rid, exc.code, exc.message)
                except RemoteProtocolError as exc:
                    fault.append(exc)
                    nursery.cancel_scope.cancel()
                    return
                except Exception as exc:  # our handler's bug: answer, log, keep serving
                    log.exception("handler for %r from %s failed", method, session.peer_id)
                    body = _error_body(rid, "internal", f"{type(exc).__name__}: {exc}")
                try:
                    await framed.send_sealed(session, body)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    nursery.cancel_scope.cancel()

            try:
                while True:
                    msg = await framed.receive_opened(session)
                    if msg is None:
                        break
                    request = _parse_request(msg)
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


# --- client ---------------------------------------------------------------------------------

class _Pending:
    """A request waiting for its response on a pooled connection."""

    __slots__ = ("error", "event", "result")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.result: Any = None
        self.error: BaseException | None = None


def _unwrap_response(msg: Any) -> tuple[int, Any, RemoteCallError | None]:
    if not isinstance(msg, dict) or not _is_request_id(msg.get("i")):
        raise RemoteProtocolError("response must be a map with a request id")
    keys = set(msg)
    if keys == {"i", "r"}:
        return msg["i"], msg["r"], None
    if keys == {"i", "e"}:
        err = msg["e"]
        if not (isinstance(err, dict) and isinstance(err.get("code"), str)
                and isinstance(err.get("msg"), str)):
            raise RemoteProtocolError("error response must carry code and msg strings")
        return msg["i"], None, RemoteCallError(err["code"], err["msg"])
    raise RemoteProtocolError("response must have exactly i and one of r, e")


class _PooledConnection:
    def __init__(self, peer_id: str, framed: _FramedStream, session: Session,
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
                    rid, result, call_error = _unwrap_response(msg)
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
            body = _pack({"i": rid, "m": method, "p": params})
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
                 counters: Counters, timeout_s: float, nursery: trio.Nursery) -> None:
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
        try:
            with trio.fail_after(self.timeout_s):
                if self.connection == "fresh":
                    return await self._call_fresh(peer_id, method, params)
                return await self._call_reuse(peer_id, method, params)
        except trio.TooSlowError:
            raise RpcTimeout(f"{method} to {peer_id}: no answer within "
                             f"{self.timeout_s} s") from None

    async def close_pooled(self) -> None:
        """Close every pooled connection (between episodes)."""
        pool, self._pool = self._pool, {}
        for conn in pool.values():
            conn.fail(PeerUnavailable(f"connection to {conn.peer_id} closed locally"))
            await conn.framed.aclose()

    async def _connect(self, peer_id: str) -> tuple[_FramedStream, Session]:
        member = self.roster.members[peer_id]
        try:
            stream = await _open_tcp(member.host, member.port)
        except OSError as exc:
            raise PeerUnavailable(f"cannot connect to {peer_id} at "
                                  f"{member.host}:{member.port}: {exc}") from None
        self.counters.connections_opened += 1
        framed = _FramedStream(stream, self.counters)
        try:
            _set_nodelay(stream)
            initiator = ChannelInitiator(identity=self.identity, roster=self.roster,
                                         peer_id=peer_id)
            await framed.send_body(initiator.start())
            reply = await framed.receive_body()
            if reply is None:
                raise PeerUnavailable(f"{peer_id} closed the connection during the handshake")
            session = initiator.finish(reply)
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
        body = _pack({"i": 1, "m": method, "p": params})
        framed, session = await self._connect(peer_id)
        try:
            await framed.send_sealed(session, body)
            msg = await framed.receive_opened(session)
            if msg is None:
                raise PeerUnavailable(f"{peer_id} closed the connection before answering")
            rid, result, call_error = _unwrap_response(msg)
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

    async def _call_reuse(self, peer_id: str, method: str, params: dict[str, Any]) -> Any:
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
        return await conn.call(method, params)

    def _drop(self, conn: _PooledConnection) -> None:
        if self._pool.get(conn.peer_id) is conn:
            del self._pool[conn.peer_id]


@asynccontextmanager
async def open_rpc_client(*, identity: Identity, roster: Roster, connection: Connection,
                          counters: Counters, timeout_s: float = 10.0,
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
                           counters=counters, timeout_s=float(timeout_s), nursery=nursery)
        try:
            yield client
        finally:
            with trio.CancelScope(shield=True):
                await client.close_pooled()
            nursery.cancel_scope.cancel()
