"""A request/response probe inside agent namespaces, for link benchmarks and tests.

The probe sockets are created inside the namespaces (a socket keeps the namespace it was
born in). The probe uses plain blocking sockets on threads: each wake-up is one syscall
return, so the probe adds as little as it can to what it measures (a trio loop costs
~0.1 ms more per round trip). Ping-pong traffic never has client and server threads
runnable at once, so they do not fight over the GIL.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import trio

from testbed.host.kernel import socket_in_netns
from testbed.net.plan import Host

ECHO_PORT = 9100
HEADER = struct.Struct(">II")  # request length, reply length



def _recv_exactly(sock: socket.socket, n: int) -> None:
    left = n
    while left:
        chunk = sock.recv(min(1 << 20, left))
        if not chunk:
            raise ConnectionError(f"peer closed after {n - left} of {n} bytes")
        left -= len(chunk)


class EchoServer:
    """Request/response server inside a host's namespace: a request's 8-byte header says
    its own length and the length of the reply to send."""

    def __init__(self, host: Host, port: int = ECHO_PORT) -> None:
        self.host = host
        self.port = port
        self._listener = socket_in_netns(host.netns)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host.address, port))
        self._listener.listen(64)
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._acceptor = self._spawn(self._accept_loop)

    def _spawn(self, target: Any, *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()
        return thread

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # shut down
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.append(conn)
            self._spawn(self._serve, conn)

    @staticmethod
    def _serve(conn: socket.socket) -> None:
        try:
            while True:
                head = conn.recv(HEADER.size, socket.MSG_WAITALL)
                if len(head) < HEADER.size:
                    return
                req_len, reply_len = HEADER.unpack(head)
                _recv_exactly(conn, req_len - HEADER.size)
                conn.sendall(bytes(reply_len))
        except OSError:
            return

    def close(self) -> None:
        """Stop every thread through the sockets it waits on (a shut-down socket wakes
        its accept or recv), wait for each to end, and only then close the sockets: a
        socket closed under a thread that still runs gives its number to the next
        descriptor opened, which the thread would then read."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._acceptor.join()  # no connection comes in after this
        with self._lock:
            conns, threads = list(self._conns), list(self._threads)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join()
        self._listener.close()
        for conn in conns:
            conn.close()


@contextlib.asynccontextmanager
async def open_echo_server(host: Host, port: int = ECHO_PORT) -> AsyncIterator[EchoServer]:
    server = await trio.to_thread.run_sync(EchoServer, host, port)
    try:
        yield server
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(server.close)


def exchange(sock: socket.socket, request_bytes: int, reply_bytes: int) -> None:
    """One request of REQUEST_BYTES and its reply of REPLY_BYTES on a connected socket."""
    if request_bytes < HEADER.size:
        raise ValueError(f"request_bytes: at least {HEADER.size}, got {request_bytes}")
    sock.sendall(HEADER.pack(request_bytes, reply_bytes) + bytes(request_bytes - HEADER.size))
    _recv_exactly(sock, reply_bytes)


def _client(host: Host) -> socket.socket:
    sock = socket_in_netns(host.netns)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _timed_exchanges(
    client: Host, server: Host, request_bytes: int, reply_bytes: int, count: int,
    fresh: bool, port: int, max_s: float | None, origin_s: float | None,
) -> tuple[list[float], list[float]]:
    starts: list[float] = []
    durations: list[float] = []
    t0 = time.monotonic()
    origin = t0 if origin_s is None else origin_s
    persistent: socket.socket | None = None
    try:
        if not fresh:
            persistent = _client(client)
            persistent.connect((server.address, port))
        for _ in range(count):
            if max_s is not None and durations and time.monotonic() - t0 > max_s:
                break
            sock = persistent if persistent is not None else _client(client)
            try:
                start = time.monotonic()
                if persistent is None:
                    sock.connect((server.address, port))
                exchange(sock, request_bytes, reply_bytes)
                durations.append((time.monotonic() - start) * 1000.0)
                starts.append(start - origin)
            finally:
                if persistent is None:
                    sock.close()
    finally:
        if persistent is not None:
            persistent.close()
    return starts, durations


async def timed_exchanges(
    client: Host,
    server: Host,
    request_bytes: int,
    reply_bytes: int,
    *,
    count: int,
    fresh: bool,
    port: int = ECHO_PORT,
    max_s: float | None = None,
    origin_s: float | None = None,
) -> tuple[list[float], list[float]]:
    """COUNT exchanges from CLIENT to the echo server on SERVER; (starts s, durations ms).

    Starts are seconds since ORIGIN_S (a time.monotonic() value; default: the call).
    fresh: connect + exchange + close each time (socket creation is not timed);
    otherwise one connection, opened before timing, carries every exchange. Stops early
    once MAX_S have passed. Runs on a worker thread.
    """
    return await trio.to_thread.run_sync(
        partial(_timed_exchanges, client, server, request_bytes, reply_bytes, count,
                fresh, port, max_s, origin_s)
    )
