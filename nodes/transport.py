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
   handshake frames included, at the sender and at the receiver; the handshake frames
   a node sends are also counted on their own (``handshake_bytes_sent``), so traffic
   can be reported without them.
5. Client ``fresh``: one TCP connection + handshake per call, closed after the
   response. ``reuse``: one lazily opened connection per peer, requests multiplexed
   by id, a reader task per connection; no response caching; a broken connection is
   dropped from the pool and the next call opens a new one. ``reuse_warm``: ``reuse``
   whose pool the controller fills at setup (the ``warm`` control op opens one pooled
   connection to every other roster member), before anything is measured.
6. A frame is one write of prefix + body (when the socket buffer takes it) and the
   receiver reads only when the socket is readable; no byte of a frame changes for it.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from typing import Any, Literal, TypeGuard, get_args

import trio

from protocols import wire
from protocols.auth import TAG_BYTES, Session
from protocols.errors import (
    RemoteCallError,
    RemoteProtocolError,
)

log = logging.getLogger("nodes.transport")

Handler = Callable[[str, str, dict[str, Any]], Awaitable[Any]]
#: A handler that answers without awaiting (the node's): the server runs it inline.
SyncHandler = Callable[[str, str, dict[str, Any]], Any]
Connection = Literal["fresh", "reuse", "reuse_warm"]
#: The connection settings, in order: the values of :data:`Connection` (one list).
CONNECTION_SETTINGS: tuple[Connection, ...] = get_args(Connection)
#: Settings that keep a pool of connections (rule 5).
POOLED_CONNECTIONS: frozenset[str] = frozenset({"reuse", "reuse_warm"})


def is_connection(value: object) -> TypeGuard[Connection]:
    """Whether VALUE is a connection setting (narrows it to :data:`Connection`)."""
    return value in CONNECTION_SETTINGS

HANDSHAKE_TIMEOUT_S = 10.0  # the default of nodes.limits.Limits.handshake_timeout_s
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
    handshake_bytes_sent: int = 0
    connections_opened: int = 0
    connections_accepted: int = 0
    rejected: int = 0
    refused: int = 0  # inbound connections refused or evicted by the connection caps
    rpc_timeouts: int = 0  # calls of this node's client that got no answer in time
    equivocations: int = 0  # requests refused as an owner's equivocation (protocols.heads)
    # High-water marks against nodes.limits (what an honest campaign needs):
    peak_connections: int = 0  # inbound connections open at once
    peak_peer_connections: int = 0  # ... from one peer
    peak_frame_objects: int = 0  # objects in one received body
    peak_install_records: int = 0  # records one peer installed here this episode
    peak_install_bytes: int = 0  # ... their content bytes
    peak_pre_auth_bytes: int = 0  # partial frames held for not yet proven connections of one source
    peak_answer_bytes: int = 0  # answers waiting on one connection's peer to read them
    peak_peer_answer_bytes: int = 0  # ... on all connections of one peer
    peak_node_held_bytes: int = 0  # received frames and answers held for all peers at once

    def snapshot(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)


class FramedStream:
    """A TCP stream speaking length-prefixed frames, counting them, one sender at a time.

    Until :meth:`authenticated` it accepts frames of at most ``pre_auth_max_bytes``
    and reads no byte beyond the frame being received (rule 6 of ``protocols.auth``).
    While :attr:`on_buffered` is set (the server sets it for its connections), it is
    called after every read with the bytes the decoder holds (partial and complete
    frames not yet taken), and may raise to close the connection
    (``pre_auth_bytes_per_source``, ``held_bytes_per_node``).

    Reads land in one receive buffer per thread and the decoder copies out what it
    keeps, so a read allocates nothing of its own (a fresh 256 KiB object per read would
    leave the allocator holding memory after a flood of partial frames).

    The frame path talks to the socket's descriptor directly (rule 6 of this module):
    a send writes the whole frame with one ``write`` when the socket takes it (no
    scheduler round trip), a receive waits for readability and then reads once (no
    ``recv`` that fails with EAGAIN first). Errors are translated as trio's
    ``SocketStream`` does (a closed socket: ``ClosedResourceError``; any other OSError:
    ``BrokenResourceError``).
    """

    def __init__(self, stream: trio.SocketStream, counters: Counters, *,
                 pre_auth_max_bytes: int = wire.MAX_FRAME_BYTES) -> None:
        self.stream = stream
        self._counters = counters
        self._decoder = wire.FrameDecoder(max_frame_bytes=pre_auth_max_bytes)
        self._exact = True
        # A semaphore, not a Lock: a frame started inline by one task may be finished
        # by another (:meth:`send_sealed_nowait`, :meth:`flush`).
        self._send_lock = trio.Semaphore(1, max_value=1)
        self._unsent: memoryview | None = None  # rest of a frame started inline
        self._torn = False  # a send was interrupted mid-frame: the stream is unusable
        self.on_buffered: Callable[[int], None] | None = None

    def authenticated(self) -> None:
        """The handshake is done: full-size frames, large reads from now on."""
        self._decoder.max_frame_bytes = wire.MAX_FRAME_BYTES
        self._exact = False

    @property
    def buffered_bytes(self) -> int:
        return self._decoder.buffered_bytes

    @property
    def torn(self) -> bool:
        return self._torn

    def _fd(self) -> int:
        fd: int = self.stream.socket.fileno()
        if fd == -1:
            raise trio.ClosedResourceError("this socket was already closed")
        return fd

    def _write_some(self, view: memoryview) -> int:
        try:
            return os.write(self._fd(), view)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise _stream_error(exc) from exc

    async def _write_all(self, data: bytes | memoryview) -> None:
        with memoryview(data) as view:
            sent = self._write_some(view)
            while sent < len(view):
                await trio.lowlevel.wait_writable(self.stream.socket)
                sent += self._write_some(view[sent:])

    async def _read_into(self, view: memoryview) -> int:
        sock = self.stream.socket
        while True:
            self._fd()
            await trio.lowlevel.wait_readable(sock)
            try:
                return os.readv(self._fd(), (view,))
            except BlockingIOError:
                continue
            except OSError as exc:
                raise _stream_error(exc) from exc

    async def _send_frame(self, frame: bytes) -> None:
        if self._torn:
            raise trio.ClosedResourceError("an earlier send was interrupted mid-frame")
        # Count before writing: once the bytes are in the kernel the peer may count them
        # and a counters snapshot may run before this task resumes.
        self._counters.bytes_sent += len(frame)
        self._counters.frames_sent += 1
        self._torn = True
        await self._write_all(frame)
        self._torn = False

    async def _acquire_send(self) -> None:
        # A cancelled task sends nothing (as ``async with lock`` would); an uncontended
        # lock costs no scheduler round trip.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._send_lock.acquire_nowait()
        except trio.WouldBlock:
            await self._send_lock.acquire()

    async def send_body(self, body: bytes) -> None:
        """Send an unsealed frame: only the channel handshake sends these."""
        await self._acquire_send()
        try:
            frame = wire.encode_frame(body)
            self._counters.handshake_bytes_sent += len(frame)
            await self._send_frame(frame)
        finally:
            self._send_lock.release()

    async def send_sealed(self, session: Session, body: bytes) -> None:
        """Encrypt and send under one lock, so nonces go out in counter order."""
        await self._acquire_send()
        try:
            await self._send_frame(wire.encode_frame(session.encrypt(body)))
        finally:
            self._send_lock.release()

    def send_sealed_nowait(self, session: Session, body: bytes) -> bool:
        """:meth:`send_sealed` without waiting, if nobody else is sending: False if the
        lock is taken (nothing was done). True: the frame was sealed and written as far
        as the socket took it; if :attr:`unsent`, the caller must ``await flush()``."""
        try:
            self._send_lock.acquire_nowait()
        except trio.WouldBlock:
            return False
        try:
            if self._torn:
                raise trio.ClosedResourceError("an earlier send was interrupted mid-frame")
            frame = wire.encode_frame(session.encrypt(body))
            self._counters.bytes_sent += len(frame)
            self._counters.frames_sent += 1
            self._torn = True
            view = memoryview(frame)
            sent = self._write_some(view)
        except BaseException:
            self._send_lock.release()
            raise
        if sent < len(view):
            self._unsent = view[sent:]  # the lock stays taken until flush() ends
        else:
            self._torn = False
            self._send_lock.release()
        return True

    @property
    def unsent(self) -> bool:
        return self._unsent is not None

    @property
    def unsent_bytes(self) -> int:
        return 0 if self._unsent is None else len(self._unsent)

    async def flush(self) -> None:
        """Finish the frame :meth:`send_sealed_nowait` started, then release the lock."""
        rest, self._unsent = self._unsent, None
        try:
            if rest is not None:
                await self._write_all(rest)
                self._torn = False
        finally:
            self._send_lock.release()

    async def receive_body(self) -> bytes | None:
        decoder = self._decoder
        if self.on_buffered is not None:  # the frame taken before is handled: let it go
            self.on_buffered(decoder.held_bytes)
        while True:
            body = decoder.next_frame()
            if body is not None:
                break
            buffer = _receive_buffer()
            if self._exact:
                buffer = buffer[:decoder.wanted_bytes()]
            # No await between the read and the copy: the buffer is this task's meanwhile.
            received = await self._read_into(buffer)
            if not received:
                decoder.close()
                return None
            decoder.receive_data(buffer[:received])
            if self.on_buffered is not None:
                self.on_buffered(decoder.held_bytes)
        self._counters.bytes_received += wire.PREFIX_BYTES + len(body)
        self._counters.frames_received += 1
        return body

    async def receive_opened(self, session: Session) -> Any | None:
        """Next frame, authenticated and decoded; None at a clean end of stream."""
        body = await self.receive_body()
        if body is None:
            return None
        obj, objects = wire.unpack_counted(session.decrypt(body))
        if objects > self._counters.peak_frame_objects:
            self._counters.peak_frame_objects = objects
        return obj

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


_thread_state = threading.local()


def _receive_buffer() -> memoryview:
    """This thread's receive buffer (``RECEIVE_CHUNK_BYTES``), made once."""
    view: memoryview | None = getattr(_thread_state, "receive_buffer", None)
    if view is None:
        view = memoryview(bytearray(wire.RECEIVE_CHUNK_BYTES))
        _thread_state.receive_buffer = view
    return view


def _stream_error(exc: OSError) -> trio.ClosedResourceError | trio.BrokenResourceError:
    """trio's translation of a socket error into a stream error."""
    if exc.errno in (errno.EBADF, errno.ENOTSOCK):
        return trio.ClosedResourceError("this socket was already closed")
    return trio.BrokenResourceError(f"socket connection broken: {exc}")


def set_nodelay(stream: trio.SocketStream) -> None:
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)


def set_congestion_control(sock: Any, name: str | None) -> None:
    """Use congestion control NAME on SOCK (None: the namespace's default). A node in a
    rootless run sets it per socket: its namespaces cannot default to a restricted
    algorithm (testbed/host/userns.py, rule 4)."""
    if name is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())


async def open_tcp(host: str, port: int, *, congestion_control: str | None = None,
                   ) -> trio.SocketStream:
    """Connect; an IP literal skips the resolver and happy-eyeballs machinery (fresh
    connections are on the measured path)."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 \
            else socket.AF_INET
    except ValueError:
        stream = await trio.open_tcp_stream(host, port)
        set_congestion_control(stream.socket, congestion_control)
        return stream
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        set_congestion_control(sock, congestion_control)
        await sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


def is_request_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) \
        and 0 <= value <= MAX_REQUEST_ID


def parse_request(msg: Any) -> tuple[int, str, dict[str, Any]]:
    if not (isinstance(msg, dict) and set(msg) == {"i", "m", "p"}):
        raise RemoteProtocolError("request must be a map with exactly i, m, p")
    rid, method, params = msg["i"], msg["m"], msg["p"]
    if not is_request_id(rid):
        raise RemoteProtocolError("request id must be a non-negative 63-bit integer")
    if not isinstance(method, str) or not isinstance(params, dict):
        raise RemoteProtocolError("request method must be a string and params a map")
    return rid, method, params


def pack_body(obj: Any) -> bytes:
    """msgpack-encode one of our bodies; sized so that its sealed frame fits."""
    return wire.pack(obj, max_frame_bytes=MAX_BODY_BYTES)


def error_body(rid: int, code: str, message: str) -> bytes:
    return pack_body({"i": rid, "e": {"code": code[:MAX_ERROR_CHARS],
                                  "msg": message[:MAX_ERROR_CHARS]}})



def unwrap_response(msg: Any) -> tuple[int, Any, RemoteCallError | None]:
    if not isinstance(msg, dict) or not is_request_id(msg.get("i")):
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
