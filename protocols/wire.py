"""Frame codec: 4-byte big-endian length prefix + body, and msgpack bodies with limits.

Rules this module enforces:

1. A frame is ``len(body)`` as 4 bytes big endian, then the body. The length is
   checked against the cap *before* any body byte is buffered; a zero length or one
   above ``max_frame_bytes`` is the peer's fault (:class:`RemoteProtocolError`).
2. A decoder that raised once is broken for good: the stream is out of sync and the
   connection must be closed, never resynchronised.
3. msgpack bodies are decoded with a fresh ``unpackb`` per frame and hard limits on
   strings, binaries, arrays, maps and nesting; map keys must be ``str`` at every
   depth; extension types are refused. Whatever a peer sends, decoding either
   returns plain Python data (None, bool, int, float, str, bytes, list, dict) or
   raises :class:`RemoteProtocolError` - nothing else. Every object of a body counts
   (containers, keys and scalars) and a body of more than ``MAX_OBJECTS`` is refused;
   containers are counted while msgpack builds them, so a frame of a million empty
   maps is refused after ``MAX_OBJECTS`` of them, not after building them all.
4. Encoding our own objects that break the limits is *our* bug
   (:class:`LocalProtocolError`).

The module does no I/O except :func:`read_frame`, a thin helper over a trio
``ReceiveStream`` used by the (unauthenticated) control plane and by the transport.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import msgpack

from protocols.errors import LocalProtocolError, RemoteProtocolError

if TYPE_CHECKING:
    import trio

PREFIX_BYTES = 4
MAX_FRAME_BYTES = 1024 * 1024  # body cap; a 320 KiB artifact record fits with room to spare
MAX_STR_BYTES = 64 * 1024
MAX_ARRAY_ITEMS = 16 * 1024
MAX_MAP_ITEMS = 1024
MAX_DEPTH = 32
MAX_OBJECTS = 256 * 1024  # per body; the largest honest body holds about 37 Ki
RECEIVE_CHUNK_BYTES = 256 * 1024

_PLAIN_SCALARS = (type(None), bool, int, float, str, bytes)
_EXACT_SCALARS = frozenset(_PLAIN_SCALARS)


def encode_frame(body: bytes, *, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Prefix ``body`` with its length; refuses empty or oversize bodies (our bug)."""
    size = len(body)
    if not 0 < size <= max_frame_bytes:
        raise LocalProtocolError(f"frame body of {size} bytes outside 1..{max_frame_bytes}")
    return size.to_bytes(PREFIX_BYTES, "big") + body


class FrameDecoder:
    """Incremental, sans-I/O frame splitter (bytes in, complete bodies out)."""

    def __init__(self, *, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._ready: deque[bytes] = deque()
        self._broken: str | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes held that do not yet form a complete frame."""
        return len(self._buffer)

    @property
    def held_bytes(self) -> int:
        """Bytes held in all: the partial frame and complete frames not yet taken."""
        return len(self._buffer) + sum(len(body) for body in self._ready)

    def wanted_bytes(self) -> int:
        """Bytes still missing to complete the next frame (the prefix first).

        Reading no more than this (``read_frame(..., exact=True)``) keeps at most one
        frame of at most ``max_frame_bytes`` buffered: what a connection holds before
        it is authenticated.
        """
        buf = self._buffer
        if len(buf) < PREFIX_BYTES:
            return PREFIX_BYTES - len(buf)
        size = int.from_bytes(buf[:PREFIX_BYTES], "big")
        return max(1, PREFIX_BYTES + min(size, self.max_frame_bytes) - len(buf))

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add ``data``; return the bodies of the frames it completed."""
        self._check_usable()
        if not self._buffer and len(data) > PREFIX_BYTES:  # the usual case: one whole frame
            size = int.from_bytes(data[:PREFIX_BYTES], "big")
            if len(data) == PREFIX_BYTES + size and size <= self.max_frame_bytes:
                return [bytes(data[PREFIX_BYTES:])]
        self._buffer += data
        bodies: list[bytes] = []
        buf = self._buffer
        offset = 0
        while len(buf) - offset >= PREFIX_BYTES:
            size = int.from_bytes(buf[offset:offset + PREFIX_BYTES], "big")
            if size == 0 or size > self.max_frame_bytes:
                self._broken = (f"frame length prefix {size} outside "
                                f"1..{self.max_frame_bytes}")
                self._buffer = bytearray()
                raise RemoteProtocolError(self._broken)
            end = offset + PREFIX_BYTES + size
            if len(buf) < end:
                break
            bodies.append(bytes(buf[offset + PREFIX_BYTES:end]))
            offset = end
        if offset:
            del buf[:offset]
        return bodies

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """h11-style: buffer ``data``; collect frames with :meth:`next_frame`."""
        self._ready.extend(self.feed(data))

    def next_frame(self) -> bytes | None:
        return self._ready.popleft() if self._ready else None

    def close(self) -> None:
        """The peer finished sending; a partial frame left over is a truncation."""
        self._check_usable()
        if self._buffer:
            self._broken = f"stream ended inside a frame ({len(self._buffer)} bytes left)"
            raise RemoteProtocolError(self._broken)

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise RemoteProtocolError(f"frame decoder unusable after error: {self._broken}")


async def read_frame(stream: trio.abc.ReceiveStream, decoder: FrameDecoder, *,
                     exact: bool = False) -> bytes | None:
    """Return the next frame body from ``stream``, or None at a clean end of stream.

    Raises :class:`RemoteProtocolError` for a bad prefix or a stream that ends inside
    a frame. Bytes beyond the returned frame stay buffered in ``decoder``; with
    ``exact`` none are read (see :meth:`FrameDecoder.wanted_bytes`).
    """
    while True:
        body = decoder.next_frame()
        if body is not None:
            return body
        data = await stream.receive_some(
            decoder.wanted_bytes() if exact else RECEIVE_CHUNK_BYTES)
        if not data:
            decoder.close()
            return None
        decoder.receive_data(data)


def pack(obj: Any, *, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """msgpack-encode our own object (bin type for bytes); size-checked."""
    try:
        body = msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise LocalProtocolError(f"cannot encode body: {exc}") from None
    if len(body) > max_frame_bytes:
        raise LocalProtocolError(f"encoded body of {len(body)} bytes exceeds {max_frame_bytes}")
    return body


def unpack(body: bytes, *, max_frame_bytes: int = MAX_FRAME_BYTES,
           max_items: int | None = None) -> Any:
    """Decode a peer's msgpack body under hard limits (see the rules above).
    ``max_items``: the most entries of one map or array (None: the limits above)."""
    return unpack_counted(body, max_frame_bytes=max_frame_bytes, max_items=max_items)[0]


def unpack_counted(body: bytes, *, max_frame_bytes: int = MAX_FRAME_BYTES,
                   max_items: int | None = None) -> tuple[Any, int]:
    """:func:`unpack`, also returning how many objects the body held."""
    max_array = MAX_ARRAY_ITEMS if max_items is None else max_items
    max_map = MAX_MAP_ITEMS if max_items is None else max_items
    if len(body) > max_frame_bytes:
        raise RemoteProtocolError(f"body of {len(body)} bytes exceeds {max_frame_bytes}")
    if len(body) <= MAX_OBJECTS:
        # Every object takes at least one byte, so a body this small cannot hold more
        # than MAX_OBJECTS: nothing to stop while msgpack builds it (check_plain counts).
        try:
            obj = msgpack.unpackb(
                body, raw=False, strict_map_key=True, use_list=True,
                max_str_len=MAX_STR_BYTES, max_bin_len=max_frame_bytes,
                max_array_len=max_array, max_map_len=max_map, max_ext_len=0)
        except Exception as exc:  # as below
            raise RemoteProtocolError(f"malformed msgpack body: {type(exc).__name__}: "
                                      f"{exc}") from None
        return obj, check_plain(obj)
    containers = 0

    def count(container: Any) -> Any:
        nonlocal containers
        containers += 1
        if containers > MAX_OBJECTS:
            raise _TooManyObjects
        return container

    try:
        obj = msgpack.unpackb(
            body, raw=False, strict_map_key=True, use_list=True,
            max_str_len=MAX_STR_BYTES, max_bin_len=max_frame_bytes,
            max_array_len=max_array, max_map_len=max_map, max_ext_len=0,
            object_hook=count, list_hook=count,
        )
    except _TooManyObjects:
        raise RemoteProtocolError(f"body holds more than {MAX_OBJECTS} objects") from None
    except Exception as exc:  # msgpack raises many types for garbage; all are the peer's
        raise RemoteProtocolError(f"malformed msgpack body: {type(exc).__name__}: {exc}") \
            from None
    return obj, check_plain(obj)


class _TooManyObjects(Exception):
    pass


def check_plain(obj: Any) -> int:
    """Reject extension values, non-str map keys, nesting deeper than MAX_DEPTH and
    bodies of more than MAX_OBJECTS objects (every container, key and scalar)."""
    scalars = _EXACT_SCALARS  # what msgpack builds; subclasses take the long way below
    stack: list[tuple[Any, int]] = [(obj, 0)]
    seen = 0
    while stack:
        item, depth = stack.pop()
        seen += 1
        kind = type(item)
        if kind in scalars or isinstance(item, _PLAIN_SCALARS):
            continue
        if depth >= MAX_DEPTH:
            raise RemoteProtocolError(f"body nests deeper than {MAX_DEPTH} levels")
        if isinstance(item, list):
            for value in item:
                if type(value) in scalars:
                    seen += 1
                else:
                    stack.append((value, depth + 1))
        elif isinstance(item, dict):
            for key, value in item.items():
                if type(key) is not str and not isinstance(key, str):
                    raise RemoteProtocolError(
                        f"map key of type {type(key).__name__}; only str keys allowed")
                if type(value) in scalars:
                    seen += 2
                else:
                    seen += 1
                    stack.append((value, depth + 1))
        else:
            raise RemoteProtocolError(f"value of type {type(item).__name__} not allowed")
        if seen > MAX_OBJECTS:
            raise RemoteProtocolError(f"body holds more than {MAX_OBJECTS} objects")
    if seen > MAX_OBJECTS:
        raise RemoteProtocolError(f"body holds more than {MAX_OBJECTS} objects")
    return seen
