"""The fault suite's attacks on a node's memory, made by the controller as an attacker.

Rules of this module:

1. The attacker is what docs/architecture.md's threat model allows: a roster member of
   the current episode (the controller derives every member's key, so it acts as one)
   or anyone who replays a member's handshake message 1 without its key. It attacks one
   node (the victim) over loopback, on fresh connections of its own, while the episode
   goes on: the victim's honest peers use their own connections.
2. ``unread_flood``: as a member, install one artifact-size record at the victim, then
   pipeline ``FETCHES`` fetches of it on one connection whose receive buffer is tiny and
   never read: every answer the victim makes waits on the attacker.
3. ``hello_flood``: ``HELLOS`` connections, each a replayed hello of another member
   followed by all but one byte of a maximal frame, which therefore never completes.
4. ``many_source_flood``: the same hellos from ``SOURCES`` loopback addresses
   (127.0.0.2 and up: local to every process on the host, no key needed), so each
   address stays within its own share and only the node's budget
   (``held_bytes_per_node``) stops it. ``junk_flood``: as members, ``JUNK_ROUNDS`` rounds
   of ``JUNK_CONNECTIONS`` proven connections (a ping answered), each then sending a
   complete maximal frame that fails authentication.
5. Each flood is measured on the victim: its resident memory before, its peak during
   (``VmHWM``, reset before the flood through ``/proc/PID/clear_refs``), what stays
   resident ``SETTLE_S`` after the flood, and whether the victim closed the attacker's
   connections (rather than the attacker giving up).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path

import msgpack
import trio

from nodes.client import open_rpc_client
from nodes.rpc import call_install
from nodes.transport import Counters
from protocols import wire
from protocols.auth import ChannelInitiator
from protocols.errors import ProtocolError
from protocols.records import MAX_CONTENT_BYTES, make_record
from testbed.run.team import Team

FETCHES = 1500
HELLOS = 512
SOURCES = 32
JUNK_CONNECTIONS = 32
JUNK_ROUNDS = 4
FRAME_BYTES = wire.MAX_FRAME_BYTES
SETTLE_S = 1.5
SEND_TIMEOUT_S = 5.0
MIB = 1024 * 1024


@dataclass
class FloodMeasure:
    """What one flood did to its victim (rule 4), in MiB and connections."""

    victim: str
    rss_before_mib: float = 0.0
    peak_growth_mib: float = 0.0
    after_growth_mib: float = 0.0
    connections: int = 0
    closed_by_victim: int = 0


def _vm_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _reset_peak(pid: int) -> None:
    """Reset the process's peak resident size (``VmHWM``) to its current size."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


async def measured(team: Team, victim: str, flood: FloodMeasure,
                   attack: Awaitable[None]) -> None:
    """Run ``attack`` against ``victim`` and fill in ``flood`` (rule 5)."""
    pid = team.pid(victim)
    if pid is None:
        return
    _reset_peak(pid)
    before = _vm_kib(pid, "VmRSS")
    flood.rss_before_mib = before / 1024
    await attack
    flood.peak_growth_mib = max(0, _vm_kib(pid, "VmHWM") - before) / 1024
    await trio.sleep(SETTLE_S)
    flood.after_growth_mib = max(0, _vm_kib(pid, "VmRSS") - before) / 1024


def _others(team: Team, victim: str) -> list[str]:
    return [m for m in team.members if m != victim]


async def _connect(team: Team, victim: str, *, rcvbuf: int | None = None,
                   source: str | None = None) -> trio.SocketStream:
    member = team.roster.members[victim]
    sock = trio.socket.socket()
    try:
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if source is not None:
            await sock.bind((source, 0))
        await sock.connect((member.host, member.port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


async def _closed_by_peer(stream: trio.SocketStream, within_s: float) -> bool:
    """Read until the end: True if the other side closed within ``within_s``."""
    with trio.move_on_after(within_s):
        try:
            while await stream.receive_some(MIB):
                pass
        except trio.BrokenResourceError:
            pass
        return True
    return False


async def unread_flood(team: Team, victim: str, flood: FloodMeasure) -> None:
    """Rule 2: pipelined fetches of an artifact-size record, never read."""
    attacker = _others(team, victim)[0]
    identity = team.identity(attacker)
    record = make_record(identity, key="note/flood", owner=attacker, seq=1, parents=[],
                         rtype="review", content=b"\x5a" * MAX_CONTENT_BYTES)
    async with open_rpc_client(identity=identity, roster=team.roster, connection="fresh",
                               counters=Counters()) as client:
        await call_install(client, victim, [record])
    stream = await _connect(team, victim, rcvbuf=4096)
    flood.connections = 1
    try:
        initiator = ChannelInitiator(identity=identity, roster=team.roster, peer_id=victim)
        await stream.send_all(wire.encode_frame(initiator.start()))
        reply = await wire.read_frame(stream, wire.FrameDecoder(), exact=True)
        if reply is None:
            return
        session = initiator.finish(reply)
        for i in range(FETCHES):
            body = msgpack.packb({"i": i + 1, "m": "fetch", "p": {"id": record.id}},
                                 use_bin_type=True)
            try:
                with trio.fail_after(SEND_TIMEOUT_S):
                    await stream.send_all(wire.encode_frame(session.encrypt(body)))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                flood.closed_by_victim = 1  # it closed the connection under the flood
                return
            except trio.TooSlowError:
                break  # it stopped reading requests without closing: not proved
        if await _closed_by_peer(stream, SEND_TIMEOUT_S):
            flood.closed_by_victim = 1
    except (trio.BrokenResourceError, ProtocolError):
        flood.closed_by_victim = 1
    finally:
        await trio.aclose_forcefully(stream)


async def hello_flood(team: Team, victim: str, flood: FloodMeasure, *,
                      sources: int = 1) -> None:
    """Rule 3 (and 4 with ``sources``): replayed hellos, each followed by a partial
    maximal frame."""
    hellos = [ChannelInitiator(identity=team.identity(m), roster=team.roster,
                               peer_id=victim).start() for m in _others(team, victim)]
    partial = FRAME_BYTES.to_bytes(wire.PREFIX_BYTES, "big") + b"\x01" * (FRAME_BYTES - 1)
    streams = []
    try:
        for i in range(HELLOS):
            source = f"127.0.0.{2 + i % sources}" if sources > 1 else None
            try:
                stream = await _connect(team, victim, source=source)
            except OSError:
                continue
            streams.append(stream)
            flood.connections += 1
            try:
                with trio.fail_after(SEND_TIMEOUT_S):
                    await stream.send_all(wire.encode_frame(hellos[i % len(hellos)]))
                    await stream.send_all(partial)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
                pass
        for stream in streams:  # which did the victim close (before the attacker did)?
            if await _closed_by_peer(stream, 0.01):
                flood.closed_by_victim += 1
    finally:
        for stream in streams:
            await trio.aclose_forcefully(stream)


async def many_source_flood(team: Team, victim: str, flood: FloodMeasure) -> None:
    """Rule 4: the hello flood from ``SOURCES`` loopback addresses."""
    await hello_flood(team, victim, flood, sources=SOURCES)


async def junk_flood(team: Team, victim: str, flood: FloodMeasure) -> None:
    """Rule 4: members' proven connections each send a complete junk maximal frame."""
    identities = [team.identity(m) for m in _others(team, victim)]
    junk = wire.encode_frame(b"\x02" * (FRAME_BYTES - 64))
    ping = msgpack.packb({"i": 1, "m": "ping", "p": {}}, use_bin_type=True)
    for _ in range(JUNK_ROUNDS):
        streams = []
        try:
            for i in range(JUNK_CONNECTIONS):
                stream = await _connect(team, victim)
                streams.append(stream)
                flood.connections += 1
                initiator = ChannelInitiator(identity=identities[i % len(identities)],
                                             roster=team.roster, peer_id=victim)
                with trio.fail_after(SEND_TIMEOUT_S):
                    await stream.send_all(wire.encode_frame(initiator.start()))
                    decoder = wire.FrameDecoder()
                    reply = await wire.read_frame(stream, decoder, exact=True)
                    if reply is None:
                        continue
                    session = initiator.finish(reply)
                    await stream.send_all(wire.encode_frame(session.encrypt(ping)))
                    await wire.read_frame(stream, decoder)  # proven: the ping answered
            for stream in streams:
                with contextlib.suppress(trio.BrokenResourceError,
                                         trio.ClosedResourceError, trio.TooSlowError), \
                        trio.fail_after(SEND_TIMEOUT_S):
                    await stream.send_all(junk)
            for stream in streams:
                if await _closed_by_peer(stream, SEND_TIMEOUT_S):
                    flood.closed_by_victim += 1
        except (trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError, OSError):
            pass
        finally:
            for stream in streams:
                await trio.aclose_forcefully(stream)
