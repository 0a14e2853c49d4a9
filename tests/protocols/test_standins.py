"""The native-validator stand-ins on a constructed handoff (paper Tables 1a and G.1).

Team: a0 owns k000 (the requirement); a1 plans, a2 executes. Each scenario is built
like the ``handoff`` study kind builds it (testbed/run/trials.py): the planner reports
the plan's inputs, which travel with the action as the application's version set.
"""

from __future__ import annotations

import pytest

from protocols.env import ActionOutcome
from protocols.policies import describe_policy, make_policy
from protocols.policies.base import Policy
from tests.protocols.memory_env import MemoryTeam

POLICIES = ["session_read_set", "inherited_version_set", "planfence"]
# (detected, issued invalid) per scenario and policy, as Table G.1 reports them.
EXPECTED = {
    "unchanged": {p: (False, False) for p in POLICIES},
    "same_session": {p: (True, False) for p in POLICIES},
    "handoff": {"session_read_set": (False, True), "inherited_version_set": (True, False),
                "planfence": (True, False)},
}


async def run_scenario(policy: str, scenario: str) -> tuple[MemoryTeam, ActionOutcome]:
    team = MemoryTeam(policy=policy)
    await team.seed_all()
    executor = "a2"
    planner = executor if scenario == "same_session" else "a1"
    request = await team.plan(planner, executor, "act", ["k000"])
    if scenario != "unchanged":
        await team.update("k000")  # the owner revises the requirement after planning
    if scenario == "handoff":
        await team.read(executor, ["k000"])  # the later executor has seen the revision
    return team, await team.act(executor, request)


def detected(outcome: ActionOutcome) -> bool:
    return outcome.replans > 0 or outcome.block_reason.startswith("stale")


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
@pytest.mark.parametrize("policy", POLICIES)
async def test_each_validator_detects_exactly_what_the_table_says(policy: str,
                                                                  scenario: str) -> None:
    team, outcome = await run_scenario(policy, scenario)
    want_detected, want_invalid = EXPECTED[scenario][policy]
    assert detected(outcome) == want_detected
    assert outcome.released  # nobody blocks: one refresh and replan repairs every conflict
    assert team.invalid(outcome) == want_invalid


async def test_session_validator_after_a_handoff_holds_fresh_memory_and_a_stale_plan() -> None:
    team, outcome = await run_scenario("session_read_set", "handoff")
    head = team.stores["a0"].head("k000")
    latest = team.stores["a2"].latest("k000")
    assert head is not None
    assert latest is not None
    assert latest.record_id == head.record_id  # memory is current ...
    assert outcome.inputs["k000"] != head.record_id  # ... the issued plan is not


async def test_inherited_set_without_a_supplied_set_has_nothing_to_check() -> None:
    team = MemoryTeam(policy="inherited_version_set")
    await team.seed_all()
    request = await team.plan("a1", "a2", "act", ["k000"])
    await team.update("k000")
    bare = type(request)(request.action, request.roots, request.declared)
    outcome = await team.act("a2", bare)
    assert outcome.released
    assert team.invalid(outcome)


async def test_a_second_change_after_the_refresh_blocks_the_stand_ins() -> None:
    for policy in ("session_read_set", "inherited_version_set"):
        team = MemoryTeam(policy=policy)
        await team.seed_all()
        request = await team.plan("a2", "a2", "act", ["k000"])
        await team.update("k000")

        async def change_again(team: MemoryTeam = team) -> None:
            await team.update("k000")

        team.during_replan = change_again
        outcome = await team.act("a2", request)
        assert not outcome.released
        assert outcome.block_reason.startswith("stale after replan")


def test_stand_ins_are_registered_as_what_they_are() -> None:
    for name in ("session_read_set", "inherited_version_set"):
        info = describe_policy(name)
        assert info.category == Policy.NATIVE_STANDIN
        assert info.needs_central
        assert not info.derivation_current
        assert make_policy(name).title.startswith("Registry check")
