"""One inbound data-plane connection as the server tracks it (``nodes/server.py``): who
it is, whether it proved itself, and the bytes it holds (``nodes/holdings.py``)."""

from __future__ import annotations

import time

import trio


class InboundConn:
    """One inbound connection: its cancel scope, who it is, whether it proved itself."""

    __slots__ = ("answers", "detached", "faulted", "frames", "held_most", "opened", "peer",
                 "pre_auth", "proven", "scope", "source")

    def __init__(self, source: str = "?") -> None:
        self.scope = trio.CancelScope()
        self.peer: str | None = None
        self.source = source  # the peer's address
        self.proven = False  # an authenticated frame arrived
        self.opened = time.monotonic()
        self.pre_auth = 0  # bytes of a partial frame held before it proved itself
        self.answers = 0  # bytes of answers waiting on the peer to read them
        self.frames = 0  # bytes its decoder holds (partial and complete frames)
        self.held_most = 0  # the most it held of both at once
        self.faulted = False  # closed for the peer's fault
        self.detached = False  # being closed: its bytes no longer count (nodes/holdings.py)


def is_detached(conn: InboundConn) -> bool:
    return conn.detached


def peer_source(stream: trio.SocketStream) -> str:
    """The peer's address (what ``pre_auth_bytes_per_source`` groups by)."""
    try:
        return str(stream.socket.getpeername()[0])
    except OSError:  # already disconnected
        return "?"
