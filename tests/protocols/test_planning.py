"""Planning and replanning (protocols.planning) on the in-memory twin: real plan records."""

from __future__ import annotations

import msgpack
import pytest

from protocols.planning import PlanningError, install_batches, plan_content
from protocols.records import MAX_RECORDS_PER_INSTALL, Record, make_record
from tests.protocols.memory_env import MemoryTeam


def _owner_record(team: MemoryTeam, key: str) -> Record:
    store = team.stores[team.roster.owner_of(key)]
    head = store.head(key)
    assert head is not None
    record = store.get(head.record_id)
    assert record is not None
    return record


async def test_a_plan_records_its_inputs_decision_and_digest() -> None:
    team = MemoryTeam(n_agents=3, n_keys=3)
    await team.seed_all(hooks=False)
    request = await team.plan("a0", "a2", "act001", ["k001", "k002"], decision="book:7")
    plan = team.stores["a2"].get(request.roots[0])
    assert plan is not None
    assert (plan.key, plan.owner, plan.seq, plan.rtype) == ("plan/act001", "a0", 0, "plan")
    inputs = [_owner_record(team, k) for k in ("k001", "k002")]
    assert list(plan.parents) == [r.id for r in inputs]
    assert plan.content == plan_content("act001", inputs, "book:7")
    body = msgpack.unpackb(plan.content)
    assert body["action"] == "act001"
    assert body["decision"] == "book:7"
    # the executor holds the whole chain; the planner asked the remote owners only
    for r in inputs:
        assert team.stores["a2"].has(r.id)
    assert {(c.dst, c.method) for c in team.calls} == {("a1", "heads"), ("a2", "heads"),
                                                       ("a1", "fetch"), ("a2", "fetch"),
                                                       ("a2", "install")}


async def test_depth_one_goes_through_a_review_and_replanning_replays() -> None:
    team = MemoryTeam(n_agents=2, n_keys=2)
    await team.seed_all(hooks=False)
    request = await team.plan("a0", "a1", "act002", ["k001"], depth=1)
    plan = team.stores["a1"].get(request.roots[0])
    assert plan is not None
    review = team.stores["a1"].get(plan.parents[0])
    assert review is not None
    assert (review.key, review.rtype) == ("review/act002", "review")
    # planned again: the next version of the same keys
    again = await team.plan("a0", "a1", "act002", ["k001"], depth=1)
    replanned = team.stores["a1"].get(again.roots[0])
    assert replanned is not None
    assert replanned.seq == 1
    head = await team.update("k001")
    new_request = await team.env("a1").replan(again, {"k001": head.record_id})
    replacement = team.stores["a1"].get(new_request.roots[0])
    assert replacement is not None
    assert (replacement.key, replacement.owner) == ("plan/act002/r1", "a1")
    assert list(replacement.parents) == [head.record_id]
    assert msgpack.unpackb(replacement.content)["decision"] == "replay"


async def test_planning_a_key_its_owner_has_no_head_for_is_refused() -> None:
    team = MemoryTeam(n_agents=2, n_keys=2)
    with pytest.raises(PlanningError, match=r"keys: 'k000' has no head at its owner 'a0'"):
        await team.plan("a0", "a1", "act003", ["k000"])


def test_handoffs_are_batched_under_the_frame_cap() -> None:
    team = MemoryTeam(n_agents=1, n_keys=1)
    ident = team.identities["a0"]
    big = [make_record(ident, key=f"x/{i}", owner="a0", seq=0, parents=[], rtype="artifact",
                       content=bytes(300 * 1024)) for i in range(5)]
    batches = install_batches(big)
    assert [len(b) for b in batches] == [2, 2, 1]
    small = [make_record(ident, key=f"y/{i}", owner="a0", seq=0, parents=[], rtype="review",
                         content=b"r") for i in range(MAX_RECORDS_PER_INSTALL + 1)]
    assert [len(b) for b in install_batches(small)] == [MAX_RECORDS_PER_INSTALL, 1]
    assert [r for b in install_batches(big + small) for r in b] == big + small
