"""The per-process caches of a link's large parts (testbed/links/memo.py) and their use:
a trace's stamps, their wire bytes and the emulator's opportunity schedule are built
once however many teams replay the trace, and stay correct."""

from __future__ import annotations

import numpy as np

from testbed.campaign.parse import parse_campaign
from testbed.links import emulator_group
from testbed.links.memo import ByIdentity, ByKey
from testbed.links.model import direction_spec


def test_by_identity_computes_once_per_object_not_per_equal_value() -> None:
    calls: list[tuple[int, ...]] = []

    def size(obj: tuple[int, ...]) -> int:
        calls.append(obj)
        return len(obj)

    memo: ByIdentity[tuple[int, ...], int] = ByIdentity(size, entries=2)
    a, b = tuple(range(1000)), tuple(range(1000))
    assert memo(a) == memo(a) == 1000
    assert len(calls) == 1
    assert memo(b) == 1000  # equal, not the same object: computed again
    assert len(calls) == 2
    memo(tuple(range(3)))  # a third entry empties the full cache
    memo(a)
    assert len(calls) == 4


def test_by_key_makes_once_and_stays_bounded() -> None:
    made: list[bytes] = []
    memo: ByKey[bytes, int] = ByKey(entries=2)

    def make(key: bytes) -> int:
        made.append(key)
        return len(key)

    for key in (b"aa", b"aa", b"bbb", b"aa"):
        assert memo.get(key, lambda k=key: make(k)) == len(key)  # type: ignore[misc]
    assert made == [b"aa", b"bbb"]
    memo.get(b"c", lambda: make(b"c"))
    memo.get(b"aa", lambda: make(b"aa"))
    assert made == [b"aa", b"bbb", b"c", b"aa"]


def _att_link() -> object:
    campaign = parse_campaign({"name": "m", "seed": 1, "templates": 1,
                               "grid": {"policy": ["planfence"], "network": ["att"]}})
    return campaign.network_profile("att").links_of(["a0"])[0]


def test_specs_of_the_same_trace_share_their_stamps_and_keep_their_offsets() -> None:
    link = _att_link()
    first = direction_spec(link, "down", offset_ms=0.0)
    again = direction_spec(link, "down", offset_ms=5000.0)
    assert first.stamps_ms is again.stamps_ms
    assert (first.offset_ms, again.offset_ms) == (0.0, 5000.0)
    up = direction_spec(link, "up")
    assert up.stamps_ms is not first.stamps_ms
    assert up.stamps_ms != first.stamps_ms
    assert first.stamps_ms is not None
    assert first.period_ms == first.stamps_ms[-1]
    assert all(isinstance(s, int) for s in first.stamps_ms[:10])


def test_the_emulator_shares_a_schedule_only_between_equal_traces_and_offsets() -> None:
    link = _att_link()
    specs = [direction_spec(link, "down"), direction_spec(link, "down", offset_ms=7000.0),
             direction_spec(link, "up")]
    wires = [emulator_group.spec_to_wire(s) for s in specs]
    assert wires[0]["stamps"] is wires[1]["stamps"]  # encoded once
    # what a second team sends arrives as new bytes: equal content finds the same schedule
    again = [dict(w, stamps=bytes(bytearray(w["stamps"]))) for w in wires]
    decoded = [emulator_group._spec_from_wire(dict(w)) for w in again]
    assert decoded[0] == specs[0]
    assert decoded[2] == specs[2]
    schedules = [emulator_group._opportunities(w, s) for w, s in zip(again, decoded, strict=True)]
    first_team = [emulator_group._opportunities(w, s) for w, s in zip(wires, specs, strict=True)]
    assert schedules[0] is first_team[0]
    assert schedules[0] is not schedules[1]  # another offset: its own schedule
    assert schedules[0] is not schedules[2]
    assert schedules[0] is not None
    assert schedules[1] is not None
    # the offset is honoured: the same opportunity index falls 7 s earlier
    k = 1000
    assert np.isclose(schedules[0].time_of(k) - schedules[1].time_of(k), 7000.0)
