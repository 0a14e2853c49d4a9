"""Control plane: a Unix socket on which the controller drives the node.

Frames are ``protocols.wire`` frames (4-byte length + msgpack), unauthenticated and
never counted as traffic. A request is ``{"op": str, ...args}``; the reply is
``{"ok": true, ...}`` or ``{"ok": false, "error": str}``. One request is outstanding
per connection. A malformed frame closes that control connection only.

Ops are async methods ``op_<name>(args) -> dict`` of the object passed to
:func:`serve_control`; an op signals bad user input by raising :class:`ControlError`
(or ``ValueError``/``LocalProtocolError``), whose one-line message names the field.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket as stdlib_socket
import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from protocols.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from protocols.wire import FrameDecoder, encode_frame, pack, read_frame, unpack

log = logging.getLogger("nodes.control")

CONTROL_MAX_FRAME_BYTES = 8 * 1024 * 1024
OpHandler = Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]]


class ControlError(ProtocolError):
    """The controller sent an op this node cannot perform as asked (bad user input)."""


def encode_control(obj: Mapping[str, Any]) -> bytes:
    return encode_frame(pack(dict(obj), max_frame_bytes=CONTROL_MAX_FRAME_BYTES),
                        max_frame_bytes=CONTROL_MAX_FRAME_BYTES)


def decode_control(body: bytes) -> dict[str, Any]:
    obj = unpack(body, max_frame_bytes=CONTROL_MAX_FRAME_BYTES)
    if not isinstance(obj, dict):
        raise RemoteProtocolError("control message is not a map")
    return obj


def new_decoder() -> FrameDecoder:
    return FrameDecoder(max_frame_bytes=CONTROL_MAX_FRAME_BYTES)


def field(args: Mapping[str, Any], name: str, kind: type | tuple[type, ...],
          *, allowed: Any = None, default: Any = ...) -> Any:
    """Read one op argument or raise a one-line ControlError naming it."""
    if name not in args:
        if default is not ...:
            return default
        raise ControlError(f"{name}: missing")
    value = args[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ControlError(f"{name}: expected {names}, got {type(value).__name__}")
    if allowed is not None and value not in allowed:
        raise ControlError(f"{name}: {value!r} not one of {', '.join(map(str, allowed))}")
    return value


async def _serve_connection(stream: trio.SocketStream, ops: object) -> None:
    decoder = new_decoder()
    async with stream:
        while True:
            try:
                body = await read_frame(stream, decoder)
                if body is None:
                    return
                request = decode_control(body)
            except RemoteProtocolError as exc:
                log.warning("control connection closed: %s", exc)
                return
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            reply = await dispatch(ops, request)
            try:
                await stream.send_all(encode_control(reply))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if request.get("op") == "shutdown" and reply.get("ok"):
                hook = getattr(ops, "shutdown_replied", None)
                if hook is not None:
                    hook()
                return


async def dispatch(ops: object, request: Mapping[str, Any]) -> dict[str, Any]:
    """Run one op; bad user input and local errors become ``{"ok": false}`` replies."""
    name = request.get("op")
    handler = getattr(ops, f"op_{name}", None) if isinstance(name, str) else None
    if handler is None:
        return {"ok": False, "error": f"op: unknown {name!r}"}
    try:
        result: dict[str, Any] = await handler(request)
    except (ControlError, ValueError, LocalProtocolError) as exc:
        return {"ok": False, "error": str(exc)}
    except sqlite3.Error as exc:  # the node's own store failed (e.g. a full disk)
        log.error("op %s: store failed: %s: %s", name, type(exc).__name__, exc)
        return {"ok": False, "error": f"store_failed: {type(exc).__name__}: {exc}"}
    except ProtocolError as exc:  # e.g. an RPC failure inside update/plan: say which
        log.warning("op %s failed: %s: %s", name, type(exc).__name__, exc)
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    except Exception as exc:  # a bug (ours or a policy's): report it, keep the node up
        log.exception("op %s crashed", name)
        return {"ok": False, "error": f"internal: {type(exc).__name__}: {exc}"}
    return {"ok": True, **result}


async def serve_control(path: str, ops: object, *,
                        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Listen on the Unix socket ``path`` (removed again on exit) and serve ``ops``."""
    sock = trio.socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a stale socket from a killed run
        await sock.bind(path)
        sock.listen(16)
        listener = trio.SocketListener(sock)
    except BaseException:
        sock.close()
        raise
    try:
        async with trio.open_nursery() as nursery:
            task_status.started()
            async with listener:
                while True:
                    stream = await listener.accept()
                    nursery.start_soon(_serve_connection, stream, ops)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class ControlClient:
    """One control connection (the controller side); one request at a time."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._decoder = new_decoder()
        self._lock = trio.Lock()

    @classmethod
    async def connect(cls, path: str) -> ControlClient:
        return cls(await trio.open_unix_socket(path))

    async def request(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one op and return the raw reply map (``ok`` included)."""
        async with self._lock:
            await self._stream.send_all(encode_control({"op": op, **args}))
            body = await read_frame(self._stream, self._decoder)
            if body is None:
                raise trio.BrokenResourceError("node closed the control connection")
            return decode_control(body)

    async def aclose(self) -> None:
        await self._stream.aclose()
