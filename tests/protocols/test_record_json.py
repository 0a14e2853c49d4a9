"""``wire_encoding = "json"``: records and head entries as the paper's JSON objects.

Every record type round-trips exactly (ID and signature intact), head entries too, and
the bytes a real handler's answer grows by per key equal the encoded size of one entry,
in either encoding (so a per-entry measurement is the encoding's, nothing else).
"""

from __future__ import annotations

import itertools
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodes.rpc import Handlers
from nodes.store import SqliteStore
from protocols import wire
from protocols.errors import RemoteProtocolError
from protocols.identity import Identity, Member, Roster
from protocols.records import (
    RECORD_TYPES,
    WIRE_ENCODINGS,
    HeadInfo,
    Record,
    make_record,
    set_wire_encoding,
    verify_record,
    wire_encoding,
)

IDS = {a: Identity.derive(a, "record-json") for a in ("agent-0", "agent-1")}
KEYS = [f"k{i:03d}" for i in range(6)]
ROSTER = Roster.build([Member(a, i.public_key, "127.0.0.1", 1) for a, i in IDS.items()],
                      dict.fromkeys(KEYS, "agent-0"), list(IDS))


@pytest.fixture(autouse=True)
def _compact_afterwards() -> Iterator[None]:
    yield
    set_wire_encoding("msgpack")


def _record(rtype: str, seq: int = 2) -> Record:
    content = bytes(range(256)) + "\u00e9\u00fc".encode() + b"\xff\xfe"  # not UTF-8
    return make_record(IDS["agent-0"], key="k001", owner="agent-0", seq=seq,
                       parents=[b"\x01" * 32, b"\xab" * 32], rtype=rtype, content=content)


@pytest.mark.parametrize("rtype", sorted(RECORD_TYPES))
def test_every_record_type_round_trips_as_json(rtype: str) -> None:
    record = _record(rtype)
    encoded = record.to_wire("json")
    assert isinstance(encoded, bytes)
    obj = json.loads(encoded)
    assert obj["rtype"] == rtype
    assert obj["parents"] == ["01" * 32, "ab" * 32]
    assert obj["sig"] == record.signature.hex()
    # Through a frame body as the transport carries it.
    carried = wire.unpack(wire.pack({"record": encoded}))["record"]
    back = Record.from_wire(carried)
    assert back == record
    assert back.id == record.id
    verify_record(back, ROSTER, expected_id=record.id)
    assert Record.from_wire(record.to_wire("msgpack")) == record


def test_heads_round_trip_and_the_process_setting() -> None:
    head = _record("plan", seq=7).head
    assert HeadInfo.from_wire(head.to_wire("json")) == head
    assert json.loads(head.to_wire("json")) == {"id": head.record_id.hex(), "key": "k001",
                                                "owner": "agent-0", "seq": 7}
    assert isinstance(head.to_wire(), dict)
    set_wire_encoding("json")
    assert wire_encoding() == "json"
    assert isinstance(head.to_wire(), bytes)
    with pytest.raises(ValueError, match="wire_encoding"):
        set_wire_encoding("xml")


@pytest.mark.parametrize("bad", [
    b"\xff", b"[]", b'{"key":"k001"}', b'{"id":"zz","key":"k001","owner":"a","seq":1}',
    b'{"id":"' + b"00" * 32 + b'","key":"k001","owner":"a","seq":"1"}',
    b'{"id":"' + b"00" * 32 + b'","key":"k001","owner":"a","seq":1,"x":0}'])
def test_bad_json_heads_are_the_peers_protocol_error(bad: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        HeadInfo.from_wire(bad)


def test_bad_json_record_content_is_the_peers_protocol_error() -> None:
    obj = json.loads(_record("review").to_wire("json"))
    for field, value in (("content", "not base64!"), ("parents", "00"), ("sig", 5)):
        with pytest.raises(RemoteProtocolError):
            Record.from_wire(json.dumps({**obj, field: value}).encode())


@pytest.mark.parametrize("encoding", WIRE_ENCODINGS)
def test_a_heads_answer_grows_by_the_encoded_entry_size(encoding: str) -> None:
    set_wire_encoding(encoding)
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "s.sqlite", agent_id="agent-0", roster=ROSTER,
                            durability="normal")
        heads = []
        for key in KEYS:
            record = make_record(IDS["agent-0"], key=key, owner="agent-0", seq=1,
                                 parents=[], rtype="requirement", content=b"v")
            store.install(record)
            heads.append(record.head)
        handlers = Handlers(agent_id="agent-0", store=store, roster=ROSTER)
        sizes = [len(wire.pack({"i": 1, "r": handlers.answer(
            "agent-1", "heads", {"keys": KEYS[:n]})})) for n in range(1, len(KEYS) + 1)]
        store.close()
    entries = [len(wire.pack(h.to_wire(encoding))) for h in heads]
    assert [b - a for a, b in itertools.pairwise(sizes)] == entries[1:]
    if encoding == "json":  # text with a hex ID: larger than the compact map
        assert min(entries) > len(wire.pack(heads[0].to_wire("msgpack"))) + 32
