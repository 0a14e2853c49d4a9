"""Measurement integrity against an attacker on the roster (issues 11 and 20), on real nodes.

Each test names the defect it covers: a record or handshake replayed from another
episode, a replayed hello held open, unauthenticated buffering, a connection flood,
peer input answered as ``internal``, answers piling up for a peer that does not read
them, partial frames of replayed hellos holding memory (and keeping it afterwards). The attacker is the test process, acting as a
roster member (``probe``) or as anyone who saw that member's handshake on the wire.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

from nodes.client import open_rpc_client
from nodes.limits import Limits
from nodes.rpc import call_fetch, call_heads, call_install
from nodes.transport import Counters
from protocols import wire
from protocols.auth import ChannelInitiator
from protocols.errors import PeerUnavailable, RemoteCallError, RemoteProtocolError
from protocols.identity import CENTRAL_ID
from protocols.records import Record, make_record
from testbed.run.team import Team, key_owners, open_team
from testbed.run.verdict import build_head_log, judge_invalid

AGENTS = ["a0", "a1"]
OWNERS = key_owners(AGENTS, 2)  # a0: k000, a1: k001
TARGET = "a0"
PROBES = ["probe", "p1", "p2", "p3"]  # roster members with no process: the attacker


async def _team(tmp_path: Path, limits: dict[str, Any] | None = None
                ) -> AsyncIterator[Team]:
    hosts = {a: (None, "127.0.0.1") for a in [*AGENTS, CENTRAL_ID]}
    async with open_team(agents=AGENTS, central=True, hosts=hosts, workdir=tmp_path,
                         campaign_seed=5, connection="reuse", policy="test_probe",
                         owners=OWNERS, probes=PROBES, limits=limits,
                         plugins=["tests.nodes.probe_policy"]) as t:
        yield t


_limited_team = asynccontextmanager(_team)


@pytest.fixture
async def team(tmp_path: Path) -> AsyncIterator[Team]:
    async for t in _team(tmp_path):
        yield t


@pytest.fixture
async def strict_team(tmp_path: Path) -> AsyncIterator[Team]:
    """Small limits, so that the attacks reach them quickly."""
    async for t in _team(tmp_path, {"first_frame_timeout_s": 0.5, "max_connections": 64,
                                    "max_connections_per_peer": 16}):
        yield t


async def _log_shows(team: Team, agent: str, text: str) -> None:
    with trio.fail_after(5):
        while text not in team.log_tail(agent, 200):
            await trio.sleep(0.02)


async def _closed_without_answer(stream: trio.SocketStream, *, within_s: float = 5.0
                                 ) -> list[bytes]:
    """Frames the node sent before closing ``stream``; fails if it stays open."""
    decoder = wire.FrameDecoder()
    frames = []
    with trio.fail_after(within_s):
        try:
            while (body := await wire.read_frame(stream, decoder)) is not None:
                frames.append(body)
        except (trio.BrokenResourceError, RemoteProtocolError):
            pass
    await stream.aclose()
    return frames


async def _connect(team: Team, peer: str = TARGET) -> trio.SocketStream:
    member = team.roster.members[peer]
    return await trio.open_tcp_stream(member.host, member.port)


# --- cross-episode replay -------------------------------------------------------------------
async def test_record_from_another_episode_is_rejected_and_verdict_stays_right(
        team: Team) -> None:
    # Episode 1: the owner writes k000 up to seq 4; a roster member keeps seq 4.
    await team.reset_all()
    await team.call(TARGET, "seed", key="k000", content=b"v1")
    for n in (2, 3, 4):
        await team.call(TARGET, "update", key="k000", content=b"v%d" % n)
    async with open_rpc_client(identity=team.identity("probe"), roster=team.roster,
                               connection="reuse", counters=Counters()) as client:
        head = (await call_heads(client, team.roster, TARGET, ["k000"]))["k000"]
        captured = await call_fetch(client, team.roster, TARGET, head.record_id)
    assert captured.seq == 4

    # Episode 2: seq 1 again; the same member installs the captured record.
    await team.reset_all()
    await team.call(TARGET, "seed", key="k000", content=b"v1")
    log_before = (await team.call(TARGET, "head_log"))["log"]
    async with open_rpc_client(identity=team.identity("probe"), roster=team.roster,
                               connection="reuse", counters=Counters()) as client:
        with pytest.raises((PeerUnavailable, RemoteProtocolError)):
            await call_install(client, TARGET, [captured])
    await _log_shows(team, TARGET, "record signature does not verify")
    async with open_rpc_client(identity=team.identity("a1"), roster=team.roster,
                               connection="reuse", counters=Counters()) as client:
        head2 = (await call_heads(client, team.roster, TARGET, ["k000"]))["k000"]
        with pytest.raises(RemoteCallError, match="unknown_id"):
            await call_fetch(client, team.roster, TARGET, captured.id)
    log_after = (await team.call(TARGET, "head_log"))["log"]
    assert head2.seq == 1
    assert log_after == log_before
    assert len(log_after) == 1
    # The controller's verdict reads that log: the seq-1 input is current, seq 4 is not.
    timeline = build_head_log({TARGET: log_after})
    now = time.monotonic_ns()
    assert not judge_invalid(timeline, ["k000"], {"k000": head2.record_id}, now)
    assert judge_invalid(timeline, ["k000"], {"k000": captured.id}, now)


async def test_handshake_from_another_episode_is_refused(team: Team) -> None:
    await team.reset_all()
    old_hello = ChannelInitiator(identity=team.identity("probe"), roster=team.roster,
                                 peer_id=TARGET).start()
    await team.reset_all()
    stream = await _connect(team)
    await stream.send_all(wire.encode_frame(old_hello))
    assert await _closed_without_answer(stream) == []
    await _log_shows(team, TARGET, "handshake message 1 rejected")


async def test_connections_of_the_previous_episode_are_closed_at_reset(team: Team) -> None:
    port = team.roster.members[TARGET].port
    async with open_rpc_client(identity=team.identity("probe"), roster=team.roster,
                               connection="reuse", counters=Counters()) as client:
        await client.call(TARGET, "versions", {"keys": ["k000"]})
        await team.reset_all()
        with pytest.raises((PeerUnavailable, RemoteProtocolError)):
            with trio.fail_after(5):
                await client.call(TARGET, "versions", {"keys": ["k000"]})
    assert team.roster.members[TARGET].port == port  # the listener kept its port


# --- connection limits ------------------------------------------------------------------------
async def test_replayed_hello_is_closed_within_the_first_frame_timeout(
        strict_team: Team) -> None:
    team = strict_team
    # Anyone who saw a member's handshake message 1 can send it again.
    hello = ChannelInitiator(identity=team.identity("probe"), roster=team.roster,
                             peer_id=TARGET).start()
    streams = []
    for _ in range(8):
        stream = await _connect(team)
        await stream.send_all(wire.encode_frame(hello))
        streams.append(stream)
    with trio.fail_after(5):  # first_frame_timeout_s is 0.5 s
        for stream in streams:
            frames = await _closed_without_answer(stream)
            assert len(frames) == 1  # the responder's message 2, then the close
    await _log_shows(team, TARGET, "no authenticated frame in time")


async def test_unauthenticated_frames_are_bounded_to_the_handshake_size(team: Team) -> None:
    stream = await _connect(team)
    # The largest handshake frame is 114 bytes; a 1 MiB length prefix is refused at once.
    await stream.send_all((1024 * 1024).to_bytes(4, "big") + b"x" * 4096)
    assert await _closed_without_answer(stream) == []
    await _log_shows(team, TARGET, "outside 1..114")
    pid = team.pid(TARGET)
    assert pid is not None
    rss_before = _rss_kib(pid)
    streams = []
    for _ in range(100):  # each would be 1 MiB buffered without the bound
        s = await _connect(team)
        await s.send_all((114).to_bytes(4, "big") + b"\x01" * 113)
        streams.append(s)
    await trio.sleep(0.5)
    assert _rss_kib(pid) - rss_before < 20 * 1024
    for s in streams:
        await s.aclose()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_connection_flood_leaves_a_member_served(strict_team: Team) -> None:
    team = strict_team
    await team.call(TARGET, "seed", key="k000", content=b"v1")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    hello = ChannelInitiator(identity=team.identity("probe"), roster=team.roster,
                             peer_id=TARGET).start()
    flood: list[trio.SocketStream] = []
    try:
        for i in range(1100):  # beyond a default 1024-file limit
            try:
                s = await _connect(team)
            except OSError:
                break
            if i % 2:
                await s.send_all(wire.encode_frame(hello))  # replayed hello, then silence
            flood.append(s)
        member = Counters()
        with trio.fail_after(5):
            async with open_rpc_client(identity=team.identity("a1"), roster=team.roster,
                                       connection="fresh", counters=member,
                                       timeout_s=5) as client:
                heads = await call_heads(client, team.roster, TARGET, ["k000"])
        assert set(heads) == {"k000"}
        counters = await team.call(TARGET, "counters")
        assert counters["refused"] > 0
    finally:
        for s in flood:
            await s.aclose()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_member_over_its_install_quota_is_refused(tmp_path: Path) -> None:
    async for team in _team(tmp_path, {"install_records_per_peer": 3}):
        await team.call(TARGET, "seed", key="k000", content=b"v1")
        notes = [_note(team, b"n%d" % i) for i in range(4)]
        async with open_rpc_client(identity=team.identity("probe"), roster=team.roster,
                                   connection="reuse", counters=Counters()) as client:
            assert await call_install(client, TARGET, notes[:3]) == 3
            with pytest.raises((PeerUnavailable, RemoteProtocolError)):
                await call_install(client, TARGET, notes[3:])
        await _log_shows(team, TARGET, "install quota of this episode exceeded")
        await team.reset_all()  # a new episode, a new quota
        notes = [_note(team, b"m%d" % i) for i in range(3)]
        async with open_rpc_client(identity=team.identity("probe"), roster=team.roster,
                                   connection="reuse", counters=Counters()) as client:
            assert await call_install(client, TARGET, notes) == 3


def _note(team: Team, content: bytes) -> Record:
    return make_record(team.identity("probe"), key="note/x", owner="probe",
                       seq=int.from_bytes(content[-1:], "big"), parents=[], rtype="review",
                       content=content)


# --- typed errors ------------------------------------------------------------------------------
def _record_wire(**changes: Any) -> dict[str, Any]:
    body = {"key": "note/y", "owner": "probe", "seq": 1, "parents": [],
            "rtype": "review", "content": b"c", "author": "probe", "sig": bytes(64)}
    body.update(changes)
    return body


TYPED_CASES = {  # (who sends it, method, params): each from the member allowed to send it
    "rtype_list": ("probe", "install", {"records": [_record_wire(rtype=["plan"])]}),
    "rtype_map": ("probe", "install", {"records": [_record_wire(rtype={"a": 1})]}),
    "record_seq_2_63": ("probe", "install", {"records": [_record_wire(seq=2**63)]}),
    "announce_seq_2_63": ("a1", "announce", {"heads": [{"key": "k001", "owner": "a1",
                                                        "seq": 2**63, "id": bytes(32)}]}),
    "commit_seq_2_64": ("a0", "commit", {"heads": [{"key": "k000", "owner": "a0",
                                                     "seq": 2**64 - 1, "id": bytes(32)}]}),
}


@pytest.mark.parametrize("case", sorted(TYPED_CASES))
async def test_peer_input_is_a_protocol_error_never_internal(team: Team, case: str) -> None:
    sender, method, params = TYPED_CASES[case]
    target = CENTRAL_ID if method == "commit" else TARGET
    stream = await _connect(team, target)
    initiator = ChannelInitiator(identity=team.identity(sender), roster=team.roster,
                                 peer_id=target)
    await stream.send_all(wire.encode_frame(initiator.start()))
    decoder = wire.FrameDecoder()
    reply = await wire.read_frame(stream, decoder)
    assert reply is not None
    session = initiator.finish(reply)
    body = msgpack.packb({"i": 1, "m": method, "p": params}, use_bin_type=True)
    await stream.send_all(wire.encode_frame(session.encrypt(body)))
    frames = []
    with trio.fail_after(5):
        try:
            while (raw := await wire.read_frame(stream, decoder)) is not None:
                frames.append(wire.unpack(session.decrypt(raw)))
        except (trio.BrokenResourceError, RemoteProtocolError):
            pass
    assert frames == []  # closed as the peer's fault; no "internal" answer
    assert "internal" not in team.log_tail(target, 50)


# --- bytes held for peers (issue 20) -----------------------------------------------------------
MIB = 1024 * 1024
BIG_CONTENT = 380 * 1024  # an artifact-size record: each fetch answer is this large


def _vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")


async def _session(team: Team, sender: str, *, rcvbuf: int = 4096
                   ) -> tuple[trio.SocketStream, Any]:
    """An authenticated raw connection as ``sender`` whose receive buffer is tiny (a
    peer that does not read fills it at once)."""
    member = team.roster.members[TARGET]
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect((member.host, member.port))
    stream = trio.SocketStream(sock)
    initiator = ChannelInitiator(identity=team.identity(sender), roster=team.roster,
                                 peer_id=TARGET)
    await stream.send_all(wire.encode_frame(initiator.start()))
    reply = await wire.read_frame(stream, wire.FrameDecoder(), exact=True)
    assert reply is not None
    return stream, initiator.finish(reply)


async def _big_record(team: Team) -> Record:
    record = make_record(team.identity("probe"), key="note/big", owner="probe", seq=1,
                         parents=[], rtype="review", content=b"x" * BIG_CONTENT)
    async with open_rpc_client(identity=team.identity("probe"), roster=team.roster,
                               connection="reuse", counters=Counters()) as client:
        assert await call_install(client, TARGET, [record]) == 1
    return record


async def _pipeline_fetches(stream: trio.SocketStream, session: Any, record: Record,
                            count: int, first_id: int = 1) -> int:
    """Send ``count`` fetch requests without reading a byte; how many went out before
    the node closed the connection."""
    for i in range(count):
        body = msgpack.packb({"i": first_id + i, "m": "fetch", "p": {"id": record.id}},
                             use_bin_type=True)
        try:
            with trio.fail_after(5):
                await stream.send_all(wire.encode_frame(session.encrypt(body)))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return i
    return count


async def _closed_by_node(stream: trio.SocketStream) -> bool:
    """The node closed ``stream`` (reads what it sent until the end)."""
    with trio.fail_after(10):
        try:
            while await stream.receive_some(1 << 20):
                pass
        except trio.BrokenResourceError:
            pass
    return True


async def test_answers_waiting_on_a_peer_that_does_not_read_are_bounded_per_connection(
        tmp_path: Path) -> None:
    """1500 pipelined fetches of a 380 KiB record, never read: without a byte bound the
    node queued 570 MiB of answers (max_in_flight counts answers, not bytes)."""
    async with _limited_team(tmp_path, {"answer_bytes_per_connection": 8 * MIB}) as team:
        record = await _big_record(team)
        pid = team.pid(TARGET)
        assert pid is not None
        rss_before = _vm_kib(pid, "VmRSS")
        stream, session = await _session(team, "probe")
        sent = await _pipeline_fetches(stream, session, record, 1500)
        await _log_shows(team, TARGET, "(answer_bytes_per_connection)")
        counters = await team.call(TARGET, "counters")
        assert counters["rejected"] == 1
        # The queue stopped at the cap (plus one answer and what the sockets hold),
        # far below the 1500 answers asked for.
        assert 8 * MIB < counters["peak_answer_bytes"] <= 8 * MIB + BIG_CONTENT + 4096
        assert _vm_kib(pid, "VmHWM") - rss_before < 8 * 1024 + 48 * 1024
        assert sent < 1500 or await _closed_by_node(stream)
        await stream.aclose()
        await _still_serves(team)


async def _still_serves(team: Team) -> None:
    """The node answers a member (and its control plane) after the attack."""
    await team.call(TARGET, "seed", key="k000", content=b"v1")
    async with open_rpc_client(identity=team.identity("a1"), roster=team.roster,
                               connection="fresh", counters=Counters()) as client:
        assert set(await call_heads(client, team.roster, TARGET, ["k000"])) == {"k000"}


async def test_answers_waiting_on_a_peer_are_bounded_over_its_connections(
        tmp_path: Path) -> None:
    """The same peer on several connections, each under the connection cap: past the
    peer's cap its connection holding the most is closed."""
    async with _limited_team(tmp_path, {"answer_bytes_per_connection": 64 * MIB,
                                        "answer_bytes_per_peer": 6 * MIB}) as team:
        record = await _big_record(team)
        streams = [await _session(team, "probe") for _ in range(4)]
        for n, (stream, session) in enumerate(streams):
            await _pipeline_fetches(stream, session, record, 8, first_id=1 + 100 * n)
        # the connection holding the most is closed: another one ("... exceed
        # answer_bytes_per_peer") or the one whose answer went over ("... (answer_bytes_
        # per_peer)"), whichever it is when the cap is crossed
        await _log_shows(team, TARGET, "answer_bytes_per_peer")
        counters = await team.call(TARGET, "counters")
        assert counters["rejected"] >= 1
        assert counters["peak_peer_answer_bytes"] <= 6 * MIB + BIG_CONTENT + 4096
        for stream, _ in streams:
            await stream.aclose()
        await _still_serves(team)


async def _hello_flood(team: Team, count: int, *, sources: int = 1) -> None:
    """``count`` connections, each a replayed hello (of one of four members, so the
    per-peer connection cap does not stop it first) and most of a 1 MiB frame that
    never completes; from ``sources`` loopback addresses. Closed again at the end."""
    hellos = [ChannelInitiator(identity=team.identity(p), roster=team.roster,
                               peer_id=TARGET).start() for p in PROBES]
    member = team.roster.members[TARGET]
    partial = MIB.to_bytes(4, "big") + b"\x01" * (MIB - 1)
    streams = []
    try:
        for i in range(count):
            sock = trio.socket.socket()
            if sources > 1:
                await sock.bind((f"127.0.0.{2 + i % sources}", 0))
            await sock.connect((member.host, member.port))
            stream = trio.SocketStream(sock)
            streams.append(stream)
            try:
                with trio.fail_after(5):
                    await stream.send_all(wire.encode_frame(hellos[i % len(hellos)]))
                    await stream.send_all(partial)
            except (trio.BrokenResourceError, trio.TooSlowError):
                pass  # closed by the node (or held back): the next one
        await trio.sleep(1.0)
    finally:
        for stream in streams:
            await trio.aclose_forcefully(stream)


@pytest.mark.slow
async def test_partial_frames_of_replayed_hellos_are_bounded_per_source(team: Team) -> None:
    """512 replayed hellos, each with a 1 MiB partial frame, from one address and no key:
    without a bound the node held them all (hundreds of MiB, most of it kept after)."""
    pid = team.pid(TARGET)
    assert pid is not None
    rss_before = _vm_kib(pid, "VmRSS")
    await _hello_flood(team, 512)
    cap_kib = Limits().pre_auth_bytes_per_source // 1024
    assert _vm_kib(pid, "VmHWM") - rss_before < cap_kib + 48 * 1024
    counters = await team.call(TARGET, "counters")
    assert cap_kib * 1024 < counters["peak_pre_auth_bytes"] <= cap_kib * 1024 + 2 * MIB
    await _log_shows(team, TARGET, "hold more than pre_auth_bytes_per_source")
    await _still_serves(team)


@pytest.mark.slow
async def test_memory_held_by_a_flood_of_partial_frames_is_returned(tmp_path: Path) -> None:
    """1024 such connections from 64 addresses (each within its source's bound, so the
    node holds hundreds of MiB at once), closed by the node's first-frame timeout while
    the flood goes on: once it is over, the node's memory is back within 64 MiB of where
    it started. (Without returning it, 167 of 364 MiB stayed resident: freed buffers the
    allocator keeps in its heaps.)"""
    async with _limited_team(tmp_path, {"first_frame_timeout_s": 5}) as team:
        pid = team.pid(TARGET)
        assert pid is not None
        rss_before = _vm_kib(pid, "VmRSS")
        await _hello_flood(team, 1024, sources=64)
        assert _vm_kib(pid, "VmHWM") - rss_before > 96 * 1024  # it did hold a lot
        await trio.sleep(2)
        assert _vm_kib(pid, "VmRSS") - rss_before < 64 * 1024


# --- one budget per node, whatever the source (held_bytes_per_node) --------------------------

NODE_CAP = 32 * MIB
#: What a node may hold above its budget: the allocator's slack, a frame being copied,
#: the interpreter's own growth under load (the same margin as the other byte caps).
MARGIN_KIB = 48 * 1024


async def _proven(team: Team, sender: str) -> tuple[trio.SocketStream, Any]:
    """A raw connection as ``sender`` that proved itself (a ping was answered)."""
    stream, session = await _session(team, sender, rcvbuf=1 << 20)
    ping = msgpack.packb({"i": 1, "m": "ping", "p": {}}, use_bin_type=True)
    await stream.send_all(wire.encode_frame(session.encrypt(ping)))
    assert await wire.read_frame(stream, wire.FrameDecoder()) is not None
    return stream, session


async def _measure(team: Team, attack: Any) -> tuple[int, int, dict[str, Any]]:
    """(peak growth, growth 2 s after, counters) of the victim's resident memory (KiB)."""
    pid = team.pid(TARGET)
    assert pid is not None
    rss_before = _vm_kib(pid, "VmRSS")
    await attack()
    peak = _vm_kib(pid, "VmHWM") - rss_before
    await trio.sleep(2)
    after = _vm_kib(pid, "VmRSS") - rss_before
    print(f"peak growth {peak / 1024:.1f} MiB, after {after / 1024:.1f} MiB")
    return peak, after, await team.call(TARGET, "counters")


@pytest.mark.slow
async def test_replayed_hellos_from_many_addresses_stay_within_the_node_budget(
        tmp_path: Path) -> None:
    """512 replayed hellos with a 1 MiB partial frame each, from 32 addresses, each
    address within its own share: the node as a whole stops at its budget."""
    async with _limited_team(tmp_path, {"held_bytes_per_node": NODE_CAP}) as team:
        peak, after, counters = await _measure(
            team, lambda: _hello_flood(team, 512, sources=32))
        assert counters["peak_node_held_bytes"] <= NODE_CAP + 2 * MIB
        assert counters["rejected"] > 0
        assert peak < NODE_CAP // 1024 + MARGIN_KIB
        assert after < 16 * 1024
        await _log_shows(team, TARGET, "held_bytes_per_node")
        await _still_serves(team)


@pytest.mark.slow
async def test_complete_junk_frames_from_a_member_are_bounded_and_given_back(
        tmp_path: Path) -> None:
    """A member's 32 proven connections each send complete 1 MiB frames that fail
    authentication, again and again: each is closed, the node stays in budget and
    gives the memory back."""
    junk = wire.encode_frame(b"\x02" * (MIB - 64))

    async def attack(team: Team) -> None:
        for _ in range(4):
            conns = [await _proven(team, PROBES[i % len(PROBES)]) for i in range(32)]
            for stream, _ in conns:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await stream.send_all(junk)
            for stream, _ in conns:
                await _closed_by_node(stream)
                await stream.aclose()

    async with _limited_team(tmp_path, {"held_bytes_per_node": NODE_CAP}) as team:
        peak, after, counters = await _measure(team, lambda: attack(team))
        assert counters["rejected"] == 4 * 32
        assert counters["peak_node_held_bytes"] <= NODE_CAP + 2 * MIB
        assert peak < NODE_CAP // 1024 + MARGIN_KIB
        assert after < 16 * 1024
        await _still_serves(team)


@pytest.mark.slow
async def test_proven_connections_holding_partial_frames_stay_within_the_node_budget(
        tmp_path: Path) -> None:
    """128 proven connections (32 per member), each then holding all but one byte of a
    1 MiB frame: per-member shares do not stop it, the node budget does; closing them
    gives the memory back."""
    partial = MIB.to_bytes(4, "big") + b"\x01" * (MIB - 1)

    async def attack(team: Team) -> None:
        conns = [await _proven(team, PROBES[i % len(PROBES)]) for i in range(128)]
        for stream, _ in conns:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError,
                                     trio.TooSlowError), trio.fail_after(5):
                await stream.send_all(partial)
        await trio.sleep(1.0)
        for stream, _ in conns:
            await trio.aclose_forcefully(stream)

    async with _limited_team(tmp_path, {"held_bytes_per_node": NODE_CAP}) as team:
        peak, after, counters = await _measure(team, lambda: attack(team))
        assert counters["rejected"] >= 128 - NODE_CAP // MIB - 1
        assert counters["peak_node_held_bytes"] <= NODE_CAP + 2 * MIB
        assert peak < NODE_CAP // 1024 + MARGIN_KIB
        assert after < 16 * 1024
        await _log_shows(team, TARGET, "held_bytes_per_node")
        await _still_serves(team)
