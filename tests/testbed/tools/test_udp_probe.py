"""The UDP probe's accounting: the receiver's own drops are kept apart from the link's."""

from __future__ import annotations

from testbed.tools.udp_probe import StreamResult, _receiver_gaps


def _arrivals(seqs: list[int]) -> list[tuple[int, float]]:
    return [(seq, float(seq)) for seq in seqs]


def test_a_rise_of_the_drop_count_marks_the_range_before_that_arrival() -> None:
    seqs = [0, 1, 2, 6, 7, 9]
    drops_at = [0, 0, 0, 3, 3, 3]  # 3, 4, 5 dropped by the socket; 8 by the link
    assert _receiver_gaps(_arrivals(seqs), drops_at, 3, 10) == ((3, 6),)


def test_drops_after_the_last_arrival_mark_the_tail() -> None:
    assert _receiver_gaps(_arrivals([0, 1]), [0, 0], 2, 4) == ((2, 4),)
    assert _receiver_gaps([], [], 0, 4) == ()
    assert _receiver_gaps([], [], 4, 4) == ((0, 4),)


def test_link_loss_and_runs_leave_the_receivers_gaps_out() -> None:
    arrivals = _arrivals([0, 2, 3, 9, 12])
    got = StreamResult(sent=14, arrivals=arrivals, send_times=[0.0] * 14,
                       receiver_drops=5, receiver_gaps=((4, 9),))
    assert got.link_lost == 14 - 5 - 5  # 1, 10, 11, 13 are the link's
    assert got.loss_runs() == [1, 2, 1]  # 4-8 (the receiver's run) is not counted
    plain = StreamResult(sent=14, arrivals=arrivals, send_times=[0.0] * 14)
    assert plain.link_lost == 9
    assert plain.loss_runs() == [1, 5, 2, 1]
