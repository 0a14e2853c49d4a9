"""Every policy on the in-memory team twin: decisions, fail-closed behaviour, message counts.

Team (unless a test says otherwise): agents a0, a1, a2; keys k000..k003 owned
round-robin (a0: k000, k003; a1: k001; a2: k002). a1 plans action "act" for executor
a2 on k000, whose owner is a0.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.env import ActionOutcome, ActionRequest
from protocols.errors import RpcError
from protocols.identity import CENTRAL_ID
from protocols.policies import make_policy, policy_names
from protocols.policies.adaptive import Adaptive, ends_sync, rho_estimates
from protocols.policies.majority_replica import quorum_peers
from protocols.records import HeadInfo
from tests.protocols.memory_env import MemoryTeam

FRESHNESS = ["local_replica", "owner_head_freshness"]
DERIVATION = ["centralized_lineage", "centralized_lineage_own_local", "metadata_sync",
              "per_key_all_key", "batched_all_key", "all_replica", "majority_replica",
              "planfence", "planfence_grouped", "adaptive",
              "planfence_budget"]  # b = all by default (tests/protocols/test_budget.py)
STANDINS = ["session_read_set", "inherited_version_set"]  # tests/protocols/test_standins.py


def test_registry_names_match_the_campaign_names() -> None:
    names = [n for n in policy_names() if not n.startswith("test_")]  # test plugins
    assert sorted(FRESHNESS + DERIVATION + STANDINS) == names
    for name in names:
        policy = make_policy(name)
        assert policy.label == name
        assert policy.derivation_current == (name in DERIVATION)
    assert make_policy("metadata_sync/8").label == "metadata_sync/8"
    assert make_policy("centralized_lineage").needs_central
    with pytest.raises(ValueError, match="unknown"):
        make_policy("nonsense")


async def team_with_plan(policy: str, **kw: object) -> tuple[MemoryTeam, ActionRequest]:
    team = MemoryTeam(policy=policy, **kw)  # type: ignore[arg-type]
    await team.seed_all()
    request = await team.plan("a1", "a2", "act", ["k000"])
    return team, request


async def relevant_update(team: MemoryTeam, unit: int = 0) -> HeadInfo:
    head = await team.update("k000")
    await team.unit_end(unit)
    return head


# --- the stale-plan race ----------------------------------------------------------------------

@pytest.mark.parametrize("policy", FRESHNESS)
async def test_freshness_controls_issue_the_stale_plan(policy: str) -> None:
    team, request = await team_with_plan(policy)
    head = await relevant_update(team)
    outcome = await team.act("a2", request)
    assert outcome.released
    assert outcome.replans == 0
    assert outcome.issued_roots == request.roots
    assert team.invalid(outcome)
    fresh = team.stores["a2"].latest("k000")
    assert fresh is not None
    assert (fresh.record_id == head.record_id) == (policy == "owner_head_freshness")


@pytest.mark.parametrize("policy", DERIVATION)
async def test_derivation_current_policies_replan_once_and_issue_a_current_plan(
        policy: str) -> None:
    team, request = await team_with_plan(policy)
    head = await relevant_update(team)
    outcome = await team.act("a2", request)
    assert outcome.released, outcome.block_reason
    assert outcome.replans == 1
    assert outcome.issued_roots != request.roots
    assert outcome.inputs == {"k000": head.record_id}
    assert not team.invalid(outcome)


@pytest.mark.parametrize("policy", [*FRESHNESS, *DERIVATION])
async def test_an_unchanged_plan_is_released_without_replanning(policy: str) -> None:
    team, request = await team_with_plan(policy)
    await team.unit_end(0)
    outcome = await team.act("a2", request)
    assert outcome.released
    assert outcome.replans == 0
    assert outcome.issued_roots == request.roots
    assert not team.invalid(outcome)


@pytest.mark.parametrize("k", [2, 4, 8, 16])
async def test_metadata_sync_with_k_above_one_issues_invalid_actions(k: int) -> None:
    team, request = await team_with_plan(f"metadata_sync/{k}")
    await relevant_update(team, unit=0)  # no barrier after unit 0 when K > 1
    outcome = await team.act("a2", request)
    assert outcome.released
    assert outcome.replans == 0
    assert team.invalid(outcome)
    # ...and after the K-th unit the barrier announces, and the next action is current
    for unit in range(1, k):
        await team.unit_end(unit)
    again = await team.act("a2", request)
    assert again.released
    assert again.replans == 1
    assert not team.invalid(again)


async def test_metadata_sync_barrier_announces_once_per_peer_and_coalesces() -> None:
    team, _ = await team_with_plan("metadata_sync/2")
    mark = len(team.calls)
    await team.update("k000")
    await team.update("k003")
    await team.update("k000")
    await team.unit_end(0)
    assert team.count(mark) == 0  # queued, nothing sent yet
    await team.unit_end(1)
    assert team.count(mark, "announce") == 2  # one per other agent, both keys in it
    assert team.stores["a1"].synced_head("k000") == team.stores["a0"].head("k000")
    assert team.stores["a2"].synced_head("k003") == team.stores["a0"].head("k003")


# --- fail closed ---------------------------------------------------------------------------------

# What each derivation-current policy cannot do without (after a relevant update).
EVIDENCE_SOURCE = {
    "centralized_lineage": CENTRAL_ID,  # the directory
    "centralized_lineage_own_local": CENTRAL_ID,
    "metadata_sync": "a0",  # the owner, for the changed content
    "per_key_all_key": "a0",
    "batched_all_key": "a0",
    "all_replica": "a1",  # any replica (read-all)
    "majority_replica": quorum_peers(("a0", "a1", "a2"), "a2")[0],
    "planfence": "a0",
    "planfence_grouped": "a0",
    "adaptive": "a0",
    "planfence_budget": "a0",
}


@pytest.mark.parametrize("policy", DERIVATION)
@pytest.mark.parametrize("failure", ["down", "slow"])
async def test_unavailable_evidence_blocks(policy: str, failure: str) -> None:
    team, request = await team_with_plan(policy)
    await relevant_update(team)
    getattr(team, failure).add(EVIDENCE_SOURCE[policy])
    outcome = await team.act("a2", request)
    assert not outcome.released
    assert outcome.block_reason.startswith("unavailable")
    assert outcome.replans == 0


async def test_killed_owner_blocks_even_an_unchanged_plan_under_planfence() -> None:
    team, request = await team_with_plan("planfence")
    team.down.add("a0")
    outcome = await team.act("a2", request)
    assert not outcome.released
    assert "PeerUnavailable" in outcome.block_reason


OWNER_QUERYING = ["per_key_all_key", "batched_all_key", "planfence", "planfence_grouped",
                  "owner_head_freshness"]


def _rewrite_heads(fn: object) -> object:
    def rewrite(answer: dict[str, HeadInfo]) -> dict[str, HeadInfo]:
        return {k: fn(h) for k, h in answer.items()}  # type: ignore[operator]
    return rewrite


FORGERIES = {
    "wrong_owner": lambda h: HeadInfo(h.key, "a1", h.seq, h.record_id),
    "wrong_key": lambda h: HeadInfo("k001", h.owner, h.seq, h.record_id),
    "same_seq_other_id": lambda h: HeadInfo(h.key, h.owner, h.seq, b"\x07" * 32),
    "rolled_back": lambda h: HeadInfo(h.key, h.owner, 0, h.record_id),
    "unknown_newer": lambda h: HeadInfo(h.key, h.owner, h.seq + 5, b"\x09" * 32),
}


@pytest.mark.parametrize("policy", OWNER_QUERYING)
@pytest.mark.parametrize("forgery", sorted(FORGERIES))
async def test_forged_head_response_blocks(policy: str, forgery: str) -> None:
    team, request = await team_with_plan(policy)
    await relevant_update(team)
    team.forge[("a0", "heads")] = _rewrite_heads(FORGERIES[forgery])  # type: ignore[assignment]
    outcome = await team.act("a2", request)
    assert not outcome.released, forgery
    assert outcome.block_reason.split(":")[0] in {"integrity", "unavailable", "evidence"}
    assert not team.invalid(outcome)


async def test_forged_directory_and_synced_answers_block() -> None:
    team, request = await team_with_plan("centralized_lineage")
    await relevant_update(team)
    team.forge[(CENTRAL_ID, "dir_heads")] = _rewrite_heads(  # type: ignore[assignment]
        FORGERIES["wrong_owner"])
    assert not (await team.act("a2", request)).released


async def test_forged_record_content_blocks() -> None:
    team, request = await team_with_plan("planfence")
    await relevant_update(team)
    decoy = team.stores["a0"].get(team.stores["a0"].head("k003").record_id)  # type: ignore[union-attr]
    team.forge[("a0", "fetch")] = lambda _record: decoy
    outcome = await team.act("a2", request)
    assert not outcome.released
    assert outcome.block_reason.startswith("integrity")


async def test_all_replica_blocks_on_a_replica_ahead_of_the_owner() -> None:
    team, request = await team_with_plan("all_replica")
    team.forge[("a1", "versions")] = _rewrite_heads(  # type: ignore[assignment]
        lambda h: HeadInfo(h.key, h.owner, h.seq + 1, b"\x05" * 32))
    outcome = await team.act("a2", request)
    assert not outcome.released
    assert "inconsistent with the owner" in outcome.block_reason


async def test_majority_replica_blocks_on_disagreeing_replicas() -> None:
    team, request = await team_with_plan("majority_replica")
    team.forge[("a0", "versions")] = _rewrite_heads(  # type: ignore[assignment]
        lambda h: HeadInfo(h.key, h.owner, h.seq, b"\x05" * 32))
    outcome = await team.act("a2", request)
    assert not outcome.released
    assert outcome.block_reason.startswith("integrity")


@pytest.mark.parametrize("policy", DERIVATION)
async def test_a_second_change_during_the_replan_is_fetched_then_blocks(policy: str) -> None:
    team, request = await team_with_plan(policy)
    await relevant_update(team)
    second: list[HeadInfo] = []

    async def change_again() -> None:
        second.append(await relevant_update(team, unit=1))  # update, then a barrier

    team.during_replan = change_again
    outcome = await team.act("a2", request)
    assert not outcome.released
    assert outcome.replans == 1
    assert outcome.block_reason.startswith("stale after replan")
    assert team.stores["a2"].has(second[0].record_id)  # fetched before the block (C.3)
    assert not team.invalid(outcome)


async def test_policies_never_raise_rpc_errors_out_of_validate() -> None:
    for policy in DERIVATION:
        team, request = await team_with_plan(policy)
        await relevant_update(team)
        team.down.update({"a0", "a1", CENTRAL_ID})
        try:
            outcome = await team.act("a2", request)
        except RpcError as exc:  # pragma: no cover - the assertion below explains
            pytest.fail(f"{policy} raised {exc!r}")
        assert not outcome.released


async def test_missing_plan_ancestry_blocks_before_any_query() -> None:
    team, _ = await team_with_plan("planfence")
    mark = len(team.calls)
    outcome = await team.act("a2", ActionRequest("act", (b"\x01" * 32,), ("k000",)))
    assert not outcome.released
    assert outcome.block_reason.startswith("evidence")
    assert team.count(mark) == 0


# --- message counts (docs/policies.md, "Messages per action") ------------------------------------

def per_pass_requests(policy: str, team: MemoryTeam, executor: str,
                      declared: list[str]) -> int:
    """Requests of one validation pass, as docs/policies.md states them."""
    roster = team.roster
    remote = [k for k in declared if roster.owner_of(k) != executor]
    owners_all = {o for o in roster.owners.values() if o != executor}
    return {
        "local_replica": 0,
        "owner_head_freshness": len(remote),
        "planfence": len(remote),
        "planfence_budget": len(remote),
        "planfence_grouped": len({roster.owner_of(k) for k in remote}),
        "per_key_all_key": len([k for k in roster.keys if roster.owner_of(k) != executor]),
        "batched_all_key": len(owners_all),
        "all_replica": len(team.agents) - 1,
        "majority_replica": len(team.agents) // 2 if remote else 0,
        "centralized_lineage": 1,  # every declared key through the directory
        "centralized_lineage_own_local": 1 if remote else 0,
        "metadata_sync": 0,
        "adaptive": 0,
    }[policy]


@pytest.mark.parametrize("policy", [*FRESHNESS, *DERIVATION])
async def test_messages_per_action_match_the_docs(policy: str) -> None:
    # Five agents, eight keys (a0..a4 own k000..k007 round-robin), d = 3 over 2 owners.
    team = MemoryTeam(n_agents=5, n_keys=8, policy=policy)
    await team.seed_all()
    declared = ["k000", "k005", "k003"]  # owners a0, a0, a3; executor a2
    request = await team.plan("a1", "a2", "act", declared)
    mark = len(team.calls)
    outcome = await team.act("a2", request)
    q = per_pass_requests(policy, team, "a2", declared)
    assert outcome.released
    assert outcome.replans == 0
    assert team.count(mark) == outcome.messages == q

    # A relevant update to two declared keys: two passes and two fetches.
    await team.update("k000")
    await team.update("k003")
    await team.unit_end(0)
    request = await team.plan("a1", "a2", "act2", declared)
    await team.update("k005")
    await team.update("k003")
    await team.unit_end(1)
    mark = len(team.calls)
    outcome = await team.act("a2", request)
    changed_keys = ["k005", "k003"]
    if policy == "majority_replica":  # the executor may be in the owner's write quorum
        changed_keys = [k for k in changed_keys if "a2" not in quorum_peers(
            tuple(team.agents), team.roster.owner_of(k))]
    fetches = 0 if policy == "local_replica" else len(changed_keys)
    passes = 1 if policy in FRESHNESS else 2
    assert team.count(mark, "fetch") == fetches
    assert team.count(mark) == outcome.messages == passes * q + fetches


async def test_grouped_and_batched_tie_at_full_scope_while_per_key_pays_per_key() -> None:
    counts = {}
    for policy in ("planfence", "planfence_grouped", "batched_all_key"):
        team = MemoryTeam(n_agents=3, n_keys=6, policy=policy)
        await team.seed_all()
        request = await team.plan("a1", "a2", "act", team.roster.keys)
        counts[policy] = (await team.act("a2", request)).messages
    assert counts["planfence"] == 4  # the 4 keys a2 does not own
    assert counts["planfence_grouped"] == counts["batched_all_key"] == 2


async def test_on_update_work_per_policy() -> None:
    """Timed hooks send what the docs say: one commit, a quorum push, or announcements."""
    sent = {}
    for policy in ("centralized_lineage", "majority_replica", "adaptive", "planfence",
                   "metadata_sync"):
        team = MemoryTeam(n_agents=5, n_keys=5, policy=policy)
        await team.seed_all()
        mark = len(team.calls)
        await team.update("k000")
        sent[policy] = [c.method for c in team.calls[mark:]]
    assert sent["centralized_lineage"] == ["commit"]
    assert sent["majority_replica"] == ["install", "install"]
    assert sent["adaptive"] == ["announce"] * 4
    assert sent["planfence"] == sent["metadata_sync"] == []


# --- depth and owner-executor cases ---------------------------------------------------------------

@pytest.mark.parametrize("policy", DERIVATION)
async def test_multi_hop_plan_via_review(policy: str) -> None:
    team = MemoryTeam(policy=policy)
    await team.seed_all()
    request = await team.plan("a1", "a2", "act", ["k000"], depth=1)
    head = await relevant_update(team)
    outcome = await team.act("a2", request)
    assert outcome.released
    assert outcome.replans == 1
    assert outcome.inputs == {"k000": head.record_id}


@pytest.mark.parametrize("policy", DERIVATION)
async def test_executor_owning_the_key_uses_its_own_head(policy: str) -> None:
    team = MemoryTeam(policy=policy)
    await team.seed_all()
    request = await team.plan("a1", "a0", "act", ["k000"])
    await relevant_update(team)
    outcome = await team.act("a0", request)
    assert outcome.released
    assert outcome.replans == 1
    assert not team.invalid(outcome)


@pytest.mark.parametrize(("policy", "directory_reads"), [
    ("centralized_lineage", 2), ("centralized_lineage_own_local", 0)])
async def test_centralized_lineage_asks_the_directory_for_the_executors_own_keys(
        policy: str, directory_reads: int) -> None:
    """The paper's reading: validation goes through the shared service for every key,
    the executor's own ones included; the earlier reading skipped it for those."""
    team = MemoryTeam(policy=policy)
    await team.seed_all()
    request = await team.plan("a1", "a0", "act", ["k000"])  # a0 owns k000 and executes
    await relevant_update(team)
    mark = len(team.calls)
    outcome = await team.act("a0", request)
    assert outcome.released
    assert outcome.replans == 1
    assert team.count(mark, "dir_heads") == directory_reads  # one per pass, or none
    assert not team.invalid(outcome)


# --- metadata sync without on_seed, centralized lineage without on_seed ---------------------------

async def test_adaptive_without_seed_announcements_needs_no_owner_query() -> None:
    team = MemoryTeam(policy="adaptive")
    await team.seed_all(hooks=False)
    unchanged = await team.plan("a1", "a2", "same", ["k003"])
    request = await team.plan("a1", "a2", "act", ["k000"])
    await relevant_update(team)
    mark = len(team.calls)
    for req in (unchanged, request):
        outcome = await team.act("a2", req)
        assert outcome.released
        assert not team.invalid(outcome)
    assert team.count(mark, "heads") == 0


@pytest.mark.parametrize("policy", ["centralized_lineage", "centralized_lineage_own_local"])
async def test_keys_never_announced_or_committed_fall_back_to_the_owner(policy: str) -> None:
    team = MemoryTeam(policy=policy)
    await team.seed_all(hooks=False)
    request = await team.plan("a1", "a2", "act", ["k000"])
    mark = len(team.calls)
    outcome = await team.act("a2", request)
    assert outcome.released
    assert team.count(mark, "heads") == 1


@pytest.mark.parametrize("k", [1, 4])
async def test_metadata_sync_without_seed_announcements_behaves_as_if_seeds_were_synced(
        k: int) -> None:
    team = MemoryTeam(policy=f"metadata_sync/{k}")
    await team.seed_all(hooks=False)
    request = await team.plan("a1", "a2", "act", ["k000"])
    await relevant_update(team)
    mark = len(team.calls)
    outcome = await team.act("a2", request)
    assert outcome.released
    assert team.count(mark, "heads") == 0  # never an owner query
    assert team.invalid(outcome) == (k > 1)


# --- adaptive ------------------------------------------------------------------------------------

async def test_adaptive_stays_in_sync_mode_at_low_rates() -> None:
    team, request = await team_with_plan("adaptive")
    for unit in range(30):
        await team.unit_end(unit)
    await team.update("k000")
    mark = len(team.calls)
    outcome = await team.act("a2", request)
    assert outcome.released
    assert outcome.replans == 1
    assert not team.invalid(outcome)
    assert team.count(mark, "heads") == 0  # synced view used, no owner query
    for agent in team.agents:
        policy = team.policies[agent]
        assert isinstance(policy, Adaptive)
        assert policy.sync_mode


async def test_adaptive_switches_every_agent_at_the_same_announcement() -> None:
    team, request = await team_with_plan("adaptive")
    for unit in range(7):
        await team.update("k001" if unit % 2 else "k000")
        await team.unit_end(unit)
    modes = {a: p.sync_mode for a, p in team.policies.items() if isinstance(p, Adaptive)}
    assert modes == dict.fromkeys(team.agents, True)  # warm-up: no switch before unit 7
    await team.update("k002")  # owner a2; rate 8 updates / 8 units: rho clearly above 1
    switched = {a: p.sync_mode for a, p in team.policies.items() if isinstance(p, Adaptive)}
    assert switched == {"a0": True, "a1": True, "a2": False}  # the others see it at unit end
    await team.unit_end(7)
    after = {a: p.sync_mode for a, p in team.policies.items() if isinstance(p, Adaptive)}
    assert after == dict.fromkeys(team.agents, False)
    mark = len(team.calls)
    await team.update("k000")  # no longer announced
    assert team.count(mark) == 0
    outcome = await team.act("a2", request)
    assert outcome.released
    assert not team.invalid(outcome)
    assert team.count(mark, "heads") == 2  # PlanFence mode: queried before and after replan


def test_adaptive_estimator_inverts_the_workload_layout() -> None:
    # rho = 4 at T = 64: 11 actions, 42 updates (testbed/workload.py rule 4).
    point, low = rho_estimates(42, 63)
    assert 3.5 < point < 4.5
    assert low < point
    assert rho_estimates(7, 63)[0] < 0.3  # rho = 0.25: 7 updates
    assert not ends_sync((("k000", 1 + 7),), 6)  # warm-up: never before unit 7
    assert ends_sync((("k000", 1 + 3), ("k001", 1 + 2)), 7)  # 5 updates in 8 units
    assert not ends_sync((("k000", 1 + 4),), 7)  # 4 in 8: rho_lo <= 1, stay in sync


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rate=st.sampled_from([0.1, 0.5, 1.5, 3.0]))
async def test_adaptive_never_releases_what_the_derivation_check_would_block(
        seed: int, rate: float) -> None:
    """Random schedules at several update rates: every released action is current, and
    adaptive releases exactly when PlanFence does on the same schedule."""
    outcomes: dict[str, list[ActionOutcome]] = {}
    for policy in ("adaptive", "planfence"):
        rng = random.Random(seed)
        team = MemoryTeam(n_agents=4, n_keys=4, policy=policy)
        await team.seed_all()
        keys = team.roster.keys
        results = []
        for unit in range(24):
            pending = []
            for i in range(2):
                planner, executor = rng.sample(team.agents, 2)
                declared = rng.sample(keys, rng.randint(1, 2))
                pending.append((executor, await team.plan(planner, executor,
                                                          f"u{unit}a{i}", declared)))
            for _ in range(int(rate) + (rng.random() < rate - int(rate))):
                await team.update(rng.choice(keys))
            for executor, request in pending:
                outcome = await team.act(executor, request)
                assert not team.invalid(outcome)
                results.append(outcome)
            await team.unit_end(unit)
        outcomes[policy] = results
    assert [o.released for o in outcomes["adaptive"]] == \
        [o.released for o in outcomes["planfence"]]
