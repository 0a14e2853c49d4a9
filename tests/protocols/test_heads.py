"""Head claims (protocols.heads): adoption, directory order, unproducible heads,
equivocation; and on the in-memory team, a bogus head that cannot wedge a key."""

from __future__ import annotations

import pytest

from protocols.errors import IntegrityError, OwnerRuleError, PeerUnavailable, RemoteCallError
from protocols.heads import (
    EquivocationError,
    adopt_announced,
    check_commit,
    equivocation,
    unproducible,
)
from protocols.identity import Identity
from protocols.records import HeadInfo, make_record
from tests.protocols.memory_env import MemoryTeam

BOGUS_SEQ = 2**62


def head(seq: int, fill: int) -> HeadInfo:
    return HeadInfo("k", "a", seq, bytes([fill]) * 32)


def test_announced_heads_rise_and_a_proven_one_is_never_lowered() -> None:
    assert adopt_announced(None, head(1, 1), proven=False)
    assert adopt_announced(head(1, 1), head(2, 2), proven=True)
    assert not adopt_announced(head(2, 2), head(2, 2), proven=True)
    assert not adopt_announced(head(3, 3), head(2, 2), proven=True)


def test_an_unproven_claim_is_withdrawn_by_the_next_announcement() -> None:
    assert adopt_announced(head(BOGUS_SEQ, 9), head(2, 2), proven=False)


@pytest.mark.parametrize("proven", [True, False])
def test_two_ids_at_one_announced_seq_are_equivocation(proven: bool) -> None:
    with pytest.raises(EquivocationError, match="equivocation by 'a'") as info:
        adopt_announced(head(2, 2), head(2, 3), proven=proven)
    assert (info.value.owner, info.value.key, info.value.seq) == ("a", "k", 2)


def test_commits_come_in_order_from_the_seed() -> None:
    assert check_commit(None, head(1, 1))
    assert check_commit(head(1, 1), head(2, 2))
    assert not check_commit(head(2, 2), head(2, 2))
    for current, new in [(None, head(2, 2)), (head(1, 1), head(BOGUS_SEQ, 9)),
                         (head(3, 3), head(2, 2)), (head(1, 1), head(3, 3))]:
        with pytest.raises(OwnerRuleError, match="out of order"):
            check_commit(current, new)
    with pytest.raises(EquivocationError):
        check_commit(head(2, 2), head(2, 5))


def test_an_unknown_id_from_the_reporter_is_its_fault_a_network_failure_is_not() -> None:
    bogus = head(BOGUS_SEQ, 9)
    err = unproducible(bogus, "a", RemoteCallError("unknown_id", "no record"))
    assert isinstance(err, IntegrityError)
    assert "'a' reported 'k' seq 4611686018427387904" in str(err)
    assert "faulty member" in str(err)
    down = PeerUnavailable("closed")
    assert unproducible(bogus, "a", down) is down
    busy = RemoteCallError("store_failed", "disk full")
    assert unproducible(bogus, "a", busy) is busy


def test_two_signed_records_at_one_version_are_equivocation() -> None:
    owner = Identity.derive("a", 3)
    one = make_record(owner, key="k", owner="a", seq=1, parents=[], rtype="plan",
                      content=b"one")
    two = make_record(owner, key="k", owner="a", seq=1, parents=[], rtype="plan",
                      content=b"two")
    later = make_record(owner, key="k", owner="a", seq=2, parents=[one.id], rtype="plan",
                        content=b"two")
    found = equivocation(one, two)
    assert isinstance(found, EquivocationError)
    assert found.owner == "a"
    assert equivocation(one, one) is None
    assert equivocation(one, later) is None


# --- on the in-memory team ---------------------------------------------------------------------

async def test_a_bogus_announced_head_blocks_then_the_honest_update_is_adopted() -> None:
    team = MemoryTeam(policy="metadata_sync")
    await team.seed_all()
    request = await team.plan("a1", "a2", "act", ["k000"])
    # what serve_announce does with a0's announcement of a head no record has
    team.stores["a2"].set_synced_head(HeadInfo("k000", "a0", BOGUS_SEQ, b"\x66" * 32))
    blocked = await team.act("a2", request)
    assert not blocked.released
    assert blocked.block_reason.startswith("integrity"), blocked.block_reason
    assert "'a0' reported 'k000'" in blocked.block_reason
    update = await team.update("k000")
    await team.unit_end(0)  # the barrier announces seq 2
    assert team.stores["a2"].synced_head("k000") == update
    again = await team.act("a2", request)
    assert again.released, again.block_reason
    assert again.inputs == {"k000": update.record_id}
    assert not team.invalid(again)


async def test_a_commit_out_of_order_is_refused_and_the_directory_keeps_going() -> None:
    team = MemoryTeam(policy="centralized_lineage")
    await team.seed_all()
    request = await team.plan("a1", "a2", "act", ["k000"])
    with pytest.raises(OwnerRuleError, match="out of order"):
        await team.env("a0").central_commit([HeadInfo("k000", "a0", BOGUS_SEQ,
                                                      b"\x66" * 32)])
    update = await team.update("k000")
    outcome = await team.act("a2", request)
    assert outcome.released, outcome.block_reason
    assert outcome.inputs == {"k000": update.record_id}
    assert not team.invalid(outcome)
