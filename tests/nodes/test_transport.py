"""Data-plane transport over real loopback TCP with real handshakes (nodes.transport)."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from nodes.client import open_rpc_client
from nodes.server import serve_data_plane
from nodes.transport import Counters
from protocols import auth, wire
from protocols.errors import (
    IntegrityError,
    LocalProtocolError,
    PeerUnavailable,
    RemoteCallError,
    RemoteProtocolError,
    RpcTimeout,
)
from protocols.identity import Identity, Member, Roster

HOST = "127.0.0.1"
AGENTS = ("agent-0", "agent-1", "agent-2")
SERVER = "agent-1"
TAG = 16


@dataclass
class Net:
    team: dict[str, Identity]
    roster: Roster
    server_counters: Counters
    port: int
    gate: trio.Event = field(default_factory=trio.Event)
    in_flight: int = 0
    overlap_seen: trio.Event = field(default_factory=trio.Event)


def build_roster(team: dict[str, Identity], ports: dict[str, int]) -> Roster:
    return Roster.build([Member(a, team[a].public_key, HOST, ports.get(a, 1)) for a in team],
                        {"k000": SERVER} if SERVER in team else {}, list(team))


@pytest.fixture
async def net() -> AsyncIterator[Net]:
    team = {a: Identity.derive(a, "transport-tests") for a in AGENTS}
    counters = Counters()
    state: list[Net] = []

    async def handler(peer: str, method: str, params: dict[str, Any]) -> Any:
        n = state[0]
        if method == "ping":  # what nodes.rpc answers; RpcClient.warm sends it
            return {}
        if method == "echo":
            return {"peer": peer, "params": params}
        if method == "fail":
            raise RemoteCallError("unknown_id", "no such record")
        if method == "poison":
            raise IntegrityError("record signature does not verify")
        if method == "wait_gate":
            await n.gate.wait()
            return "opened"
        if method == "overlap":  # returns only once two calls are inside at the same time
            n.in_flight += 1
            if n.in_flight >= 2:
                n.overlap_seen.set()
            with trio.fail_after(5):
                await n.overlap_seen.wait()
            n.in_flight -= 1
            return "overlapped"
        if method == "huge":
            return b"x" * wire.MAX_FRAME_BYTES  # cannot fit in a sealed frame
        if method == "crash":
            raise ZeroDivisionError("handler bug")
        raise RemoteCallError("unknown_method", method)

    async with trio.open_nursery() as nursery:
        serving_roster = build_roster(team, {})
        port = await nursery.start(lambda task_status: serve_data_plane(
            identity=team[SERVER], roster=serving_roster, host=HOST, port=0, handler=handler,
            counters=counters, task_status=task_status))
        state.append(Net(team, build_roster(team, {SERVER: port}), counters, port))
        yield state[0]
        nursery.cancel_scope.cancel()


def hello_frame_bytes(agent_id: str) -> int:
    return wire.PREFIX_BYTES + 2 + len(agent_id) + auth.DH_BYTES + TAG


def sealed_frame_bytes(obj: Any) -> int:
    return wire.PREFIX_BYTES + len(wire.pack(obj)) + TAG


# --- calls --------------------------------------------------------------------------------------

@pytest.mark.parametrize("connection", ["fresh", "reuse"])
async def test_calls_return_results_and_errors(net: Net, connection: Any) -> None:
    counters = Counters()
    async with open_rpc_client(identity=net.team["agent-0"], roster=net.roster,
                               connection=connection, counters=counters) as client:
        params = {"keys": ["k000"], "blob": b"\x00\xff" * 10}
        for _ in range(3):
            assert await client.call(SERVER, "echo", params) == {"peer": "agent-0",
                                                                  "params": params}
        with pytest.raises(RemoteCallError) as info:
            await client.call(SERVER, "fail", {})
        assert info.value.code == "unknown_id"
        with pytest.raises(RemoteCallError, match="internal"):
            await client.call(SERVER, "crash", {})
        assert await client.call(SERVER, "echo", {}) == {"peer": "agent-0", "params": {}}
    expected_connections = 6 if connection == "fresh" else 1
    assert counters.connections_opened == expected_connections
    assert net.server_counters.connections_accepted == expected_connections
    assert counters.rejected == net.server_counters.rejected == 0


@pytest.mark.parametrize("connection", ["fresh", "reuse"])
async def test_counters_equal_the_frames_on_the_wire(net: Net, connection: Any) -> None:
    counters = Counters()
    request_params = {"keys": ["k000", "k001"]}
    calls = 3
    async with open_rpc_client(identity=net.team["agent-0"], roster=net.roster,
                               connection=connection, counters=counters) as client:
        for _ in range(calls):
            await client.call(SERVER, "echo", request_params)
    handshakes = calls if connection == "fresh" else 1
    reply = {"peer": "agent-0", "params": request_params}
    sent = handshakes * hello_frame_bytes("agent-0") + sum(
        sealed_frame_bytes({"i": i, "m": "echo", "p": request_params})
        for i in ([1] * calls if connection == "fresh" else range(1, calls + 1)))
    received = handshakes * (wire.PREFIX_BYTES + auth.DH_BYTES + TAG) + sum(
        sealed_frame_bytes({"i": i, "r": reply})
        for i in ([1] * calls if connection == "fresh" else range(1, calls + 1)))
    assert counters.bytes_sent == sent
    assert counters.bytes_received == received
    assert counters.frames_sent == counters.frames_received == handshakes + calls
    assert counters.handshake_bytes_sent == handshakes * hello_frame_bytes("agent-0")
    await wait_for(lambda: net.server_counters.bytes_received == sent)
    snapshot = net.server_counters.snapshot()
    peaks = {k: snapshot.pop(k) for k in list(snapshot) if k.startswith("peak_")}
    assert snapshot == {
        "bytes_sent": received, "bytes_received": sent,
        "frames_sent": handshakes + calls, "frames_received": handshakes + calls,
        "handshake_bytes_sent": handshakes * (wire.PREFIX_BYTES + auth.DH_BYTES + TAG),
        "connections_opened": 0, "connections_accepted": handshakes, "rejected": 0,
        "refused": 0, "rpc_timeouts": 0, "equivocations": 0}
    assert 1 <= peaks["peak_connections"] <= handshakes
    assert peaks["peak_frame_objects"] >= 7  # {"i", "m", "p": {...}} and the params
    counters.reset()
    assert set(counters.snapshot().values()) == {0}


async def wait_for(predicate: Any) -> None:
    """Let the server's tasks run until ``predicate`` holds (bounded, not a timing test)."""
    with trio.fail_after(5):
        while not predicate():
            await trio.sleep(0.001)


async def test_reuse_runs_independent_calls_concurrently(net: Net) -> None:
    counters = Counters()
    async with open_rpc_client(identity=net.team["agent-0"], roster=net.roster,
                               connection="reuse", counters=counters) as client:
        results: list[Any] = []

        async def one() -> None:
            results.append(await client.call(SERVER, "overlap", {}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            nursery.start_soon(one)
    assert results == ["overlapped", "overlapped"]
    assert counters.connections_opened == 1  # both calls shared one connection


@pytest.mark.parametrize("connection", ["fresh", "reuse"])
async def test_oversize_bodies_are_local_errors(net: Net, connection: Any) -> None:
    counters = Counters()
    async with open_rpc_client(identity=net.team["agent-0"], roster=net.roster,
                               connection=connection, counters=counters) as client:
        with pytest.raises(LocalProtocolError, match="exceeds"):
            await client.call(SERVER, "echo", {"blob": b"x" * wire.MAX_FRAME_BYTES})
        with pytest.raises(RemoteCallError, match="internal"):
            await client.call(SERVER, "huge", {})
        assert await client.call(SERVER, "echo", {}) == {"peer": "agent-0", "params": {}}
    assert counters.connections_opened == (2 if connection == "fresh" else 1)
    assert counters.rejected == net.server_counters.rejected == 0


async def test_timeout_then_reuse_connection_keeps_working(net: Net) -> None:
    counters = Counters()
    async with open_rpc_client(identity=net.team["agent-0"], roster=net.roster,
                               connection="reuse", counters=counters, timeout_s=0.2) as client:
        with pytest.raises(RpcTimeout, match="wait_gate"):
            await client.call(SERVER, "wait_gate", {})
        net.gate.set()  # the late answer now arrives and must be dropped quietly
        assert await client.call(SERVER, "echo", {"n": 1}) == {"peer": "agent-0",
                                                               "params": {"n": 1}}
        assert await client.call(SERVER, "wait_gate", {}) == "opened"
    assert counters.connections_opened == 1
    assert counters.rejected == 0


async def test_unreachable_peer_is_unavailable(net: Net) -> None:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        closed_port = probe.getsockname()[1]
    roster = build_roster(net.team, {SERVER: closed_port})
    for connection in ("fresh", "reuse"):
        async with open_rpc_client(identity=net.team["agent-0"], roster=roster,
                                   connection=connection, counters=Counters()) as client:
            with pytest.raises(PeerUnavailable, match="cannot connect"):
                await client.call(SERVER, "echo", {})


async def test_pooled_connection_broken_by_server_is_replaced(net: Net) -> None:
    counters = Counters()
    async with open_rpc_client(identity=net.team["agent-0"], roster=net.roster,
                               connection="reuse", counters=counters) as client:
        await client.call(SERVER, "echo", {})
        with pytest.raises(PeerUnavailable):
            await client.call(SERVER, "poison", {})  # server closes the connection
        assert await client.call(SERVER, "echo", {}) == {"peer": "agent-0", "params": {}}
        assert counters.connections_opened == 2
        await client.close_pooled()
        await client.call(SERVER, "echo", {})
        assert counters.connections_opened == 3
    assert net.server_counters.rejected == 1


async def test_client_settings_are_checked() -> None:
    identity = Identity.derive("agent-0", "x")
    roster = build_roster({"agent-0": identity}, {})
    with pytest.raises(LocalProtocolError, match=r"connection: 'pooled' is not one of fresh, reuse"):
        async with open_rpc_client(identity=identity, roster=roster, connection="pooled",  # type: ignore[arg-type]
                                   counters=Counters()):
            pass
    with pytest.raises(LocalProtocolError, match="timeout_s"):
        async with open_rpc_client(identity=identity, roster=roster, connection="fresh",
                                   counters=Counters(), timeout_s=0):
            pass
    async with open_rpc_client(identity=identity, roster=roster, connection="fresh",
                               counters=Counters()) as client:
        with pytest.raises(LocalProtocolError, match="peer_id"):
            await client.call("nobody", "echo", {})


# --- bad clients ------------------------------------------------------------------------------------

async def raw_connect(net: Net) -> trio.SocketStream:
    return await trio.open_tcp_stream(HOST, net.port)


async def authenticated_raw(net: Net, agent: str = "agent-2",
                            roster: Roster | None = None) -> tuple[trio.SocketStream,
                                                                  auth.Session]:
    stream = await raw_connect(net)
    initiator = auth.ChannelInitiator(identity=net.team.get(agent) or
                                      Identity.derive(agent, "transport-tests"),
                                      roster=roster or net.roster, peer_id=SERVER)
    await stream.send_all(wire.encode_frame(initiator.start()))
    body = await wire.read_frame(stream, wire.FrameDecoder())
    assert body is not None
    return stream, initiator.finish(body)


async def closed_by_server(stream: trio.SocketStream) -> bool:
    """Read until the server closes; True if it did (no reply frames expected)."""
    with trio.fail_after(5):
        while True:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                return True
            if not data:
                return True


async def good_client_works(net: Net) -> None:
    async with open_rpc_client(identity=net.team["agent-0"], roster=net.roster,
                               connection="fresh", counters=Counters()) as client:
        assert await client.call(SERVER, "echo", {"ok": 1}) == {"peer": "agent-0",
                                                                "params": {"ok": 1}}


def request(i: int, method: str = "echo") -> bytes:
    return wire.pack({"i": i, "m": method, "p": {}})


async def send_garbage(stream: trio.SocketStream, net: Net) -> None:
    await stream.send_all(b"GET / HTTP/1.1\r\n\r\n")


async def send_oversize_prefix(stream: trio.SocketStream, net: Net) -> None:
    await stream.send_all((wire.MAX_FRAME_BYTES + 1).to_bytes(4, "big"))


async def send_truncated(stream: trio.SocketStream, net: Net) -> None:
    await stream.send_all(wire.encode_frame(b"x" * 100)[:50])
    await stream.send_eof()


async def send_unknown_peer(stream: trio.SocketStream, net: Net) -> None:
    outsider = Identity.derive("mallory", "transport-tests")
    roster = build_roster({**net.team, "mallory": outsider}, {SERVER: net.port})
    initiator = auth.ChannelInitiator(identity=outsider, roster=roster, peer_id=SERVER)
    await stream.send_all(wire.encode_frame(initiator.start()))


@pytest.mark.parametrize("attack", [send_garbage, send_oversize_prefix, send_truncated,
                                    send_unknown_peer])
async def test_bad_handshake_input_closes_only_that_connection(
        net: Net, attack: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="nodes.transport")
    idle_stream, idle_session = await authenticated_raw(net)  # a bystander
    stream = await raw_connect(net)
    await attack(stream, net)
    assert await closed_by_server(stream)
    assert net.server_counters.rejected == 1
    assert any("closing data-plane connection" in r.getMessage() for r in caplog.records)
    await good_client_works(net)
    # the bystander's connection was not disturbed either
    await idle_stream.send_all(wire.encode_frame(idle_session.encrypt(request(1))))
    reply = await wire.read_frame(idle_stream, wire.FrameDecoder())
    assert reply is not None
    assert wire.unpack(idle_session.decrypt(reply))["i"] == 1
    await stream.aclose()
    await idle_stream.aclose()


async def test_wrong_mac_closes_connection(net: Net) -> None:
    stream, session = await authenticated_raw(net)
    sealed = bytearray(session.encrypt(request(1)))
    sealed[-1] ^= 1
    await stream.send_all(wire.encode_frame(bytes(sealed)))
    assert await closed_by_server(stream)
    assert net.server_counters.rejected == 1
    await good_client_works(net)


async def test_replayed_frame_closes_connection(net: Net) -> None:
    stream, session = await authenticated_raw(net)
    frame = wire.encode_frame(session.encrypt(request(1)))
    await stream.send_all(frame)
    decoder = wire.FrameDecoder()
    reply = await wire.read_frame(stream, decoder)
    assert reply is not None
    assert wire.unpack(session.decrypt(reply)) == {"i": 1, "r": {"peer": "agent-2",
                                                                  "params": {}}}
    await stream.send_all(frame)  # the same bytes again
    assert await closed_by_server(stream)
    assert net.server_counters.rejected == 1
    await good_client_works(net)


async def test_reordered_frames_close_connection(net: Net) -> None:
    stream, session = await authenticated_raw(net)
    first, second = session.encrypt(request(1)), session.encrypt(request(2))
    await stream.send_all(wire.encode_frame(second) + wire.encode_frame(first))
    assert await closed_by_server(stream)
    assert net.server_counters.rejected == 1
    await good_client_works(net)


@pytest.mark.parametrize("connection", ["fresh", "reuse"])
async def test_artifact_sized_payload_round_trips(net: Net, connection: Any) -> None:
    blob = bytes(range(256)) * (320 * 4)  # 320 KiB
    async with open_rpc_client(identity=net.team["agent-0"], roster=net.roster,
                               connection=connection, counters=Counters()) as client:
        reply = await client.call(SERVER, "echo", {"content": blob})
    assert reply["params"]["content"] == blob


@pytest.mark.parametrize("body", [
    wire.pack({"i": 1, "m": "echo"}),
    wire.pack({"i": -1, "m": "echo", "p": {}}),
    wire.pack({"i": True, "m": "echo", "p": {}}),
    wire.pack({"i": 1, "m": 5, "p": {}}),
    wire.pack({"i": 1, "m": "echo", "p": [], "x": 1}),
    wire.pack([1, "echo", {}]),
    b"\xc1",
])
async def test_authenticated_peer_with_bad_request_shape_is_closed(net: Net,
                                                                   body: bytes) -> None:
    stream, session = await authenticated_raw(net)
    await stream.send_all(wire.encode_frame(session.encrypt(body)))
    assert await closed_by_server(stream)
    assert net.server_counters.rejected == 1
    await good_client_works(net)


# --- bad servers ------------------------------------------------------------------------------------

async def fake_server(team: dict[str, Identity], roster: Roster, reply: bytes,
                      tamper_handshake: bool = False,
                      task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Does a genuine handshake as SERVER, then answers every request with ``reply``."""
    listeners = await trio.open_tcp_listeners(0, host=HOST)

    async def serve(stream: trio.SocketStream) -> None:
        decoder = wire.FrameDecoder()
        first = await wire.read_frame(stream, decoder)
        assert first is not None
        answer, session = auth.ChannelResponder(identity=team[SERVER], roster=roster) \
            .respond(first)
        if tamper_handshake:
            answer = answer[:-1] + bytes([answer[-1] ^ 1])
        await stream.send_all(wire.encode_frame(answer))
        while await wire.read_frame(stream, decoder) is not None:
            await stream.send_all(wire.encode_frame(session.encrypt(reply)))

    async with trio.open_nursery() as nursery:
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(serve, listeners, handler_nursery=nursery)


@pytest.mark.parametrize("connection", ["fresh", "reuse"])
@pytest.mark.parametrize("reply", [
    wire.pack({"i": 99, "r": 1}),
    wire.pack({"i": 1, "r": 1, "e": {"code": "x", "msg": "y"}}),
    wire.pack({"i": 1, "e": {"code": 1}}),
    wire.pack("not a map"),
])
async def test_bad_response_is_a_remote_protocol_error(connection: Any, reply: bytes) -> None:
    team = {a: Identity.derive(a, "transport-tests") for a in AGENTS}
    async with trio.open_nursery() as nursery:
        port = await nursery.start(fake_server, team, build_roster(team, {}), reply)
        counters = Counters()
        async with open_rpc_client(identity=team["agent-0"], roster=build_roster(
                team, {SERVER: port}), connection=connection, counters=counters) as client:
            with pytest.raises(RemoteProtocolError):
                await client.call(SERVER, "echo", {})
        assert counters.rejected == 1
        nursery.cancel_scope.cancel()


async def test_forged_handshake_reply_is_rejected() -> None:
    team = {a: Identity.derive(a, "transport-tests") for a in AGENTS}
    async with trio.open_nursery() as nursery:
        port = await nursery.start(fake_server, team, build_roster(team, {}), b"\x90", True)
        counters = Counters()
        async with open_rpc_client(identity=team["agent-0"], roster=build_roster(
                team, {SERVER: port}), connection="reuse", counters=counters) as client:
            with pytest.raises(RemoteProtocolError, match="message 2"):
                await client.call(SERVER, "echo", {})
        assert counters.rejected == 1
        assert counters.connections_opened == 1
        nursery.cancel_scope.cancel()


# --- server limits ------------------------------------------------------------------------------

async def test_server_limits_cut_off_silent_and_flooding_peers() -> None:
    team = {a: Identity.derive(a, "transport-tests") for a in AGENTS}
    counters = Counters()
    gate = trio.Event()

    async def handler(peer: str, method: str, params: dict[str, Any]) -> Any:
        await gate.wait()
        return "late"

    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve_data_plane(
            identity=team[SERVER], roster=build_roster(team, {}), host=HOST, port=0,
            handler=handler, counters=counters, handshake_timeout_s=0.2, max_in_flight=2,
            task_status=task_status))
        net = Net(team, build_roster(team, {SERVER: port}), counters, port)
        silent = await raw_connect(net)  # connects and never says hello
        assert await closed_by_server(silent)
        assert counters.rejected == 1

        stream, session = await authenticated_raw(net)
        await stream.send_all(b"".join(wire.encode_frame(session.encrypt(request(i)))
                                       for i in (1, 2)))
        await wait_for(lambda: counters.frames_received == 3)  # hello + 2 requests
        assert counters.rejected == 1  # two in flight are within the limit
        await stream.send_all(wire.encode_frame(session.encrypt(request(3))))
        assert await closed_by_server(stream)
        assert counters.rejected == 2
        await silent.aclose()
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_reuse_warm_opens_the_pool_before_any_call(net: Net) -> None:
    counters = Counters()
    async with open_rpc_client(identity=net.team["agent-0"], roster=net.roster,
                               connection="reuse_warm", counters=counters) as client:
        assert await client.warm([SERVER]) == 1
        # hello + one request: the server sees an authenticated frame at once
        assert counters.frames_sent == 2
        assert await client.warm([SERVER]) == 0  # the pool already holds it
        assert counters.connections_opened == 1
        opened = counters.connections_opened
        for _ in range(3):
            await client.call(SERVER, "echo", {})
        assert counters.connections_opened == opened  # calls reuse the warmed one
        with pytest.raises(LocalProtocolError, match="peer_id"):
            await client.warm(["nobody"])
    async with open_rpc_client(identity=net.team["agent-0"], roster=net.roster,
                               connection="fresh", counters=Counters()) as client:
        with pytest.raises(LocalProtocolError, match="no pool"):
            await client.warm([SERVER])
