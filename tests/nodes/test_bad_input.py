"""Bad peer input against real node processes (issue 2, "Bad input ...").

Each case attacks node a0 (or the central directory) from the test process and checks
that: the offending connection is closed (or, for a well-formed request that cannot be
answered, an error reply comes back), the node logs the reason, nothing from the input
is persisted, and another peer's already-open connection keeps being served.
In-process transport cases live in tests/nodes/test_transport.py; these run through
the node's handlers, store and logging.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

from nodes.client import open_rpc_client
from nodes.rpc import call_fetch, call_heads
from nodes.transport import Counters
from protocols import wire
from protocols.auth import ChannelInitiator, Session
from protocols.errors import IntegrityError, RemoteCallError
from protocols.identity import CENTRAL_ID, Identity
from protocols.records import HeadInfo, Record, make_record
from testbed.run.team import Team, key_owners, open_team

AGENTS = ["a0", "a1"]
OWNERS = key_owners(AGENTS, 2)  # a0: k000, a1: k001
TARGET = "a0"


@pytest.fixture
async def team(tmp_path: Path) -> AsyncIterator[Team]:
    hosts = {a: (None, "127.0.0.1") for a in [*AGENTS, CENTRAL_ID]}
    async with open_team(agents=AGENTS, central=True, hosts=hosts, workdir=tmp_path,
                         campaign_seed=5, connection="reuse", policy="test_probe",
                         owners=OWNERS, probes=["probe"],
                         plugins=["tests.nodes.probe_policy"]) as t:
        await t.call("a0", "seed", key="k000", content=b"v1", rtype="requirement")
        await t.call("a1", "seed", key="k001", content=b"w1", rtype="requirement")
        yield t


class Raw:
    """A hand-driven data-plane connection (so the test can misbehave precisely)."""

    def __init__(self, stream: trio.SocketStream, peer: str) -> None:
        self.stream = stream
        self.peer = peer
        self.session: Session | None = None
        self.decoder = wire.FrameDecoder()

    @classmethod
    async def connect(cls, team: Team, peer: str) -> Raw:
        member = team.roster.members[peer]
        return cls(await trio.open_tcp_stream(member.host, member.port), peer)

    async def send_frame(self, body: bytes) -> None:
        await self.stream.send_all(wire.encode_frame(body))

    async def handshake(self, team: Team, identity: Identity) -> Session:
        initiator = ChannelInitiator(identity=identity, roster=team.roster, peer_id=self.peer)
        await self.send_frame(initiator.start())
        reply = await wire.read_frame(self.stream, self.decoder)
        assert reply is not None
        self.session = initiator.finish(reply)
        return self.session

    def seal(self, obj: Any) -> bytes:
        assert self.session is not None
        return self.session.encrypt(msgpack.packb(obj, use_bin_type=True))

    async def frames_until_closed(self) -> int:
        """Read until the peer closes; returns how many frames arrived first."""
        n = 0
        with trio.fail_after(10):
            try:
                while await wire.read_frame(self.stream, self.decoder) is not None:
                    n += 1
            except trio.BrokenResourceError:
                pass
        await self.stream.aclose()
        return n


def request(rid: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"i": rid, "m": method, "p": params}


HEADS = request(1, "heads", {"keys": ["k000"]})


# --- the attacks: each returns (log substring, ids that must not be persisted) ----------
Attack = Callable[[Team], Awaitable[tuple[str, list[bytes]]]]


async def malformed_msgpack(team: Team) -> tuple[str, list[bytes]]:
    raw = await Raw.connect(team, TARGET)
    session = await raw.handshake(team, team.identity("probe"))
    await raw.send_frame(session.encrypt(b"\xc1\x93"))
    assert await raw.frames_until_closed() == 0
    return "malformed msgpack", []


async def oversize_prefix(team: Team) -> tuple[str, list[bytes]]:
    raw = await Raw.connect(team, TARGET)
    await raw.stream.send_all(b"\xff\xff\xff\xff" + b"x" * 64)
    assert await raw.frames_until_closed() == 0
    return "frame length prefix 4294967295 outside", []


async def truncated_prefix(team: Team) -> tuple[str, list[bytes]]:
    raw = await Raw.connect(team, TARGET)
    await raw.stream.send_all(b"\x00\x00")
    await raw.stream.send_eof()
    assert await raw.frames_until_closed() == 0
    return "stream ended inside a frame", []


async def wrong_mac(team: Team) -> tuple[str, list[bytes]]:
    raw = await Raw.connect(team, TARGET)
    await raw.handshake(team, team.identity("probe"))
    sealed = bytearray(raw.seal(HEADS))
    sealed[-1] ^= 0x01
    await raw.send_frame(bytes(sealed))
    assert await raw.frames_until_closed() == 0
    return "failed authentication", []


async def replayed_frame(team: Team) -> tuple[str, list[bytes]]:
    raw = await Raw.connect(team, TARGET)
    await raw.handshake(team, team.identity("probe"))
    sealed = raw.seal(HEADS)
    await raw.send_frame(sealed)
    assert await wire.read_frame(raw.stream, raw.decoder) is not None  # answered once
    await raw.send_frame(sealed)
    assert await raw.frames_until_closed() == 0
    return "failed authentication", []


async def reordered_frames(team: Team) -> tuple[str, list[bytes]]:
    raw = await Raw.connect(team, TARGET)
    await raw.handshake(team, team.identity("probe"))
    first, second = raw.seal(HEADS), raw.seal(request(2, "heads", {"keys": ["k000"]}))
    await raw.send_frame(second)
    await raw.send_frame(first)
    assert await raw.frames_until_closed() == 0
    return "failed authentication", []


async def unknown_peer(team: Team) -> tuple[str, list[bytes]]:
    raw = await Raw.connect(team, TARGET)
    initiator = ChannelInitiator(identity=Identity.derive("mallory", 5), roster=team.roster,
                                 peer_id=TARGET)
    await raw.send_frame(initiator.start())
    assert await raw.frames_until_closed() == 0
    return "handshake from unknown peer 'mallory'", []


def _note(team: Team, content: bytes = b"note") -> Record:
    return make_record(team.identity("probe"), key="note/x", owner="probe", seq=0,
                       parents=[], rtype="review", content=content)


async def _install_closes(team: Team, records: list[Record], identity: str = "probe") -> None:
    raw = await Raw.connect(team, TARGET)
    await raw.handshake(team, team.identity(identity))
    await raw.send_frame(raw.seal(request(1, "install",
                                          {"records": [r.to_wire() for r in records]})))
    assert await raw.frames_until_closed() == 0


async def bad_signature(team: Team) -> tuple[str, list[bytes]]:
    good = _note(team)
    forged = dataclasses.replace(good, signature=bytes(64))
    await _install_closes(team, [_note(team, b"fine, but in a bad batch"), forged])
    return "record signature does not verify", [good.id, _note(team, b"fine, but in a bad batch").id]


async def bad_digest(team: Team) -> tuple[str, list[bytes]]:
    good = _note(team)
    altered = dataclasses.replace(good, content=b"altered after signing")
    await _install_closes(team, [altered])
    return "record signature does not verify", [good.id, altered.id]


async def head_update_from_non_owner(team: Team) -> tuple[str, list[bytes]]:
    forged = make_record(team.identity("probe"), key="k000", owner="probe", seq=9,
                         parents=[], rtype="requirement", content=b"evil")
    await _install_closes(team, [forged])
    return "belongs to 'a0'", [forged.id]


async def announce_from_non_owner(team: Team) -> tuple[str, list[bytes]]:
    raw = await Raw.connect(team, TARGET)
    await raw.handshake(team, team.identity("a1"))
    head = HeadInfo("k000", "a0", 7, b"\7" * 32)
    await raw.send_frame(raw.seal(request(1, "announce", {"heads": [head.to_wire()]})))
    assert await raw.frames_until_closed() == 0
    return "announce of 'k000' by 'a1', which does not own it", []


async def non_increasing_sequence(team: Team) -> tuple[str, list[bytes]]:
    # A genuine owner signature, but the sequence is already taken by the head.
    dup = make_record(team.identity("a0"), key="k000", owner="a0", seq=1, parents=[],
                      rtype="requirement", content=b"v1-bis")
    await _install_closes(team, [dup], identity="a1")
    return "equivocation by 'a0': 'k000' seq 1 has two signed records", [dup.id]


ATTACKS: list[Attack] = [malformed_msgpack, oversize_prefix, truncated_prefix, wrong_mac,
                         replayed_frame, reordered_frames, unknown_peer, bad_signature,
                         bad_digest, head_update_from_non_owner, announce_from_non_owner,
                         non_increasing_sequence]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.__name__)
async def test_bad_input_is_rejected_and_node_keeps_serving(team: Team, attack: Attack) -> None:
    bystander = Counters()
    async with open_rpc_client(identity=team.identity("a1"), roster=team.roster,
                               connection="reuse", counters=bystander) as client:
        head_before = await call_heads(client, team.roster, TARGET, ["k000"])
        rejected_before = (await team.call(TARGET, "counters"))["rejected"]

        reason, not_persisted = await attack(team)

        # the node logged why, counted the rejection, and persisted nothing
        with trio.fail_after(5):
            while reason not in team.log_tail(TARGET, 50):
                await trio.sleep(0.02)
        assert (await team.call(TARGET, "counters"))["rejected"] == rejected_before + 1
        for rid in not_persisted:
            with pytest.raises(RemoteCallError, match="unknown_id"):
                await call_fetch(client, team.roster, TARGET, rid)
        # ... and still serves the bystander on the connection it already had
        assert await call_heads(client, team.roster, TARGET, ["k000"]) == head_before
        assert bystander.connections_opened == 1
    assert (await team.call(TARGET, "head_log"))["log"][-1][1] == 1


async def test_fetch_of_unknown_id_is_an_error_reply_not_a_close(team: Team) -> None:
    mine = Counters()
    async with open_rpc_client(identity=team.identity("probe"), roster=team.roster,
                               connection="reuse", counters=mine) as client:
        with pytest.raises(RemoteCallError) as info:
            await call_fetch(client, team.roster, TARGET, b"\5" * 32)
        assert info.value.code == "unknown_id"
        assert (await call_heads(client, team.roster, TARGET, ["k000"]))["k000"].seq == 1
        assert mine.connections_opened == 1  # the same connection answered both
    assert (await team.call(TARGET, "counters"))["rejected"] == 0


async def test_directory_rejects_out_of_order_and_foreign_commits(team: Team) -> None:
    h1 = HeadInfo("k000", "a0", 1, b"\1" * 32)
    h2 = HeadInfo("k000", "a0", 2, b"\2" * 32)
    counters = Counters()
    async with open_rpc_client(identity=team.identity("a0"), roster=team.roster,
                               connection="reuse", counters=counters) as owner:
        await owner.call(CENTRAL_ID, "commit", {"heads": [h1.to_wire()]})
        await owner.call(CENTRAL_ID, "commit", {"heads": [h2.to_wire()]})
    rejected = (await team.call(CENTRAL_ID, "counters"))["rejected"]
    for who, head, reason in [
            ("a0", h1, "commit of 'k000' seq 1 out of order"),
            ("a0", HeadInfo("k000", "a0", 2**62, b"\6" * 32), "seq 4611686018427387904 out"),
            ("a0", HeadInfo("k000", "a0", 2, b"\7" * 32), "equivocation by 'a0'"),
            ("a1", HeadInfo("k000", "a0", 3, b"\3" * 32), "by 'a1', not")]:
        raw = await Raw.connect(team, CENTRAL_ID)
        await raw.handshake(team, team.identity(who))
        await raw.send_frame(raw.seal(request(1, "commit", {"heads": [head.to_wire()]})))
        assert await raw.frames_until_closed() == 0
        with trio.fail_after(5):
            while reason not in team.log_tail(CENTRAL_ID, 50):
                await trio.sleep(0.02)
    counted = await team.call(CENTRAL_ID, "counters")
    assert counted["rejected"] == rejected + 4
    assert counted["equivocations"] == 1
    h3 = HeadInfo("k000", "a0", 3, b"\3" * 32)
    async with open_rpc_client(identity=team.identity("a0"), roster=team.roster,
                               connection="fresh", counters=counters) as owner:
        await owner.call(CENTRAL_ID, "commit", {"heads": [h3.to_wire()]})  # not wedged
    async with open_rpc_client(identity=team.identity("a1"), roster=team.roster,
                               connection="fresh", counters=counters) as reader:
        answer = await reader.call(CENTRAL_ID, "dir_heads", {"keys": ["k000", "k001"]})
    assert answer == {"heads": [h3.to_wire()]}


class _LyingPeer:
    """A peer answering ``fetch`` with a record other than the one asked for."""

    def __init__(self, record: Record) -> None:
        self.record = record

    async def call(self, peer_id: str, method: str, params: dict[str, Any]) -> Any:
        return {"record": self.record.to_wire()}


async def test_fetched_record_must_match_the_requested_id(team: Team) -> None:
    asked = _note(team, b"asked for")
    with pytest.raises(IntegrityError, match="does not match the requested ID"):
        await call_fetch(_LyingPeer(_note(team, b"other")), team.roster, TARGET, asked.id)
