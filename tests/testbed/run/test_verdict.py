"""Judging invalid actions from owners' head logs (pure)."""

from __future__ import annotations

from testbed.run.verdict import build_head_log, head_at, judge_invalid

ID1, ID2, ID3 = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32


def _timeline():  # type: ignore[no-untyped-def]
    # Two owners' logs, out of order on purpose: the merge sorts by time.
    return build_head_log({
        "a0": [["k000", 2, ID2, 200], ["k000", 1, ID1, 100]],
        "a1": [["k001", 1, ID3, 150]],
    })


def test_head_at_follows_the_owner_log() -> None:
    timeline = _timeline()
    assert head_at(timeline, "k000", 99) is None
    assert head_at(timeline, "k000", 100) == ID1
    assert head_at(timeline, "k000", 199) == ID1
    assert head_at(timeline, "k000", 200) == ID2
    assert head_at(timeline, "k001", 10_000) == ID3
    assert head_at(timeline, "k999", 10_000) is None


def test_an_action_is_invalid_when_an_input_differs_from_the_head_at_issue() -> None:
    timeline = _timeline()
    assert not judge_invalid(timeline, ["k000"], {"k000": ID1}, 150)
    assert judge_invalid(timeline, ["k000"], {"k000": ID1}, 250)  # updated at 200
    assert not judge_invalid(timeline, ["k000", "k001"], {"k000": ID2, "k001": ID3}, 250)
    assert judge_invalid(timeline, ["k000", "k001"], {"k000": ID2}, 250)  # missing input
