"""Three node processes on loopback: RPCs, control ops and traffic/connection counters.

The test process joins the roster as a "probe" member and calls the nodes through the
real transport, so what it sent can be compared with what the nodes counted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import pytest
import trio

from nodes.client import open_rpc_client
from nodes.control import ControlClient
from nodes.rpc import call_fetch, call_heads, call_install, call_versions
from nodes.transport import Counters
from protocols.errors import RemoteCallError
from protocols.records import make_record
from testbed.run.team import NodeDied, NodeOpError, Team, key_owners, open_team

AGENTS = ["a0", "a1", "a2"]
PLUGIN = "tests.nodes.probe_policy"
OWNERS = key_owners(AGENTS, 6)  # a0: k000 k003, a1: k001 k004, a2: k002 k005


def _sum(counters: dict[str, dict[str, int]], field: str) -> int:
    return sum(c[field] for c in counters.values())


@pytest.fixture(params=["fresh", "reuse"])
async def team(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Team]:
    hosts = {a: (None, "127.0.0.1") for a in AGENTS}
    async with open_team(agents=AGENTS, central=False, hosts=hosts, workdir=tmp_path,
                         campaign_seed=11, connection=request.param, policy="test_probe",
                         owners=OWNERS, probes=["probe"], plugins=[PLUGIN]) as t:
        for key, owner in OWNERS.items():
            await t.call(owner, "seed", key=key, content=f"{key}-v1".encode(),
                         rtype="requirement")
        yield t


async def test_probe_rpcs_are_counted_on_both_sides(team: Team) -> None:
    before = await team.counters()
    mine = Counters()
    calls = 0
    peers_used: set[str] = set()
    async with open_rpc_client(identity=team.identity("probe"), roster=team.roster,
                               connection=team.connection, counters=mine) as client:
        for key, owner in OWNERS.items():  # one request per key
            heads = await call_heads(client, team.roster, owner, [key])
            assert heads[key].seq == 1
            assert heads[key].owner == owner
            calls += 1
            peers_used.add(owner)
        batched = await call_heads(client, team.roster, "a1", ["k001", "k004"])  # per owner
        assert set(batched) == {"k001", "k004"}
        calls += 1
        record = await call_fetch(client, team.roster, "a1", batched["k001"].record_id)
        assert record.content == b"k001-v1"
        calls += 1
        note = make_record(team.identity("probe"), key="note/1", owner="probe", seq=0,
                           parents=[record.id], rtype="review", content=b"hello")
        assert await call_install(client, "a2", [record, note]) == 2
        calls += 1
        peers_used.add("a2")
        assert (await call_fetch(client, team.roster, "a2", note.id)) == note
        calls += 1
        versions = await call_versions(client, team.roster, "a2", ["k001", "k000"])
        assert set(versions) == {"k001"}  # a2 holds k001 now, never got k000
        calls += 1
        with pytest.raises(RemoteCallError) as info:
            await call_heads(client, team.roster, "a0", ["k001"])
        assert info.value.code == "not_owner"
        calls += 1
        with pytest.raises(RemoteCallError) as info:
            await call_fetch(client, team.roster, "a0", b"\1" * 32)
        assert info.value.code == "unknown_id"
        calls += 1
    after = await team.counters()
    delta = {f: _sum(after, f) - _sum(before, f) for f in after["a0"]}
    # Everything the probe sent, the nodes received, and vice versa.
    assert delta["bytes_received"] == mine.bytes_sent > 0
    assert delta["bytes_sent"] == mine.bytes_received > 0
    assert delta["frames_received"] == mine.frames_sent
    assert delta["frames_sent"] == mine.frames_received
    assert delta["connections_accepted"] == mine.connections_opened
    expected_connections = calls if team.connection == "fresh" else len(peers_used)
    assert mine.connections_opened == expected_connections
    # two handshake frames per connection, one request and one response per call
    assert mine.frames_sent + mine.frames_received == 2 * mine.connections_opened + 2 * calls
    assert delta["rejected"] == 0


async def test_plan_update_act_between_nodes(team: Team) -> None:
    keys = ["k000", "k002"]  # owned by a0 and a2; executor a1 owns neither
    plan = await team.call("a2", "plan", action="ship", executor="a1", keys=keys, depth=0,
                           decision="go")
    first = await team.call("a1", "act", action="ship", roots=[plan["root"]], keys=keys)
    assert first["outcome"] == "released"
    assert first["replans"] == 0
    assert first["inputs"] == plan["inputs"]
    assert first["issued_roots"] == [plan["root"]]
    # per-key heads to a0 and a2 + one batched request each; nothing to fetch
    assert first["connections"] == (4 if team.connection == "fresh" else 2)
    assert first["bytes"] > 0
    assert first["stall_ms"] > 0

    upd = await team.call("a0", "update", key="k000", content=b"k000-v2")
    assert upd["head"]["seq"] == 2  # announced to a1 and a2
    assert upd["stall_ms"] > 0
    log = (await team.call("a0", "head_log"))["log"]
    assert [(k, s) for k, s, _, _ in log] == [("k000", 1), ("k003", 1), ("k000", 2)]
    assert log[-1][3] == upd["t_ns"]

    second = await team.call("a1", "act", action="ship", roots=[plan["root"]], keys=keys)
    assert second["outcome"] == "released"
    assert second["replans"] == 1
    assert second["inputs"]["k000"] == upd["head"]["id"]
    assert second["issued_roots"] != [plan["root"]]
    assert second["issue_t_ns"] > upd["t_ns"]
    # 4 head requests + 1 fetch, then the same 4 head requests after the replan
    assert second["connections"] == (9 if team.connection == "fresh" else 0)

    unit = await team.call("a1", "unit_end", unit=3)
    assert unit["stall_ms"] > 0

    counters = await team.counters()
    assert _sum(counters, "bytes_sent") == _sum(counters, "bytes_received")
    assert _sum(counters, "frames_sent") == _sum(counters, "frames_received")
    assert _sum(counters, "connections_opened") == _sum(counters, "connections_accepted")
    assert _sum(counters, "rejected") == 0

    await team.reset_all(connection="reuse")
    zeroed = await team.counters()
    assert all(v == 0 for c in zeroed.values() for v in c.values())
    assert (await team.call("a0", "head_log"))["log"] == []
    with pytest.raises(NodeOpError, match="no head"):
        await team.call("a0", "update", key="k000", content=b"x")


async def test_bad_user_input_gets_a_one_line_answer(tmp_path: Path) -> None:
    hosts = {a: (None, "127.0.0.1") for a in AGENTS[:2]}
    async with open_team(agents=AGENTS[:2], central=False, hosts=hosts, workdir=tmp_path,
                         campaign_seed=3, connection="fresh", policy="test_probe",
                         plugins=[PLUGIN]) as team:
        with pytest.raises(NodeOpError, match=r"connection: 'bogus' not one of fresh, reuse"):
            await team.call("a0", "reset", store_path=str(tmp_path / "s"), connection="bogus")
        with pytest.raises(NodeOpError, match=r"policy: unknown 'nope'"):
            await team.call("a0", "reset", store_path=str(tmp_path / "s"), policy="nope")
        with pytest.raises(NodeOpError, match=r"key: 'k001' is owned by 'a1'"):
            await team.call("a0", "seed", key="k001", content=b"x")
        with pytest.raises(NodeOpError, match=r"op: unknown 'fly'"):
            await team.call("a0", "fly")
        assert (await team.call("a0", "ping"))["agent_id"] == "a0"
        # garbage on another control connection closes only that connection
        garbage = await trio.open_unix_socket(team._nodes["a0"].control_path)
        await garbage.send_all(b"\x00\x00\x00\x03\xc1\xc1\xc1")
        with trio.fail_after(10):
            assert await garbage.receive_some(100) == b""
        await garbage.aclose()
        assert (await team.call("a0", "ping"))["agent_id"] == "a0"
        assert "control connection closed: malformed msgpack" in team.log_tail("a0")


async def test_dead_node_is_reported_with_its_exit_code(tmp_path: Path) -> None:
    hosts = {a: (None, "127.0.0.1") for a in AGENTS[:2]}
    async with open_team(agents=AGENTS[:2], central=False, hosts=hosts, workdir=tmp_path,
                         campaign_seed=3, connection="reuse", policy="test_probe",
                         plugins=[PLUGIN]) as team:
        proc = team._nodes["a1"].process
        assert proc is not None
        proc.kill()  # the process this team started, by its own handle
        with pytest.raises(NodeDied, match=r"node a1 failed \(exit code -9"):
            await team.call("a1", "ping")
        assert (await team.call("a0", "ping"))["agent_id"] == "a0"


def _log_file(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


async def test_handoff_of_artifacts_larger_than_one_frame(tmp_path: Path) -> None:
    hosts = {a: (None, "127.0.0.1") for a in AGENTS}
    keys = ["k000", "k002", "k003", "k005"]  # a0 and a2 (the planner) own them
    async with open_team(agents=AGENTS, central=False, hosts=hosts, workdir=tmp_path,
                         campaign_seed=4, connection="reuse", policy="test_probe",
                         owners=OWNERS, plugins=[PLUGIN]) as team:
        for i, key in enumerate(keys):
            await team.call(OWNERS[key], "seed", key=key, content=bytes([i]) * 300 * 1024,
                            rtype="artifact")
        plan = await team.call("a2", "plan", action="big", executor="a1", keys=keys)
        out = await team.call("a1", "act", action="big", roots=[plan["root"]], keys=keys)
        assert out["outcome"] == "released"
        assert out["inputs"] == plan["inputs"]
        # the executor received the 1.2 MiB of inputs in several frames under the cap
        assert (await team.counters())["a1"]["bytes_received"] > 4 * 300 * 1024


async def test_unreachable_owner_blocks_the_action(tmp_path: Path) -> None:
    hosts = {a: (None, "127.0.0.1") for a in AGENTS}
    async with open_team(agents=AGENTS, central=False, hosts=hosts, workdir=tmp_path,
                         campaign_seed=4, connection="fresh", policy="test_probe",
                         owners=OWNERS, plugins=[PLUGIN], rpc_timeout_s=5.0) as team:
        await team.call("a0", "seed", key="k000", content=b"v1")
        plan = await team.call("a2", "plan", action="x", executor="a1", keys=["k000"])
        owner = team._nodes["a0"].process
        assert owner is not None
        owner.kill()
        await owner.wait()
        out = await team.call("a1", "act", action="x", roots=[plan["root"]], keys=["k000"])
        assert out["outcome"] == "blocked"
        assert out["block_reason"].startswith("PeerUnavailable: cannot connect to a0")
        assert out["issued_roots"] == []
        assert (await team.call("a1", "ping"))["agent_id"] == "a1"


async def test_sigterm_closes_cleanly(tmp_path: Path) -> None:
    sock = trio.Path(tmp_path / "n.sock")
    log_path = tmp_path / "n.log"
    log_fd = _log_file(log_path)
    try:
        async with trio.open_nursery() as nursery:
            proc = await nursery.start(partial(
                trio.run_process, [sys.executable, "-m", "nodes", "--control", str(sock)],
                check=False, stdin=subprocess.DEVNULL, stderr=log_fd))
            with trio.fail_after(30):
                while not await sock.exists():
                    assert proc.returncode is None
                    await trio.sleep(0.02)
                client = await ControlClient.connect(str(sock))
                pong = await client.request("ping")
                assert pong.pop("t_ns") > 0  # when it handled the ping (liveness stamps)
                assert pong == {"ok": True, "agent_id": None}
                await client.aclose()
                proc.send_signal(signal.SIGTERM)
                await proc.wait()
    finally:
        os.close(log_fd)
    assert proc.returncode == 0
    assert not await sock.exists()
    assert "signal 15: shutting down" in await trio.Path(log_path).read_text()


def _make_netns(name: str) -> None:
    """A namespace with lo up and 198.18.0.1/32 on it (the nodes bind there)."""
    from pyroute2 import IPRoute

    from testbed.host.kernel import create_netns

    create_netns(name)
    with IPRoute(netns=name) as ipr:
        lo = ipr.link_lookup(ifname="lo")[0]
        ipr.link("set", index=lo, state="up")
        ipr.addr("add", index=lo, address="198.18.0.1", prefixlen=32)


@pytest.mark.privileged
async def test_nodes_run_inside_a_namespace(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a network namespace")
    from testbed.host.kernel import remove_netns
    from testbed.host.ledger import new_prefix

    name = f"{new_prefix()}n"
    try:
        await trio.to_thread.run_sync(_make_netns, name)
        # 198.18.0.1 exists only inside the namespace: binding it proves setns happened
        hosts = {a: (name, "198.18.0.1") for a in AGENTS[:2]}
        async with open_team(agents=AGENTS[:2], central=False, hosts=hosts, workdir=tmp_path,
                             campaign_seed=9, connection="reuse", policy="test_probe",
                             owners=key_owners(AGENTS[:2], 2), plugins=[PLUGIN]) as team:
            await team.call("a0", "seed", key="k000", content=b"v1")
            plan = await team.call("a0", "plan", action="x", executor="a1", keys=["k000"])
            await team.call("a0", "update", key="k000", content=b"v2")
            out = await team.call("a1", "act", action="x", roots=[plan["root"]], keys=["k000"])
            assert out["outcome"] == "released"
            assert out["replans"] == 1
            assert team.roster.members["a1"].host == "198.18.0.1"
    finally:
        await trio.to_thread.run_sync(remove_netns, name)
