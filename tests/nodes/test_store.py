"""Store rules: verification, owner rule, conflicts, superseded retention, durability."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodes.store import SqliteStore
from protocols.errors import ConflictError, IntegrityError, LocalProtocolError, OwnerRuleError
from protocols.heads import EquivocationError
from protocols.identity import Identity, Member, Roster
from protocols.records import HeadInfo, Record, make_record

SEED = 7
A = Identity.derive("a", SEED)
B = Identity.derive("b", SEED)


def roster() -> Roster:
    members = [Member(i.agent_id, i.public_key, "127.0.0.1", 1) for i in (A, B)]
    return Roster.build(members, {"k0": "a", "k1": "b"}, ["a", "b"])


def rec(who: Identity, key: str, seq: int, content: bytes = b"x",
        parents: tuple[bytes, ...] = ()) -> Record:
    return make_record(who, key=key, owner=who.agent_id, seq=seq, parents=parents,
                       rtype="requirement", content=content)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "a.sqlite", agent_id="a", roster=roster())
    yield s
    s.close()


def test_install_and_read_back(store: SqliteStore) -> None:
    r1 = rec(A, "k0", 1)
    r2 = rec(A, "k0", 2, b"y", parents=(r1.id,))
    assert store.install(r1) is True
    assert store.install(r2) is True
    assert store.install(r2) is False  # idempotent
    assert store.get(r2.id) == r2
    assert store.parents(r2.id) == (r1.id,)
    assert store.has(r1.id)
    assert not store.has(b"\0" * 32)
    assert store.latest("k0") == r2.head


def test_owner_head_advances_only_by_increasing_seq(store: SqliteStore) -> None:
    r1, r3, r2 = rec(A, "k0", 1), rec(A, "k0", 3, b"c"), rec(A, "k0", 2, b"b")
    store.install(r1)
    store.install(r3)
    store.install(r2)  # older version arrives late: stored, head stays at 3
    assert store.head("k0") == r3.head
    assert store.get(r2.id) == r2  # superseded versions stay readable
    assert store.latest("k0") == r3.head
    assert [(k, s, i) for k, s, i, _ in store.head_log()] == [("k0", 1, r1.id),
                                                              ("k0", 3, r3.id)]
    times = [t for *_, t in store.head_log()]
    assert times == sorted(times)


def test_heads_only_for_owned_keys(store: SqliteStore) -> None:
    r = rec(B, "k1", 1)
    store.install(r)  # a replica of b's key
    assert store.head("k1") is None
    assert store.latest("k1") == r.head
    assert store.head_log() == []


def test_duplicate_sequence_is_a_conflict_and_not_persisted(store: SqliteStore) -> None:
    store.install(rec(A, "k0", 1, b"one"))
    other = rec(A, "k0", 1, b"two")
    with pytest.raises(ConflictError):
        store.install(other)
    assert not store.has(other.id)
    assert store.record_count() == 1


def test_non_owner_author_rejected(store: SqliteStore) -> None:
    forged = make_record(B, key="k0", owner="b", seq=5, parents=(), rtype="requirement",
                         content=b"evil")
    with pytest.raises(OwnerRuleError):
        store.install(forged)
    claims_owner = make_record(B, key="k0", owner="a", seq=5, parents=(),
                               rtype="requirement", content=b"evil")
    with pytest.raises(OwnerRuleError):
        store.install(claims_owner)
    assert store.record_count() == 0
    assert store.head("k0") is None


def test_bad_signature_and_altered_content_rejected(store: SqliteStore) -> None:
    good = rec(A, "k0", 1)
    bad_sig = dataclasses.replace(good, signature=bytes(64))
    altered = dataclasses.replace(good, content=b"changed")
    for record in (bad_sig, altered):
        with pytest.raises(IntegrityError):
            store.install(record)
    assert store.record_count() == 0


def test_batch_is_all_or_nothing(store: SqliteStore) -> None:
    r1 = rec(A, "k0", 1)
    clash = rec(A, "k0", 1, b"other")
    with pytest.raises(ConflictError):
        store.install_many([r1, rec(B, "k1", 1), clash])
    assert store.record_count() == 0
    assert store.head_log() == []


def test_synced_head_never_lowered_behind_a_held_record(store: SqliteStore) -> None:
    r2 = rec(B, "k1", 2, b"two")
    store.install(r2)  # the announced head is proven: its record is held here
    store.set_synced_head(r2.head)
    store.set_synced_head(HeadInfo("k1", "b", 1, b"\1" * 32))
    assert store.synced_head("k1") == r2.head
    with pytest.raises(EquivocationError, match="equivocation by 'b'"):
        store.set_synced_head(HeadInfo("k1", "b", 2, b"\3" * 32))
    with pytest.raises(OwnerRuleError):
        store.set_synced_head(HeadInfo("k1", "a", 9, b"\4" * 32))
    assert store.synced_head("k1") == r2.head


def test_an_unproven_synced_head_cannot_wedge_the_key(store: SqliteStore) -> None:
    bogus = HeadInfo("k1", "b", 2**62, b"\6" * 32)  # no record has this sequence
    store.set_synced_head(bogus)
    assert store.synced_head("k1") == bogus
    honest = rec(B, "k1", 2, b"two")
    store.set_synced_head(honest.head)  # the owner's next statement replaces the claim
    assert store.synced_head("k1") == honest.head


def test_directory_commit_rules(store: SqliteStore) -> None:
    h1, h2 = HeadInfo("k0", "a", 1, b"\1" * 32), HeadInfo("k0", "a", 2, b"\2" * 32)
    with pytest.raises(OwnerRuleError, match="out of order"):
        store.dir_commit(h2, committer="a")  # the first commit must be the seed
    assert store.dir_commit(h1, committer="a") is True
    assert store.dir_commit(h2, committer="a") is True
    assert store.dir_commit(h2, committer="a") is False  # same again: no-op
    with pytest.raises(OwnerRuleError, match="out of order"):
        store.dir_commit(h1, committer="a")  # a step back
    with pytest.raises(OwnerRuleError, match="out of order"):
        store.dir_commit(HeadInfo("k0", "a", 2**62, b"\5" * 32), committer="a")
    with pytest.raises(OwnerRuleError):
        store.dir_commit(HeadInfo("k0", "a", 3, b"\3" * 32), committer="b")  # not owner
    with pytest.raises(OwnerRuleError):
        store.dir_commit(HeadInfo("k0", "b", 3, b"\3" * 32), committer="b")  # wrong owner
    with pytest.raises(EquivocationError):
        store.dir_commit(HeadInfo("k0", "a", 2, b"\x09" * 32), committer="a")
    assert store.dir_head("k0") == h2
    assert store.dir_commit(HeadInfo("k0", "a", 3, b"\3" * 32), committer="a") is True


def test_a_second_signed_record_at_a_held_seq_is_equivocation(store: SqliteStore) -> None:
    store.install(rec(B, "k1", 1, b"one"))
    planted = rec(B, "k1", 1, b"planted")
    with pytest.raises(EquivocationError, match="equivocation by 'b': 'k1' seq 1") as info:
        store.install(planted)
    assert info.value.owner == "b"
    assert not store.has(planted.id)


@pytest.mark.parametrize(("durability", "level"), [("full", 2), ("normal", 1)])
def test_durability_settings(tmp_path: Path, durability: str, level: int) -> None:
    path = tmp_path / f"{durability}.sqlite"
    s = SqliteStore(path, agent_id="a", roster=roster(), durability=durability)
    assert s.pragma("synchronous") == level
    assert s.pragma("journal_mode") == "wal"
    r = rec(A, "k0", 1)
    s.install(r)
    s.close()
    reopened = SqliteStore(path, agent_id="a", roster=roster(), durability=durability)
    assert reopened.get(r.id) == r
    assert reopened.head("k0") == r.head
    reopened.close()


def test_bad_durability_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(LocalProtocolError, match=r"^durability: 'fast' not one of full, normal$"):
        SqliteStore(tmp_path / "x.sqlite", agent_id="a", roster=roster(), durability="fast")
