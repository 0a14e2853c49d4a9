"""The model relay (testbed/run/relay.py) on real sockets: an agent's Unix-socket
listener, an upstream TCP server; bytes pass untouched both ways and are counted per
agent; an unreachable upstream closes the agent's connection without an answer."""

from __future__ import annotations

import socket
from functools import partial
from pathlib import Path

import trio

from testbed.run.relay import ModelRelay

PAYLOAD = bytes(range(256)) * 600  # 153,600 bytes: several reads either way


def unix_listener(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(8)
    return sock


async def echo_reversed(stream: trio.SocketStream) -> None:
    """Answers every chunk with its bytes reversed (so an untouched relay is visible)."""
    async with stream:
        received = b""
        while len(received) < len(PAYLOAD):
            chunk = await stream.receive_some()
            if not chunk:
                return
            received += chunk
        await stream.send_all(received[::-1] + b"!")


async def exchange(path: Path) -> bytes:
    stream = await trio.open_unix_socket(str(path))
    async with stream:
        await stream.send_all(PAYLOAD)
        answer = b""
        while len(answer) < len(PAYLOAD) + 1:
            chunk = await stream.receive_some()
            if not chunk:
                break
            answer += chunk
        return answer


async def test_bytes_pass_untouched_and_are_counted_per_agent(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        (upstream,) = await nursery.start(partial(trio.serve_tcp, echo_reversed, 0,
                                                  host="127.0.0.1"))
        relay = ModelRelay(("127.0.0.1", upstream.socket.getsockname()[1]))
        for agent in ("a1", "a2"):
            await nursery.start(partial(relay.serve, unix_listener(tmp_path / agent), agent))
        first = await exchange(tmp_path / "a1")
        assert first == PAYLOAD[::-1] + b"!"
        assert await exchange(tmp_path / "a1") == first
        assert await exchange(tmp_path / "a2") == first
        await trio.sleep(0.05)  # let the pumps see both ends close
        counted = relay.take_bytes()
        assert counted == {"a1": 2 * (2 * len(PAYLOAD) + 1), "a2": 2 * len(PAYLOAD) + 1}
        assert relay.take_bytes() == {}  # taken means reset
        assert dict(relay.connections) == {"a1": 2, "a2": 1}
        nursery.cancel_scope.cancel()


async def test_an_unreachable_upstream_closes_the_agents_connection(tmp_path: Path) -> None:
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there now
    async with trio.open_nursery() as nursery:
        relay = ModelRelay(("127.0.0.1", port))
        await nursery.start(partial(relay.serve, unix_listener(tmp_path / "a1"), "a1"))
        with trio.fail_after(10):
            stream = await trio.open_unix_socket(str(tmp_path / "a1"))
            async with stream:
                answer = b""
                try:  # closed (or reset: the request was never read), nothing answered
                    await stream.send_all(b"POST /v1/chat/completions HTTP/1.1\r\n\r\n")
                    answer = await stream.receive_some()
                except trio.BrokenResourceError:
                    pass
                assert answer == b""
        assert relay.take_bytes() == {}
        nursery.cancel_scope.cancel()
