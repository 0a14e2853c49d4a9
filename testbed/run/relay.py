"""The model relay: where an agent's role calls enter, bytes forwarded to the model server.

Rules this module obeys:

1. A relay forwards whole TCP byte streams, untouched, from its listeners to one
   upstream address (the endpoint's host and port); HTTP and TLS stay end to end
   between the node and the server (``nodes.model_client`` rule 2).
2. Each listener belongs to one agent, so the bytes of every agent's calls are counted
   apart, both directions, as they pass (:meth:`ModelRelay.take_bytes`).
3. A listener lives where the placement puts the server: a Unix socket of the run
   (``beside``: the call crosses no namespace boundary and no emulated link) or a TCP
   socket made inside the central host's namespace on its address (``central``: the call
   crosses the agent's access link and the central host's, both emulated). The relay
   process itself sits in the root namespace, where the real server is reachable.
4. An upstream that cannot be reached closes the agent's connection at once (its client
   retries, then counts a model failure); nothing is answered in the server's place.
"""

from __future__ import annotations

import socket
from collections import defaultdict

import trio

READ_BYTES = 65536


class ModelRelay:
    """Byte forwarding with per-agent counters (module rules)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._bytes: dict[str, int] = defaultdict(int)
        self.connections: dict[str, int] = defaultdict(int)

    def take_bytes(self) -> dict[str, int]:
        """Bytes per agent since the last call (both directions), and reset."""
        out = dict(self._bytes)
        self._bytes.clear()
        return out

    async def serve(self, sock: socket.socket, agent: str, *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept on a bound, listening stdlib socket until cancelled (it is closed then)."""
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        async with listener, trio.open_nursery() as nursery:
            task_status.started()
            while True:
                stream = await listener.accept()
                nursery.start_soon(self._forward, stream, agent)

    async def _forward(self, client: trio.abc.Stream, agent: str) -> None:
        self.connections[agent] += 1
        try:
            upstream = await trio.open_tcp_stream(*self.upstream)
        except OSError:
            await client.aclose()
            return
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, client, upstream, agent, nursery.cancel_scope)
            nursery.start_soon(self._pump, upstream, client, agent, nursery.cancel_scope)

    async def _pump(self, source: trio.abc.Stream, sink: trio.abc.Stream, agent: str,
                    scope: trio.CancelScope) -> None:
        try:
            while True:
                data = await source.receive_some(READ_BYTES)
                if not data:
                    break
                self._bytes[agent] += len(data)
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            scope.cancel()  # either side gone: close both
