"""Every policy on real node processes (three agents and the central directory, loopback).

The stale-plan race of the paper: a1 plans for executor a2 on k000 (owner a0); a0 then
updates k000; every agent ends the unit; a2 acts. Validity is judged as the controller
judges it: from the owner's head log at the action's issue time.

This module is also a node plugin (``--plugin tests.nodes.test_policies_live``) with two
test-only faults, active only inside node processes: an owner named ``liar`` answers
``heads`` with a different ID at its head's sequence (a forged head response), and the
``test_churn_*`` policies make the owner ``a0`` update ``k000`` (through its control
socket, as the controller would) while the executor replans.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from nodes import rpc
from nodes.client import open_rpc_client
from nodes.control import ControlClient
from nodes.transport import Counters
from protocols.env import ActionOutcome, ActionRequest, PolicyEnv
from protocols.errors import PeerUnavailable
from protocols.identity import CENTRAL_ID
from protocols.policies import register
from protocols.policies.base import Policy
from protocols.policies.centralized_lineage import CentralizedLineage
from protocols.policies.planfence import PlanFence
from protocols.records import HeadInfo
from testbed.run.team import NodeOpError, Team, key_owners, open_team
from tests.names import derivation_current_policies, policies

PLUGIN = "tests.nodes.test_policies_live"
LIAR = "liar"


def _in_node_process() -> bool:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == "nodes.__main__"


if _in_node_process():
    _honest_heads = rpc.Handlers._heads

    def _forged_heads(self: rpc.Handlers, peer: str, params: object) -> dict[str, Any]:
        answer = _honest_heads(self, peer, params)
        if self.agent_id == LIAR:
            for head in answer["heads"]:
                head["id"] = hashlib.blake2b(head["id"], digest_size=32).digest()
        return answer

    rpc.Handlers._heads = _forged_heads  # type: ignore[method-assign]


class _ChurnEnv:
    """Delegates to the node's env; ``replan`` first has a0 update k000 (a second change)."""

    def __init__(self, env: PolicyEnv) -> None:
        self._env = env

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    async def replan(self, request: ActionRequest, inputs: dict[str, bytes]) -> ActionRequest:
        own_socket = sys.argv[sys.argv.index("--control") + 1]
        client = await ControlClient.connect(os.path.join(os.path.dirname(own_socket),
                                                          "a0.sock"))
        try:
            reply = await client.request("update", key="k000", content=b"during-replan")
            assert reply.get("ok"), reply
        finally:
            await client.aclose()
        return await self._env.replan(request, inputs)


class ChurnPlanFence(PlanFence):
    name = "test_churn_planfence"

    async def validate(self, env: PolicyEnv, request: ActionRequest) -> ActionOutcome:
        return await super().validate(cast(PolicyEnv, _ChurnEnv(env)), request)


class ChurnCentralizedLineage(CentralizedLineage):
    name = "test_churn_centralized_lineage"

    async def validate(self, env: PolicyEnv, request: ActionRequest) -> ActionOutcome:
        return await super().validate(cast(PolicyEnv, _ChurnEnv(env)), request)


if _in_node_process():  # the test process's registry stays as campaigns see it
    register(ChurnPlanFence)
    register(ChurnCentralizedLineage)


AGENTS = ["a0", "a1", "a2"]
OWNERS = key_owners(AGENTS, 4)  # a0: k000 k003, a1: k001, a2: k002
FRESHNESS = policies(Policy.UNSAFE_FRESHNESS)
DERIVATION = derivation_current_policies()


@pytest.fixture
async def team(tmp_path: Path) -> AsyncIterator[Team]:
    hosts = {a: (None, "127.0.0.1") for a in [*AGENTS, CENTRAL_ID]}
    async with open_team(agents=AGENTS, central=True, hosts=hosts, workdir=tmp_path,
                         campaign_seed=5, connection="reuse", policy="planfence",
                         owners=OWNERS, rpc_timeout_s=5.0, plugins=[PLUGIN]) as t:
        yield t


async def start_episode(team: Team, policy: str) -> dict[str, Any]:
    """Fresh stores and policy objects; seed every key; plan; return the plan reply."""
    await team.reset_all(policy=policy)
    for key, owner in sorted(OWNERS.items()):
        await team.call(owner, "seed", key=key, content=f"{key}-v1".encode(),
                        rtype="requirement")
    return await team.call("a1", "plan", action="ship", executor="a2", keys=["k000"],
                           depth=0, decision="go")


async def end_unit(team: Team, unit: int) -> None:
    for agent in AGENTS:
        await team.call(agent, "unit_end", unit=unit)


async def owner_head_at(team: Team, key: str, t_ns: int) -> bytes:
    current = b""
    for k, _seq, rid, when in (await team.call(OWNERS[key], "head_log"))["log"]:
        if k == key and when <= t_ns:
            current = rid
    return current


async def invalid(team: Team, act: dict[str, Any]) -> bool:
    if act["outcome"] != "released":
        return False
    inputs = act["inputs"]
    if not inputs:
        return True
    for key, rid in inputs.items():
        if rid != await owner_head_at(team, key, act["issue_t_ns"]):
            return True
    return False


async def test_stale_plan_race_on_real_nodes(team: Team) -> None:
    for policy in [*FRESHNESS, *DERIVATION]:
        plan = await start_episode(team, policy)
        update = await team.call("a0", "update", key="k000", content=b"k000-v2")
        await end_unit(team, 0)
        act = await team.call("a2", "act", action="ship", roots=[plan["root"]],
                              keys=["k000"])
        assert act["outcome"] == "released", (policy, act.get("block_reason"))
        if policy in FRESHNESS:
            assert act["replans"] == 0, policy
            assert act["inputs"] == plan["inputs"], policy
            assert await invalid(team, act), policy
        else:
            assert act["replans"] == 1, policy
            assert act["inputs"] == {"k000": update["head"]["id"]}, policy
            assert act["issued_roots"] != [plan["root"]], policy
            assert not await invalid(team, act), policy


@pytest.mark.parametrize(("budget", "replans"),
                         [("b=0", 0), ("b=1/ranking=critical_first", 1)])
async def test_a_budget_checks_the_critical_input_the_act_op_names(
        team: Team, budget: str, replans: int) -> None:
    plan = await start_episode(team, f"planfence_budget/{budget}")
    await team.call("a0", "update", key="k000", content=b"k000-v2")
    await end_unit(team, 0)
    with pytest.raises(NodeOpError, match="critical: must be one of the action's keys"):
        await team.call("a2", "act", action="ship", roots=[plan["root"]], keys=["k000"],
                        critical="k001")
    act = await team.call("a2", "act", action="ship", roots=[plan["root"]], keys=["k000"],
                          critical="k000")
    assert act["outcome"] == "released"
    assert act["replans"] == replans
    assert (act["bytes"] == 0) == (replans == 0)
    assert await invalid(team, act) == (replans == 0)


@pytest.mark.parametrize("k", [2, 4])
async def test_metadata_sync_with_k_above_one_issues_invalid_actions_live(
        team: Team, k: int) -> None:
    plan = await start_episode(team, f"metadata_sync/{k}")
    await team.call("a0", "update", key="k000", content=b"k000-v2")
    await end_unit(team, 0)  # (0 + 1) % K != 0: no barrier yet
    act = await team.call("a2", "act", action="ship", roots=[plan["root"]], keys=["k000"])
    assert act["outcome"] == "released"
    assert act["replans"] == 0
    assert await invalid(team, act)


@pytest.mark.parametrize("policy", ["planfence", "batched_all_key", "all_replica",
                                    "centralized_lineage"])
async def test_a_killed_owner_blocks(team: Team, policy: str) -> None:
    plan = await start_episode(team, policy)
    await team.call("a0", "update", key="k000", content=b"k000-v2")
    await end_unit(team, 0)
    owner = team._nodes["a0"].process  # the process this team started, by its handle
    assert owner is not None
    owner.kill()
    await owner.wait()
    act = await team.call("a2", "act", action="ship", roots=[plan["root"]], keys=["k000"])
    assert act["outcome"] == "blocked"
    assert act["block_reason"].startswith("unavailable"), act["block_reason"]
    assert not await invalid(team, act)


@pytest.mark.parametrize("policy", ["test_churn_planfence", "test_churn_centralized_lineage"])
async def test_a_second_change_during_the_replan_blocks_live(team: Team, policy: str) -> None:
    plan = await start_episode(team, policy)
    await team.call("a0", "update", key="k000", content=b"k000-v2")
    await end_unit(team, 0)
    act = await team.call("a2", "act", action="ship", roots=[plan["root"]], keys=["k000"])
    assert act["outcome"] == "blocked"
    assert act["replans"] == 1
    assert act["block_reason"].startswith("stale after replan"), act["block_reason"]
    head_log = (await team.call("a0", "head_log"))["log"]
    assert [seq for key, seq, _, _ in head_log if key == "k000"] == [1, 2, 3]


async def test_a_forged_head_response_blocks_live(tmp_path: Path) -> None:
    agents = [LIAR, "b1", "b2"]
    owners = key_owners(agents, 3)  # liar: k000, b1: k001, b2: k002
    hosts = {a: (None, "127.0.0.1") for a in agents}
    async with open_team(agents=agents, central=False, hosts=hosts, workdir=tmp_path,
                         campaign_seed=6, connection="fresh", policy="planfence",
                         owners=owners, rpc_timeout_s=5.0, plugins=[PLUGIN]) as t:
        for policy in ("planfence", "planfence_grouped", "batched_all_key",
                       "per_key_all_key", "owner_head_freshness"):
            await t.reset_all(policy=policy)
            for key, owner in owners.items():
                await t.call(owner, "seed", key=key, content=f"{key}-v1".encode())
            # The liar plans on its own key (read locally, so the plan is honest); its
            # answers to the executor name another ID at the sequence the executor holds.
            plan = await t.call(LIAR, "plan", action="x", executor="b2", keys=["k000"])
            act = await t.call("b2", "act", action="x", roots=[plan["root"]],
                               keys=["k000"])
            assert act["outcome"] == "blocked", policy
            assert act["block_reason"].startswith("integrity"), (policy, act["block_reason"])


async def test_a_bogus_announced_head_cannot_wedge_the_key_live(team: Team) -> None:
    """An owner announces k000 at seq 2^62 naming no record: the executor refuses it
    (the owner cannot produce it) and adopts the owner's next honest announcement."""
    plan = await start_episode(team, "metadata_sync")
    bogus = HeadInfo("k000", "a0", 2**62, b"\x66" * 32)
    async with open_rpc_client(identity=team.identity("a0"), roster=team.roster,
                               connection="fresh", counters=Counters()) as owner:
        assert await owner.call("a2", "announce", {"heads": [bogus.to_wire()]}) \
            == {"ack": True}
    act = await team.call("a2", "act", action="ship", roots=[plan["root"]], keys=["k000"])
    assert act["outcome"] == "blocked"
    assert act["block_reason"].startswith("integrity"), act["block_reason"]
    assert "'a0' reported 'k000' seq 4611686018427387904" in act["block_reason"]
    update = await team.call("a0", "update", key="k000", content=b"k000-v2")
    await end_unit(team, 0)  # the barrier announces seq 2
    act = await team.call("a2", "act", action="ship", roots=[plan["root"]], keys=["k000"])
    assert act["outcome"] == "released", act.get("block_reason")
    assert act["inputs"] == {"k000": update["head"]["id"]}
    assert not await invalid(team, act)


async def test_a_commit_at_a_seq_no_record_has_is_refused_live(team: Team) -> None:
    plan = await start_episode(team, "centralized_lineage")
    bogus = HeadInfo("k000", "a0", 2**62, b"\x66" * 32)
    async with open_rpc_client(identity=team.identity("a0"), roster=team.roster,
                               connection="fresh", counters=Counters()) as owner:
        with pytest.raises(PeerUnavailable):
            await owner.call(CENTRAL_ID, "commit", {"heads": [bogus.to_wire()]})
    update = await team.call("a0", "update", key="k000", content=b"k000-v2")
    act = await team.call("a2", "act", action="ship", roots=[plan["root"]], keys=["k000"])
    assert act["outcome"] == "released", act.get("block_reason")
    assert act["inputs"] == {"k000": update["head"]["id"]}
    assert not await invalid(team, act)
