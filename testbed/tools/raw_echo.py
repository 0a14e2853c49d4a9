"""The floor under every loopback RPC: a raw TCP echo between two plain Python processes.

A child process runs a blocking echo server on 127.0.0.1; this process sends a request
of ``size`` bytes on one connection (TCP_NODELAY on both ends) and waits for the same
number of bytes back, ``calls`` times. No framing, no crypto, no event loop: what a
round trip costs a Python program on this host. ``testbed bench rpc`` reports the
node's RPCs as multiples of it (``reuse_vs_raw``, ``fresh_vs_raw``), which are stable
across hosts where absolute times are not, provided both are measured with their two
processes placed alike (``server_cpus`` pins the server; the caller pins itself; see
``testbed.tools.placement``).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from typing import Any

from testbed.tools.placement import affinity, pin

_SERVER = r"""
import socket, sys
size = int(sys.argv[1])
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", 0))
listener.listen(8)
print(listener.getsockname()[1], flush=True)
while True:
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        data = b""
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            if not chunk:
                break
            data += chunk
        if len(data) < size:
            conn.close()
            break
        conn.sendall(data)
"""


def _exchange(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(payload)
    left = len(payload)
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise ConnectionError("raw echo server closed the connection")
        left -= len(chunk)


def measure_raw_echo(*, calls: int = 2000, size: int = 200, warmup: int = 100,
                     fresh: bool = False, server_cpus: set[int] | None = None,
                     observed: dict[str, Any] | None = None) -> list[float]:
    """Round-trip times in ms (``fresh``: a new connection per call, connect timed).
    ``server_cpus`` pins the echo server; ``observed`` receives the CPUs the client
    (this process) and the server were allowed, read back from the kernel."""
    server = subprocess.Popen([sys.executable, "-c", _SERVER, str(size)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        if server_cpus is not None:
            pin(server.pid, server_cpus)
        if observed is not None:
            observed.update(client=affinity(0), server=affinity(server.pid))
        payload = bytes(size)
        samples: list[float] = []

        def connect() -> socket.socket:
            sock = socket.create_connection(("127.0.0.1", port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock

        persistent = None if fresh else connect()
        try:
            for i in range(warmup + calls):
                start = time.perf_counter_ns()
                sock = persistent or connect()
                try:
                    _exchange(sock, payload)
                finally:
                    if persistent is None:
                        sock.close()
                if i >= warmup:
                    samples.append((time.perf_counter_ns() - start) / 1e6)
        finally:
            if persistent is not None:
                persistent.close()
        return samples
    finally:
        server.kill()
        server.wait()
