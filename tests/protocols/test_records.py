"""Records: canonical encoding, IDs, signatures, wire decoding (protocols.records)."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols import wire
from protocols.errors import IntegrityError, OwnerRuleError, RemoteProtocolError
from protocols.identity import Identity, Member, Roster
from protocols.records import (
    MAX_CONTENT_BYTES,
    RECORD_TYPES,
    HeadInfo,
    Record,
    make_record,
    verify_record,
)

AGENTS = ("agent-0", "agent-1")
TEAM = {a: Identity.derive(a, 7) for a in AGENTS}
ROSTER = Roster.build([Member(a, i.public_key, "127.0.0.1", 1) for a, i in TEAM.items()],
                      {"k000": "agent-0", "k001": "agent-1"}, AGENTS)

# Regression fixture: the ID of this record was computed once and must never change,
# or every stored record and recorded plan of earlier campaigns would be orphaned.
FIXED = dict(key="k000", owner="agent-0", seq=3, parents=[bytes(range(32))],
             rtype="requirement", content=b"capacity=12")
FIXED_ID_HEX = "73cc51937aa5bf7f230677a31530f5a5e1e936be28d9794d63fbd8fc5a4637f7"

record_ids = st.binary(min_size=32, max_size=32)
records = st.builds(
    lambda key, seq, parents, rtype, content: make_record(
        TEAM["agent-0"], key=key, owner="agent-0", seq=seq, parents=parents, rtype=rtype,
        content=content),
    key=st.text(min_size=1, max_size=40),
    seq=st.integers(min_value=0, max_value=2**63 - 1),
    parents=st.lists(record_ids, max_size=6),
    rtype=st.sampled_from(sorted(RECORD_TYPES)),
    content=st.binary(max_size=512))


def fixed_record() -> Record:
    return make_record(TEAM["agent-0"], **FIXED)  # type: ignore[arg-type]


def test_id_is_stable_across_versions() -> None:
    assert fixed_record().id.hex() == FIXED_ID_HEX


def test_id_is_the_documented_digest() -> None:
    """Rule 1 of records.py, recomputed by hand: BLAKE2b-256 over the canonical list."""
    body = msgpack.packb([1, "k000", "agent-0", 3, [bytes(range(32))], "requirement",
                          b"capacity=12", "agent-0"], use_bin_type=True)
    digest = hashlib.blake2b(body, digest_size=32, person=b"pf-record-v1").digest()
    assert fixed_record().canonical() == body
    assert digest.hex() == FIXED_ID_HEX


def test_id_does_not_cover_the_signature() -> None:
    record = fixed_record()
    assert dataclasses.replace(record, signature=b"\x00" * 64).id == record.id


@settings(derandomize=True, deadline=None)
@given(record=records)
def test_wire_round_trip_keeps_record_and_id(record: Record) -> None:
    decoded = Record.from_wire(wire.unpack(wire.pack(record.to_wire())))
    assert decoded == record
    assert decoded.id == record.id
    assert decoded.canonical() == record.canonical()
    verify_record(decoded, ROSTER, expected_id=record.id)


@settings(derandomize=True, deadline=None)
@given(record=records)
def test_head_round_trip(record: Record) -> None:
    head = HeadInfo.from_wire(wire.unpack(wire.pack(record.head.to_wire())))
    assert head == record.head
    assert head.record_id == record.id


@settings(derandomize=True, deadline=None)
@given(record=records, field=st.sampled_from(["key", "owner", "seq", "parents", "rtype",
                                              "content", "author"]))
def test_every_field_is_bound_by_the_id(record: Record, field: str) -> None:
    changed: dict[str, Any] = {
        "key": record.key + "x", "owner": record.owner + "x", "seq": record.seq ^ 1,
        "parents": (*record.parents, b"\x07" * 32),
        "rtype": "plan" if record.rtype != "plan" else "review",
        "content": record.content + b"x", "author": record.author + "x",
    }
    other = dataclasses.replace(record, **{field: changed[field]})
    assert other.id != record.id


def test_parent_order_is_bound_by_the_id() -> None:
    a, b = b"\x01" * 32, b"\x02" * 32
    one = make_record(TEAM["agent-0"], key="k000", owner="agent-0", seq=1, parents=[a, b],
                      rtype="plan", content=b"")
    two = make_record(TEAM["agent-0"], key="k000", owner="agent-0", seq=1, parents=[b, a],
                      rtype="plan", content=b"")
    assert one.id != two.id


# --- verification ------------------------------------------------------------------------------

def test_verify_accepts_genuine_record() -> None:
    verify_record(fixed_record(), ROSTER, expected_id=bytes.fromhex(FIXED_ID_HEX))


def test_verify_rejects_content_that_does_not_match_the_requested_id() -> None:
    record = fixed_record()
    tampered = dataclasses.replace(record, content=b"capacity=99")
    with pytest.raises(IntegrityError, match="digest"):
        verify_record(tampered, ROSTER, expected_id=record.id)


def test_verify_rejects_tampered_record_by_signature() -> None:
    tampered = dataclasses.replace(fixed_record(), content=b"capacity=99")
    with pytest.raises(IntegrityError, match="signature"):
        verify_record(tampered, ROSTER)


def test_verify_rejects_signature_by_someone_else() -> None:
    record = fixed_record()
    forged = dataclasses.replace(record, signature=TEAM["agent-1"].sign(record.id))
    with pytest.raises(IntegrityError, match="signature"):
        verify_record(forged, ROSTER)


def test_verify_rejects_author_outside_the_roster() -> None:
    outsider = Identity.derive("mallory", 7)
    record = make_record(outsider, key="k000", owner="mallory", seq=1, parents=[],
                         rtype="requirement", content=b"")
    with pytest.raises(IntegrityError, match="not in the roster"):
        verify_record(record, ROSTER)


def test_verify_rejects_non_owner_writer_of_a_shared_key() -> None:
    record = make_record(TEAM["agent-1"], key="k000", owner="agent-1", seq=1, parents=[],
                         rtype="requirement", content=b"")
    with pytest.raises(OwnerRuleError, match="belongs to"):
        verify_record(record, ROSTER)


def test_verify_rejects_author_other_than_owner() -> None:
    record = make_record(TEAM["agent-1"], key="plan/a1", owner="agent-0", seq=1, parents=[],
                         rtype="plan", content=b"")
    with pytest.raises(OwnerRuleError, match="not its owner"):
        verify_record(record, ROSTER)


def test_a_verified_signature_is_remembered_only_for_that_roster() -> None:
    record = fixed_record()
    verify_record(record, ROSTER)
    verify_record(record, ROSTER)  # the same object under the same roster: passes again
    # Another roster pins another key for agent-0: the signature is checked again there.
    other = Roster.build([Member("agent-0", TEAM["agent-1"].public_key, "127.0.0.1", 1),
                          Member("agent-1", TEAM["agent-1"].public_key, "127.0.0.1", 1)],
                         {"k000": "agent-0"}, AGENTS)
    with pytest.raises(IntegrityError, match="signature"):
        verify_record(record, other)
    # ... and the owner rules are checked every time.
    moved = Roster.build(list(ROSTER.members.values()), {"k000": "agent-1"}, AGENTS)
    with pytest.raises(OwnerRuleError, match="belongs to"):
        verify_record(record, moved)
    with pytest.raises(IntegrityError, match="digest"):
        verify_record(record, ROSTER, expected_id=bytes(32))
    # A forged copy is a new object: nothing carries over.
    with pytest.raises(IntegrityError, match="signature"):
        verify_record(dataclasses.replace(record, signature=bytes(64)), ROSTER)


# --- decoding peer input -----------------------------------------------------------------------

def _wire(**changes: Any) -> dict[str, Any]:
    d = fixed_record().to_wire()
    d.update(changes)
    return d


@pytest.mark.parametrize("bad", [
    {"key": ""}, {"key": 5}, {"key": "k" * 201}, {"owner": None}, {"author": b"agent-0"},
    {"seq": -1}, {"seq": True}, {"seq": 2**63}, {"seq": "3"},
    {"parents": b"x"}, {"parents": [b"short"]}, {"parents": [b"\x00" * 32] * 257},
    {"rtype": "poem"}, {"content": "text"}, {"content": b"x" * (MAX_CONTENT_BYTES + 1)},
    {"sig": b"\x00" * 63}, {"sig": None},
])
def test_from_wire_rejects_bad_fields(bad: dict[str, Any]) -> None:
    with pytest.raises(RemoteProtocolError):
        Record.from_wire(_wire(**bad))


@pytest.mark.parametrize("missing", ["key", "owner", "seq", "parents", "rtype", "content",
                                     "author", "sig"])
def test_from_wire_rejects_missing_field(missing: str) -> None:
    d = _wire()
    del d[missing]
    with pytest.raises(RemoteProtocolError, match=missing):
        Record.from_wire(d)


@pytest.mark.parametrize("bad", [None, [], "record", {"key": "k000"}])
def test_from_wire_rejects_non_records(bad: object) -> None:
    with pytest.raises(RemoteProtocolError):
        Record.from_wire(bad)


@pytest.mark.parametrize("bad", [
    None, {}, {"key": "k", "owner": "o", "seq": -1, "id": b"\x00" * 32},
    {"key": "k", "owner": "o", "seq": 1, "id": b"\x00" * 31},
    {"key": "k", "owner": "o", "seq": False, "id": b"\x00" * 32},
])
def test_head_from_wire_rejects_malformed(bad: object) -> None:
    with pytest.raises(RemoteProtocolError):
        HeadInfo.from_wire(bad)
