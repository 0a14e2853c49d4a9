"""Invariants of the seeded schedule generator (testbed/workload.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.campaign.workload import (
    ARTIFACT_BYTES,
    COMPACT_BYTES,
    DERIVATIONS,
    FAMILIES,
    Act,
    Plan,
    Schedule,
    Update,
    WorkloadError,
    describe_template,
    generate_schedule,
    realised_counts,
    round_robin_templates,
    template_family,
    template_ids,
)
from tests.protocols.memory_env import MemoryTeam


def _schedule(**overrides: object) -> Schedule:
    params: dict[str, object] = {"seed": 7, "family": "reservation",
                                 "template": "reservation-03"}
    params.update(overrides)
    return generate_schedule(**params)  # type: ignore[arg-type]


def _windows(s: Schedule) -> dict[str, tuple[Plan, Act, list[Update]]]:
    """Per action: its plan, its act and the updates between them."""
    plans = {p.action: p for p in s.plans()}
    acts = {a.action: a for a in s.acts()}
    return {a: (plans[a], acts[a], [u for u in s.updates()
                                    if plans[a].unit < u.unit < acts[a].unit])
            for a in plans}


def _check_invariants(s: Schedule) -> None:
    units = [e.unit for e in s.events]
    assert units == sorted(set(units)), "one event per unit, in unit order"
    assert all(0 <= u < s.units for u in units)
    assert len(s.plans()) == len(s.acts()) == s.counts.actions
    assert len(s.updates()) == s.counts.updates
    assert len(s.seeds) == len(s.keys)
    assert {x.key for x in s.seeds} == set(s.keys)
    for seed in s.seeds:
        assert seed.owner == s.owners[seed.key]
    for update in s.updates():
        assert update.owner == s.owners[update.key], "only the owner writes a key"
    for plan, act, _ in _windows(s).values():
        assert plan.unit < act.unit
        assert plan.executor == act.executor
        assert plan.executor != plan.planner
        assert plan.keys == act.keys
        assert len(set(plan.keys)) == s.deps
        assert set(plan.keys) <= set(s.keys)
        assert plan.depth in (0, 1)
        assert plan.depth == s.depth
        assert plan.planner in s.agents
        assert plan.executor in s.agents


@pytest.mark.parametrize(("rho", "actions", "updates"),
                         [(0.25, 28, 7), (1, 21, 21), (4, 11, 42), (16, 4, 56)])
def test_counts_at_64_units_match_the_paper(rho: float, actions: int, updates: int) -> None:
    assert realised_counts(64, rho) == (actions, updates)
    s = _schedule(rho=rho)
    assert s.counts == (actions, updates)
    _check_invariants(s)


@pytest.mark.parametrize(("units", "actions"), [(16, 3), (64, 11), (256, 43)])
def test_protected_actions_scale_with_the_horizon(units: int, actions: int) -> None:
    s = _schedule(units=units, rho=4)
    assert s.counts.actions == actions
    _check_invariants(s)


@pytest.mark.parametrize("rho", [1, 4, 16])
@pytest.mark.parametrize("template", ["reservation-01", "fulfillment-05", "deployment-10"])
def test_relevant_update_between_planning_and_every_action(rho: float, template: str) -> None:
    s = _schedule(family=template_family(template), template=template, rho=rho, keys=32)
    for action, (plan, _, between) in _windows(s).items():
        assert any(u.key in plan.keys for u in between), action


def test_at_low_rate_some_actions_see_no_relevant_update() -> None:
    s = _schedule(rho=0.25, keys=8)
    seen = [any(u.key in p.keys for u in between) for p, _, between in _windows(s).values()]
    assert sum(seen) == s.counts.updates == 7
    assert not all(seen)


def test_same_inputs_same_schedule_and_digest() -> None:
    a, b = _schedule(rho=1, tier="artifact"), _schedule(rho=1, tier="artifact")
    assert a == b
    assert a.digest == b.digest


@pytest.mark.parametrize("change", [{"seed": 8}, {"rho": 16}, {"keys": 16}, {"deps": 2},
                                    {"agents": 3}, {"units": 32}, {"tier": "artifact"},
                                    {"template": "reservation-04"}])
def test_any_input_change_changes_the_digest(change: dict[str, object]) -> None:
    assert _schedule(**change).digest != _schedule().digest


def test_owners_round_robin_and_unique() -> None:
    s = _schedule(agents=3, keys=128)
    assert s.keys[0] == "k000"
    assert s.keys[-1] == "k127"
    assert s.agents == ("a0", "a1", "a2")
    assert all(s.owners[f"k{i:03d}"] == f"a{i % 3}" for i in range(128))


@pytest.mark.parametrize(("tier", "bounds"), [("compact", COMPACT_BYTES),
                                              ("artifact", ARTIFACT_BYTES)])
def test_content_sizes_follow_the_tier(tier: str, bounds: tuple[int, int]) -> None:
    s = _schedule(tier=tier)
    contents = [x.content for x in s.seeds] + [u.content for u in s.updates()]
    assert all(bounds[0] <= len(c) <= bounds[1] for c in contents)
    assert len(set(contents)) == len(contents), "every version has distinct content"
    rtypes = {x.rtype for x in s.seeds} | {u.rtype for u in s.updates()}
    assert rtypes == {"requirement" if tier == "compact" else "artifact"}


def test_templates_fix_structure_independent_of_seed() -> None:
    ids = template_ids()
    assert len(ids) == 30
    assert ids[0] == "reservation-01"
    assert ids[-1] == "deployment-10"
    shapes = [describe_template(t) for t in ids]
    assert {s.depth for s in shapes} == {0, 1}
    assert describe_template("fulfillment-07") == describe_template("fulfillment-07")
    assert _schedule(seed=1).depth == _schedule(seed=2).depth
    for shape in shapes:
        lo, hi = shape.compact_bytes
        assert COMPACT_BYTES[0] <= lo <= hi <= COMPACT_BYTES[1]


def test_round_robin_templates_take_one_per_family_first() -> None:
    assert round_robin_templates(3) == ["reservation-01", "fulfillment-01", "deployment-01"]
    assert [template_family(t) for t in round_robin_templates(30)].count("deployment") == 10


@pytest.mark.parametrize(("params", "message"), [
    ({"family": "shipping"}, "family: 'shipping' is not allowed; allowed: reservation, "
                             "fulfillment, deployment"),
    ({"template": "fulfillment-02"}, "template: 'fulfillment-02' is not a reservation template"),
    ({"template": "reservation-11"}, "template: 'reservation-11' is not allowed"),
    ({"tier": "huge"}, "tier: 'huge' is not allowed; allowed: compact, artifact"),
    ({"deps": 9}, "deps: 9 is not allowed; allowed: 1..keys (8)"),
    ({"agents": 1}, "agents: 1 is not allowed; allowed: 2..10000"),
    ({"keys": 129}, "keys: 129 is not allowed; allowed: 1..128"),
    ({"rho": 0}, "rho: 0 is not allowed"),
])
def test_bad_parameters_give_one_line_errors(params: dict[str, object], message: str) -> None:
    with pytest.raises(WorkloadError) as info:
        _schedule(**params)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


@settings(max_examples=60, derandomize=True, deadline=None)
@given(seed=st.integers(0, 2**32), family=st.sampled_from(FAMILIES),
       number=st.integers(1, 10), agents=st.integers(2, 8), keys=st.integers(1, 128),
       units=st.integers(4, 300), rho=st.sampled_from([0.25, 1.0, 4.0, 16.0]),
       deps_frac=st.floats(0, 1))
def test_invariants_hold_for_any_parameters(seed: int, family: str, number: int, agents: int,
                                            keys: int, units: int, rho: float,
                                            deps_frac: float) -> None:
    deps = max(1, round(deps_frac * keys))
    s = generate_schedule(seed=seed, family=family, template=f"{family}-{number:02d}",
                          agents=agents, keys=keys, units=units, deps=deps, rho=rho)
    _check_invariants(s)
    assert s.counts == realised_counts(units, rho)
    if s.counts.updates >= s.counts.actions:
        for plan, _, between in _windows(s).values():
            assert any(u.key in plan.keys for u in between)


async def test_direct_derivation_records_the_requirement_as_the_plans_parent() -> None:
    """The cost campaigns' default (paper section 4: "a single declared key and a direct
    parent"): every plan's recorded parent is the requirement it read; ``template``
    keeps the templates' own depths (half of them derive through a review)."""
    depths = {d: {p.depth for t in template_ids() for p in generate_schedule(
        seed=3, family=template_family(t), template=t, derivation=d).plans()}
        for d in DERIVATIONS}
    assert depths == {"direct": {0}, "template": {0, 1}}
    reviewed = sum(describe_template(t).depth for t in template_ids())
    assert reviewed == 15
    schedule = generate_schedule(seed=3, family="deployment", template="deployment-01",
                                 agents=3, keys=4)
    team = MemoryTeam()
    await team.seed_all()
    for plan in schedule.plans()[:3]:
        request = await team.plan(plan.planner, plan.executor, plan.action, plan.keys,
                                  depth=plan.depth)
        (root,) = request.roots
        record = team.stores[plan.executor].get(root)
        assert record is not None
        owner = team.roster.owner_of(plan.keys[0])
        head = team.stores[owner].head(plan.keys[0])
        assert head is not None
        assert record.parents == (head.record_id,)
        assert record.rtype == "plan"


def test_direct_and_template_schedules_differ_only_in_the_plans_depth() -> None:
    for t in template_ids():
        direct = generate_schedule(seed=3, family=template_family(t), template=t)
        old = generate_schedule(seed=3, family=template_family(t), template=t,
                                derivation="template")
        assert [e for e in direct.events if not hasattr(e, "depth")] == \
            [e for e in old.events if not hasattr(e, "depth")]
        assert (direct.digest == old.digest) == (describe_template(t).depth == 0)


# --- the declared critical input (rule 7) ----------------------------------------------------

# Digests recorded on main (3954dff) before actions declared a critical input: the
# declaration takes nothing from the schedule's stream and is not part of the digest.
_DIGESTS_BEFORE_CRITICAL = {
    ("reservation-01", 4.0, 1): "fa6d1b5b9bf8c27259490bf497e5ec43",
    ("fulfillment-02", 1.0, 4): "e4ac8a2c712dacabc9486e8b6f23befa",
    ("deployment-03", 0.25, 2): "9f023a535b3ce2b76a858dea5db8914f",
}


@pytest.mark.parametrize(("template", "rho", "deps"), sorted(_DIGESTS_BEFORE_CRITICAL))
def test_declaring_critical_inputs_left_every_schedule_as_it_was(
        template: str, rho: float, deps: int) -> None:
    s = generate_schedule(seed=20260101, family=template_family(template), template=template,
                          rho=rho, deps=deps)
    assert s.digest == _DIGESTS_BEFORE_CRITICAL[(template, rho, deps)]
    assert all(a.critical for a in s.acts())


def test_every_action_declares_one_of_its_inputs_critical_from_the_seed() -> None:
    s = _schedule(deps=4, rho=1)
    assert all(a.critical in a.keys for a in s.acts())
    assert [a.critical for a in s.acts()] == [a.critical for a in _schedule(deps=4, rho=1).acts()]
    other = _schedule(deps=4, rho=1, seed=8)
    assert [a.critical for a in other.acts()] != [a.critical for a in s.acts()]
    # Spread over the declared keys (its own draw), not always the first or the last.
    picks = [a.keys.index(a.critical) for t in template_ids()[:10]
             for a in _schedule(deps=4, rho=1, template=t,
                                family=template_family(t)).acts()]
    assert set(picks) == {0, 1, 2, 3}


def test_the_critical_input_is_not_the_key_the_relevant_update_writes() -> None:
    """Rule 7: the declaration is independent of the updates (about 1 in d agree)."""
    agree = total = 0
    for t in template_ids():
        s = _schedule(deps=4, rho=1, template=t, family=template_family(t))
        for _, act, between in _windows(s).values():
            relevant = [u.key for u in between if u.key in act.keys]
            total += 1
            agree += act.critical in relevant
    assert 0.1 < agree / total < 0.45
