"""A plugin policy's own method between real node processes on loopback: served by the
owner's handler with durable state, counted exactly like a built-in method, and a
handler that raises fails that request alone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nodes.transport import error_body, pack_body
from protocols.auth import TAG_BYTES
from protocols.wire import PREFIX_BYTES
from testbed.run.team import Team, key_owners, open_team

# The plugin is imported by the node processes only: the test process's registry stays
# as campaigns see it. These are its method's name and its handler's fault message.
METHOD = "probe_count"
FAULT_MESSAGE = "probe_count: RuntimeError: asked to fail"

AGENTS = ["a0", "a1", "a2"]
OWNERS = key_owners(AGENTS, 3)  # a0: k000, a1: k001, a2: k002
PLUGIN = "tests.nodes.rpc_probe_policy"


def frame(body: bytes) -> int:
    return PREFIX_BYTES + len(body) + TAG_BYTES


#: The channel handshake of a new connection from a1: message 1 (sent, 50 + len(id)
#: bytes of body) and message 2 (received, 48 bytes), each with its length prefix.
HANDSHAKE_SENT = PREFIX_BYTES + 50 + len("a1")
HANDSHAKE = HANDSHAKE_SENT + PREFIX_BYTES + 48


@pytest.fixture
async def team(tmp_path: Path) -> AsyncIterator[Team]:
    hosts = {a: (None, "127.0.0.1") for a in AGENTS}
    async with open_team(agents=AGENTS, central=False, hosts=hosts, workdir=tmp_path,
                         campaign_seed=3, connection="reuse", policy="test_rpc_probe/step=3",
                         owners=OWNERS, plugins=[PLUGIN]) as t:
        for key, owner in OWNERS.items():
            await t.call(owner, "seed", key=key, content=f"{key}-v1".encode())
        yield t


async def _act(team: Team, action: str) -> dict[str, object]:
    plan = await team.call("a2", "plan", action=action, executor="a1", keys=["k002"])
    return await team.call("a1", "act", action=action, roots=[plan["root"]], keys=["k002"])


async def test_policy_method_bytes_rounds_state_and_a_failing_handler(team: Team) -> None:
    first = await _act(team, "one")
    # The handler raised on the first request: that request got the error reply
    # policy_fault, the connection stayed open (one connection), the second answered.
    assert first["outcome"] == "released", first["block_reason"]
    assert first["connections"] == 1
    assert first["rounds"] == 2
    frames = (frame(pack_body({"i": 1, "m": METHOD, "p": {"add": 3, "fail": True}}))
              + frame(error_body(1, "policy_fault", FAULT_MESSAGE))
              + frame(pack_body({"i": 2, "m": METHOD, "p": {"add": 3, "fail": False}}))
              + frame(pack_body({"i": 2, "r": {"total": 3, "calls": 2}})))
    assert first["handshake_bytes"] == HANDSHAKE_SENT
    assert first["bytes"] == HANDSHAKE + frames
    assert first["query_bytes"] == first["bytes"]  # phase "query": head-read columns
    assert first["fetch_bytes"] == 0
    # Durable state at the owner: the counter goes on on the same (reused) connection.
    second = await _act(team, "two")
    assert second["outcome"] == "released"
    assert second["connections"] == 0
    assert second["handshake_bytes"] == 0
    assert second["bytes"] == (
        frame(pack_body({"i": 3, "m": METHOD, "p": {"add": 3, "fail": True}}))
        + frame(error_body(3, "policy_fault", FAULT_MESSAGE))
        + frame(pack_body({"i": 4, "m": METHOD, "p": {"add": 3, "fail": False}}))
        + frame(pack_body({"i": 4, "r": {"total": 6, "calls": 4}})))
    counters = await team.counters()
    assert counters["a2"]["rejected"] == 0  # no connection was closed as the peer's fault


async def test_policy_state_is_reset_with_the_episode(team: Team, tmp_path: Path) -> None:
    assert (await _act(team, "one"))["outcome"] == "released"
    await team.reset_all(episode="episode-2")
    for key, owner in OWNERS.items():
        await team.call(owner, "seed", key=key, content=f"{key}-v1".encode())
    again = await _act(team, "one")
    expected = frame(pack_body({"i": 2, "r": {"total": 3, "calls": 2}}))
    assert again["outcome"] == "released"
    # total 3 and calls 2 again: the durable area and the memory area started empty
    assert again["bytes"] - HANDSHAKE == (
        frame(pack_body({"i": 1, "m": METHOD, "p": {"add": 3, "fail": True}}))
        + frame(error_body(1, "policy_fault", FAULT_MESSAGE))
        + frame(pack_body({"i": 2, "m": METHOD, "p": {"add": 3, "fail": False}}))
        + expected)
