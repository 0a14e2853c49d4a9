"""Budgeted validation (``planfence_budget``): the ranking rules, the budget choice and
the policy on the in-memory team twin.

Team: five agents a0..a4, eight keys k000..k007 owned round-robin (a0: k000, k005;
a1: k001, k006; ...). a1 plans for executor a4 on four keys owned by a0..a3.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.env import ActionOutcome, ActionRequest
from protocols.planning import replacement_plan
from protocols.policies import make_policy
from protocols.policies._budget import (
    ALL,
    BudgetStats,
    choose,
    rank,
    seeded_order,
)
from protocols.policies.base import Policy
from protocols.policies.planfence_budget import PlanFenceBudget
from protocols.policy_params import Param, ParamError
from tests.protocols.memory_env import MemoryTeam

DECLARED = ("k000", "k001", "k002", "k003")


# --- the pure rules -----------------------------------------------------------------------------

def test_the_random_order_is_a_seeded_permutation() -> None:
    order = seeded_order(DECLARED, seed=0, agent="a4", action="act000")
    assert sorted(order) == list(DECLARED)
    assert order == seeded_order(reversed(DECLARED), seed=0, agent="a4",  # type: ignore[arg-type]
                                 action="act000")
    others = {tuple(seeded_order(DECLARED, seed=s, agent="a4", action="act000"))
              for s in range(20)}
    assert len(others) > 5  # the seed matters
    assert {tuple(seeded_order(DECLARED, seed=0, agent="a4", action=f"act{i:03d}"))
            for i in range(20)} != {tuple(order)}  # and so does the action


@pytest.mark.parametrize("budget", [0, 1, 2, 3, 4, 9, ALL])
def test_the_budget_takes_a_prefix_of_the_ranking(budget: int | str) -> None:
    ranked = ["k002", "k000", "k003", "k001"]
    expected = ranked if budget == ALL else ranked[:budget]  # type: ignore[misc]
    assert choose(budget, ranked) == expected


@pytest.mark.parametrize("budget", [-1, "some", True, 1.5])
def test_a_bad_budget_is_refused(budget: object) -> None:
    with pytest.raises(ValueError, match="b: "):
        choose(budget, list(DECLARED))  # type: ignore[arg-type]


def test_random_and_critical_first() -> None:
    order = ["k002", "k000", "k003", "k001"]
    stats = BudgetStats()
    assert rank("random", order, critical="k003", stats=stats, own=(), loss_ms=1) == order
    assert rank("critical_first", order, critical="k003", stats=stats, own=(),
                loss_ms=1) == ["k003", "k002", "k000", "k001"]
    # No declared critical input (or one outside the action): the random order.
    for critical in ("", "k007"):
        assert rank("critical_first", order, critical=critical, stats=stats, own=(),
                    loss_ms=1) == order
    with pytest.raises(ValueError, match="ranking"):
        rank("newest", order, critical="", stats=stats, own=(), loss_ms=1)


def test_recency_ranks_the_latest_seen_change_first_and_seeds_last() -> None:
    order = ["k002", "k000", "k003", "k001"]
    stats = BudgetStats()
    stats.note_version("k001", 1, now=1.0)  # a seed: never changed
    stats.note_version("k003", 2, now=2.0)
    stats.note_version("k000", 3, now=5.0)
    stats.note_version("k000", 3, now=9.0)  # the same version again: still first seen at 5
    stats.note_version("k003", 2, now=7.0)
    assert rank("recency", order, critical="", stats=stats, own=(),
                loss_ms=1) == ["k000", "k003", "k002", "k001"]
    stats.note_version("k003", 4, now=8.0)  # a newer version of k003 seen later
    assert rank("recency", order, critical="", stats=stats, own=(),
                loss_ms=1) == ["k003", "k000", "k002", "k001"]
    assert stats.changed_at("k001") is None


def test_the_change_estimate_pools_keys_with_laplaces_rule() -> None:
    stats = BudgetStats()
    assert stats.pooled() == stats.p_changed("k000") == 0.5  # nothing observed
    for superseded in (True, False, False, False):
        stats.note_check("k000", superseded=superseded)
    stats.note_check("k001", superseded=True)
    pooled = (2 + 1) / (5 + 2)
    assert stats.pooled() == pytest.approx(pooled)
    assert stats.p_changed("k000") == pytest.approx((1 + 2 * pooled) / (4 + 2))
    assert stats.p_changed("k001") == pytest.approx((1 + 2 * pooled) / (1 + 2))
    assert stats.p_changed("k009") == pytest.approx(pooled)  # never checked: the pool


def test_the_cost_is_the_mean_round_trip_and_nothing_for_own_keys() -> None:
    stats = BudgetStats()
    assert stats.cost_ms("k000", own=()) == 0.0  # nothing measured: explore
    stats.note_round_trip(80.0)
    stats.note_round_trip(120.0)
    assert stats.cost_ms("k000", own=()) == 100.0
    assert stats.cost_ms("k000", own={"k000"}) == 0.0


def test_value_funds_only_checks_worth_their_cost_best_net_value_first() -> None:
    order = ["k002", "k000", "k003", "k001"]
    stats = BudgetStats()
    stats.note_round_trip(100.0)
    for _ in range(6):
        stats.note_check("k000", superseded=True)  # changes every time
        stats.note_check("k001", superseded=False)  # never
        stats.note_check("k002", superseded=False)
    p = {k: stats.p_changed(k) for k in order}
    assert p["k000"] > p["k003"] > p["k001"] == p["k002"]
    loss = 400.0
    funded = [k for k in order if p[k] * loss > 100.0]
    assert funded == ["k000", "k003"]  # k001, k002: under 1 in 4 (0.125 * 400 = 50 ms < 100)
    assert rank("value", order, critical="", stats=stats, own=(), loss_ms=loss) == funded
    # An own key costs nothing, so any positive chance funds it, ahead of dearer checks.
    assert rank("value", order, critical="", stats=stats, own={"k001"},
                loss_ms=loss) == ["k000", "k003", "k001"]
    assert rank("value", order, critical="", stats=stats, own=(), loss_ms=0.0) == []
    # Equal net value: the random order breaks the tie.
    fresh = BudgetStats()
    assert rank("value", order, critical="", stats=fresh, own=(), loss_ms=1.0) == order


# --- parameters --------------------------------------------------------------------------------

def test_b_is_an_integer_or_all() -> None:
    assert make_policy("planfence_budget").settings["b"] == ALL
    assert make_policy("planfence_budget/b=3").settings["b"] == 3
    assert make_policy("planfence_budget/b=all").label == "planfence_budget"
    with pytest.raises(ValueError, match=r"b: 'half' is not allowed; allowed: an integer "
                                         r">= 0 or all"):
        make_policy("planfence_budget/b=half")
    with pytest.raises(ValueError, match="ranking: 'oldest' is not allowed; allowed: random, "
                                         "recency, critical_first, value"):
        make_policy("planfence_budget/b=1/ranking=oldest")
    with pytest.raises(ParamError, match="named values must be words"):
        Param("x", "int", 0, named=("All of them",))


def test_categories_follow_the_budget() -> None:
    assert make_policy("planfence_budget").category == Policy.DERIVATION_CURRENT
    assert make_policy("planfence_budget/ranking=recency").category == \
        Policy.DERIVATION_CURRENT
    for spec in ("planfence_budget/b=0", "planfence_budget/b=3",
                 "planfence_budget/ranking=value"):
        assert make_policy(spec).category == Policy.BUDGETED


# --- the policy on the in-memory team ----------------------------------------------------------

async def stale_plan(spec: str, *, changed: tuple[str, ...] = ("k002",), critical: str = ""
                     ) -> tuple[MemoryTeam, ActionRequest]:
    """a1 plans for a4 over DECLARED, then the owners of ``changed`` update them."""
    team = MemoryTeam(n_agents=5, n_keys=8, policy=spec)
    await team.seed_all()
    request = await team.plan("a1", "a4", "act000", DECLARED)
    for key in changed:
        await team.update(key)
    return team, replace(request, critical=critical)


async def test_b_zero_sends_nothing_and_issues_the_stale_plan() -> None:
    team, request = await stale_plan("planfence_budget/b=0")
    mark = len(team.calls)
    outcome = await team.act("a4", request)
    assert outcome.released
    assert outcome.replans == 0
    assert outcome.issued_roots == request.roots
    assert team.count(mark) == outcome.messages == 0
    assert team.invalid(outcome)
    assert outcome.inputs == dict(request.supplied)  # the plan's recorded inputs


async def test_b_all_is_planfence_message_for_message() -> None:
    results = {}
    for spec in ("planfence", "planfence_budget", "planfence_budget/ranking=recency"):
        team, request = await stale_plan(spec, changed=("k002", "k003"))
        mark = len(team.calls)
        outcome = await team.act("a4", request)
        results[spec] = (outcome.released, outcome.replans, outcome.messages,
                         [c.method for c in team.calls[mark:]], team.invalid(outcome))
    assert results["planfence"] == (True, 1, 4 + 2 + 4, results["planfence"][3], False)
    assert len(set(map(repr, results.values()))) == 1


@pytest.mark.parametrize(("critical", "valid"), [("k002", True), ("k000", False)])
async def test_one_check_catches_the_change_only_on_the_checked_input(
        critical: str, valid: bool) -> None:
    team, request = await stale_plan("planfence_budget/b=1/ranking=critical_first",
                                     critical=critical)
    mark = len(team.calls)
    outcome = await team.act("a4", request)
    assert outcome.released
    heads = [c for c in team.calls[mark:] if c.method == "heads"]
    assert {c.dst for c in heads} == {team.roster.owner_of(critical)}
    assert team.invalid(outcome) != valid
    # caught: query, fetch, the replacement's query; missed: the one query
    assert outcome.messages == (3 if valid else 1)
    assert outcome.replans == int(valid)


async def test_a_replan_keeps_the_unchecked_inputs_at_the_newest_local_version() -> None:
    team, request = await stale_plan("planfence_budget/b=1/ranking=critical_first",
                                     critical="k002")
    outcome = await team.act("a4", request)
    assert outcome.replans == 1
    held = {k: team.stores["a4"].latest(k) for k in DECLARED}
    assert outcome.inputs == {k: h.record_id for k, h in held.items() if h is not None}


async def test_random_checks_the_first_b_of_the_seeded_order() -> None:
    order = seeded_order(DECLARED, seed=7, agent="a4", action="act000")
    team, request = await stale_plan("planfence_budget/b=2/seed=7",
                                     changed=(order[0], order[3]))
    mark = len(team.calls)
    outcome = await team.act("a4", request)
    asked = {c.dst for c in team.calls[mark:] if c.method == "heads"}
    assert asked == {team.roster.owner_of(k) for k in order[:2]}
    assert outcome.replans == 1  # order[0] changed and was checked ...
    assert team.invalid(outcome)  # ... order[3] changed too, unchecked


async def test_recency_checks_a_key_seen_above_its_seed_first() -> None:
    team = MemoryTeam(n_agents=5, n_keys=8, policy="planfence_budget/b=1/ranking=recency")
    await team.seed_all()
    await team.update("k003")  # before planning: the executor receives k003 at seq 2
    request = await team.plan("a1", "a4", "act000", DECLARED)
    mark = len(team.calls)
    await team.act("a4", request)
    assert [c.dst for c in team.calls[mark:]] == [team.roster.owner_of("k003")]


async def test_value_checks_nothing_when_an_invalid_action_costs_nothing() -> None:
    team, request = await stale_plan("planfence_budget/ranking=value/loss_ms=0")
    mark = len(team.calls)
    outcome = await team.act("a4", request)
    assert outcome.released
    assert team.count(mark) == 0
    assert team.invalid(outcome)


async def test_the_value_ranking_learns_from_its_checks() -> None:
    team, request = await stale_plan("planfence_budget/ranking=value")
    policy = team.policies["a4"]
    assert isinstance(policy, PlanFenceBudget)
    await team.act("a4", request)
    stats = policy.stats(team.env("a4"))
    assert stats.checks == dict.fromkeys(DECLARED, 1)  # first pass only
    assert stats.changed == {"k000": 0, "k001": 0, "k002": 1, "k003": 0}
    assert stats.rtt_count == 8  # four queries a pass, the replacement's pass timed too


async def test_a_replacement_plan_keeps_the_critical_input() -> None:
    team = MemoryTeam(n_agents=3, n_keys=3)
    await team.seed_all()
    store = team.stores["a0"]
    head = store.head("k000")
    assert head is not None
    request = ActionRequest("act", (b"\x00" * 32,), ("k000",), critical="k000")
    replaced = replacement_plan(team.identities["a0"], store, request,
                                {"k000": head.record_id}, 1)
    assert replaced.critical == "k000"
    assert replaced.declared == ("k000",)
    assert replaced.roots != request.roots


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rate=st.sampled_from([0.5, 1.5, 3.0]))
async def test_the_ends_reproduce_owner_head_freshness_and_planfence(seed: int,
                                                                      rate: float) -> None:
    """Random schedules: b = 0 issues exactly owner-head freshness's invalid actions,
    b = all exactly PlanFence's decisions and messages (none invalid)."""
    runs: dict[str, list[tuple[bool, bool, int]]] = {}
    for spec in ("owner_head_freshness", "planfence_budget/b=0", "planfence",
                 "planfence_budget"):
        rng = random.Random(seed)
        team = MemoryTeam(n_agents=4, n_keys=6, policy=spec)
        await team.seed_all()
        keys = team.roster.keys
        results = []
        for unit in range(12):
            planner, executor = rng.sample(team.agents, 2)
            declared = rng.sample(keys, rng.randint(1, 4))
            request = await team.plan(planner, executor, f"u{unit}", declared)
            for _ in range(int(rate) + (rng.random() < rate - int(rate))):
                await team.update(rng.choice(keys))
            outcome: ActionOutcome = await team.act(executor, request)
            results.append((outcome.released, team.invalid(outcome), outcome.messages))
        runs[spec] = results
    invalid = {spec: [r[1] for r in results] for spec, results in runs.items()}
    assert invalid["planfence_budget/b=0"] == invalid["owner_head_freshness"]
    assert runs["planfence_budget"] == runs["planfence"]
    assert not any(invalid["planfence"])
    assert all(r[2] == 0 for r in runs["planfence_budget/b=0"])


async def test_a_failed_query_is_measured_too() -> None:
    team, request = await stale_plan("planfence_budget/ranking=value")
    team.slow.add("a2")  # the owner of k002 times out
    policy = team.policies["a4"]
    assert isinstance(policy, PlanFenceBudget)
    outcome = await team.act("a4", request)
    assert not outcome.released
    assert outcome.block_reason.startswith("unavailable")
    assert policy.stats(team.env("a4")).rtt_count == 4  # three answers and one failure
