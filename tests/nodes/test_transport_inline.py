"""The paths without a task per frame, over real loopback sockets: the server's inline
answers for a synchronous handler (rule 8 of nodes/server.py), the frame path's writes
(rule 6 of nodes/transport.py), and the client's pooled connection under them.

A reader that answers inline must still read the next request while an answer waits for
a peer that does not read (the answer goes to a task, which counts against
``max_in_flight``), and answers that wait must go out whole and in nonce order. On the
client, many callers share one connection and each gets its own response; a caller that
gives up does not stop the others from getting theirs.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from nodes.client import open_rpc_client
from nodes.limits import Limits
from nodes.server import DataPlaneServer, serve_data_plane
from nodes.transport import Counters, Handler
from protocols import auth, wire
from protocols.errors import IntegrityError, PeerUnavailable, RemoteCallError, RpcTimeout
from protocols.identity import Identity, Member, Roster

HOST = "127.0.0.1"
AGENTS = ["agent-0", "agent-1", "agent-2"]
SERVER = "agent-1"
BIG = 900_000  # one reply of this many bytes; a few of them overflow the socket buffers


def handler(peer: str, method: str, params: dict[str, Any]) -> Any:
    if method == "echo":
        return {"peer": peer, "params": params}
    if method == "big":
        return b"y" * BIG
    if method == "fail":
        raise RemoteCallError("unknown_id", "no such record")
    if method == "poison":
        raise IntegrityError("record signature does not verify")
    if method == "crash":
        raise ZeroDivisionError("handler bug")
    raise RemoteCallError("unknown_method", method)


def team() -> dict[str, Identity]:
    return {a: Identity.derive(a, "transport-tests") for a in AGENTS}


def roster(ids: dict[str, Identity], port: int) -> Roster:
    return Roster.build([Member(a, ids[a].public_key, HOST, port if a == SERVER else 1)
                         for a in ids], {}, list(ids))


@asynccontextmanager
async def serving(*, max_in_flight: int | None = None, async_handler: Handler | None = None,
                  ) -> AsyncIterator[tuple[dict[str, Identity], Roster, Counters]]:
    ids, counters = team(), Counters()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve_data_plane(
            identity=ids[SERVER], roster=roster(ids, 0), host=HOST, port=0,
            handler=async_handler, sync_handler=None if async_handler else handler,
            counters=counters, max_in_flight=max_in_flight, task_status=task_status))
        yield ids, roster(ids, port), counters
        nursery.cancel_scope.cancel()


async def slow_reader(ids: dict[str, Identity], members: Roster
                      ) -> tuple[trio.SocketStream, auth.Session]:
    """An authenticated raw connection with a tiny receive buffer (a peer that reads
    late), so the server's answers back up into its own socket."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect((HOST, members.members[SERVER].port))
    stream = trio.SocketStream(sock)
    initiator = auth.ChannelInitiator(identity=ids["agent-2"], roster=members,
                                      peer_id=SERVER)
    await stream.send_all(wire.encode_frame(initiator.start()))
    body = await wire.read_frame(stream, wire.FrameDecoder())
    assert body is not None
    return stream, initiator.finish(body)


def request(session: auth.Session, i: int, method: str) -> bytes:
    return wire.encode_frame(session.encrypt(wire.pack({"i": i, "m": method, "p": {}})))


async def wait_for(predicate: Any) -> None:
    with trio.fail_after(5):
        while not predicate():
            await trio.sleep(0.005)


async def test_sync_handler_answers_calls_errors_and_bad_requests() -> None:
    async with serving() as (ids, members, counters):
        async with open_rpc_client(identity=ids["agent-0"], roster=members,
                                   connection="reuse", counters=Counters()) as client:
            for _ in range(3):
                assert await client.call(SERVER, "echo", {"k": 1}) == {
                    "peer": "agent-0", "params": {"k": 1}}
            with pytest.raises(RemoteCallError) as info:
                await client.call(SERVER, "fail", {})
            assert info.value.code == "unknown_id"
            with pytest.raises(RemoteCallError, match="internal"):
                await client.call(SERVER, "crash", {})
            assert await client.call(SERVER, "big", {}) == b"y" * BIG
            with pytest.raises(PeerUnavailable):  # the server closes this connection
                await client.call(SERVER, "poison", {})
            assert await client.call(SERVER, "echo", {}) == {"peer": "agent-0", "params": {}}
        assert counters.rejected == 1
        assert counters.connections_accepted == 2


async def test_reader_keeps_reading_while_answers_wait_for_a_slow_peer() -> None:
    async with serving() as (ids, members, counters):
        stream, session = await slow_reader(ids, members)
        await stream.send_all(b"".join(request(session, i, "big") for i in (1, 2, 3, 4)))
        await wait_for(lambda: counters.frames_received == 5)  # hello + 4 requests
        await stream.send_all(request(session, 5, "echo"))
        await wait_for(lambda: counters.frames_received == 6)  # read while answers wait
        assert counters.frames_sent < 6  # hello reply + 5 answers: not all out yet
        decoder = wire.FrameDecoder()
        answers = []
        with trio.fail_after(10):
            while len(answers) < 5:
                body = await wire.read_frame(stream, decoder)
                assert body is not None
                answers.append(wire.unpack(session.decrypt(body)))  # nonce order holds
        by_id = {a["i"]: a["r"] for a in answers}  # tasks send in any order (rule 2)
        assert sorted(by_id) == [1, 2, 3, 4, 5]
        assert all(by_id[i] == b"y" * BIG for i in (1, 2, 3, 4))
        assert by_id[5] == {"peer": "agent-2", "params": {}}
        assert counters.rejected == 0
        await stream.aclose()


async def test_answers_waiting_on_a_peer_count_against_max_in_flight() -> None:
    async with serving(max_in_flight=2) as (ids, members, counters):
        stream, session = await slow_reader(ids, members)
        for i in range(1, 9):  # one at a time, so each is read before the next
            try:
                await stream.send_all(request(session, i, "big"))
            except trio.BrokenResourceError:
                break
            await trio.sleep(0.02)
        await wait_for(lambda: counters.rejected == 1)  # more than 2 answers waiting
        await stream.aclose()


def test_server_takes_exactly_one_handler() -> None:
    ids = team()
    with pytest.raises(TypeError, match="exactly one of handler, sync_handler"):
        DataPlaneServer(identity=ids[SERVER], roster=roster(ids, 1), counters=Counters(),
                        limits=Limits())


async def test_many_callers_share_one_pooled_connection() -> None:
    async with serving() as (ids, members, counters):
        client_counters = Counters()
        async with open_rpc_client(identity=ids["agent-0"], roster=members,
                                   connection="reuse", counters=client_counters) as client:
            seen: list[tuple[int, int]] = []

            async def worker(w: int) -> None:
                for n in range(40):
                    answer = await client.call(SERVER, "echo", {"w": w, "n": n})
                    assert answer == {"peer": "agent-0", "params": {"w": w, "n": n}}
                    seen.append((w, n))

            async with trio.open_nursery() as nursery:
                for w in range(16):
                    nursery.start_soon(worker, w)
        assert sorted(seen) == [(w, n) for w in range(16) for n in range(40)]
        assert client_counters.connections_opened == 1
        assert client_counters.rejected == counters.rejected == 0


async def test_a_caller_that_times_out_leaves_the_others_answered() -> None:
    gate = trio.Event()

    async def slow(peer: str, method: str, params: dict[str, Any]) -> Any:
        if params.get("wait"):
            await gate.wait()
        return params

    async with serving(async_handler=slow) as (ids, members, _), open_rpc_client(
            identity=ids["agent-0"], roster=members, connection="reuse",
            counters=Counters(), timeout_s=0.4) as client:
        results: dict[str, Any] = {}

        async def first() -> None:  # gives up at 0.4 s
            with pytest.raises(RpcTimeout):
                await client.call(SERVER, "x", {"wait": True, "who": "first"})

        async def second() -> None:  # answered at 0.5 s, after the first gave up
            await trio.sleep(0.2)
            results["second"] = await client.call(SERVER, "x", {"who": "second",
                                                                "wait": True})

        async def opener() -> None:
            await trio.sleep(0.5)
            gate.set()

        async with trio.open_nursery() as nursery:
            for task in (first, second, opener):
                nursery.start_soon(task)
        assert results["second"] == {"who": "second", "wait": True}
        # the late answer to the first call arrives on the idle connection: dropped
        assert await client.call(SERVER, "x", {"n": 1}) == {"n": 1}
