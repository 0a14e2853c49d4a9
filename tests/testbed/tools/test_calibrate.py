"""The calibration arithmetic of rate checks on a slow machine (testbed/tools/calibrate.py),
pure: no link, no clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.tools.calibrate import (
    BASE_MARGIN,
    FULL_IP_BYTES,
    TESTABLE_FRACTION,
    Calibration,
    bucket_share,
    merged,
)

FRAME_MS_3_3 = FULL_IP_BYTES * 8 / 3333.3  # one full frame at 3.3 Mbit/s: 3.6 ms


def test_floor_and_ceiling_of_a_guest_slower_than_the_link() -> None:
    cal = Calibration((10_000.0, 11_000.0, 12_000.0))  # a TCG guest on a busy host
    assert cal.median_kbit == 11_000.0
    assert cal.spread == pytest.approx(2_000 / 11_000)
    assert cal.margin == pytest.approx(BASE_MARGIN + 1_000 / 11_000)
    # the slowest run, less BASE_MARGIN of the median
    assert cal.guest_floor_kbit() == pytest.approx(10_000 - BASE_MARGIN * 11_000)
    # 12 Mbit/s: the guest, not the link, bounds what can be demanded
    assert cal.floor_kbit(12_000, 0.02) == pytest.approx(cal.guest_floor_kbit())
    # 3.3 Mbit/s: the guest is fast enough, the link's own tolerance applies
    assert cal.floor_kbit(3333.3, 0.05) == pytest.approx(3333.3 * 0.95)
    # never more than capacity, whatever the machine
    assert Calibration.ceiling_kbit(12_000, 0.02) == pytest.approx(12_240)
    assert cal.untestable(12_000) is None
    reason = cal.untestable(24_000)
    assert reason is not None
    assert reason.startswith("guest too slow to test 24.0 Mbit/s: it surely moves 8.9 Mbit/s")
    assert "10.0, 11.0, 12.0" in reason  # the measured runs are in the reason


def test_a_calibration_that_moved_a_lot_demands_little_and_tests_nothing_fast() -> None:
    steady = Calibration((20_000.0, 20_000.0, 20_000.0))
    moved = Calibration((8_000.0, 20_000.0, 21_000.0))  # the host got busy mid-way
    assert steady.spread == 0.0
    assert steady.guest_floor_kbit() == pytest.approx(20_000 * (1 - BASE_MARGIN))
    assert moved.guest_floor_kbit() < min(moved.rates_kbit)
    assert steady.untestable(24_000) is None
    assert moved.untestable(24_000) is not None


def test_runs_before_and_after_a_check_are_pooled() -> None:
    before = Calibration((10_000.0, 12_000.0), (1.0,), (0.1, 0.2))
    after = Calibration((9_000.0,), (2.0,), (3.0,))
    both = merged(before, after)
    assert both.rates_kbit == (10_000.0, 12_000.0, 9_000.0)
    assert both.rtts_ms == (1.0, 2.0)
    assert both.lateness_ms == (0.1, 0.2, 3.0)
    assert both.as_dict()["median_kbit"] == 10_000.0


@pytest.mark.parametrize("runs", [(), (0.0,), (5.0, -1.0)])
def test_a_calibration_needs_measured_runs(runs: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="rates_kbit"):
        Calibration(runs)


@given(runs=st.lists(st.floats(1.0, 1e6), min_size=1, max_size=8),
       capacity=st.floats(100.0, 1e6), rel=st.floats(0.0, 0.1))
def test_the_floor_never_asks_more_than_the_slowest_run_or_the_capacity(
        runs: list[float], capacity: float, rel: float) -> None:
    cal = Calibration(tuple(runs))
    floor = cal.floor_kbit(capacity, rel)
    assert floor <= max(0.0, min(runs) - BASE_MARGIN * cal.median_kbit) + 1e-6
    assert floor <= capacity * (1 - rel) + 1e-6
    assert floor <= cal.ceiling_kbit(capacity, rel)
    testable = cal.untestable(capacity) is None
    assert testable == (cal.guest_floor_kbit() >= TESTABLE_FRACTION * capacity)


def test_a_bucket_on_time_or_late_within_its_catch_up_carries_its_whole_rate() -> None:
    assert bucket_share(3333.3, [0.0] * 200, catch_up_ms=1.0) == pytest.approx(1.0)
    assert bucket_share(3333.3, [0.9] * 200, catch_up_ms=1.0) == pytest.approx(1.0)
    assert bucket_share(24_000, [0.4, 0.0, 0.9] * 100, catch_up_ms=1.0) == pytest.approx(1.0)


def test_a_bucket_loses_what_each_wake_is_later_than_its_catch_up() -> None:
    # woken 2 ms late every time with 1 ms of catch-up: each frame takes 1 ms longer
    share = bucket_share(3333.3, [2.0] * 400, catch_up_ms=1.0)
    assert share == pytest.approx(FRAME_MS_3_3 / (FRAME_MS_3_3 + 1.0), rel=0.01)
    # no catch-up at all (a bucket of one frame): the whole lateness is lost
    bare = bucket_share(3333.3, [0.4] * 400, catch_up_ms=0.0)
    assert bare == pytest.approx(FRAME_MS_3_3 / (FRAME_MS_3_3 + 0.4), rel=0.01)
    # a rare long stall costs what it lasts beyond the catch-up, once
    stalls = bucket_share(3333.3, [0.0] * 99 + [50.0], catch_up_ms=1.0)
    assert stalls == pytest.approx(99 * FRAME_MS_3_3 / (99 * FRAME_MS_3_3 + 49.0), rel=0.02)


def test_the_floor_of_a_token_bucket_link_follows_the_measured_timers() -> None:
    prompt = Calibration((20_000.0,) * 3, lateness_ms=(0.2,) * 100)
    late = Calibration((20_000.0,) * 3, lateness_ms=(1.5,) * 100)
    assert prompt.floor_kbit(3333.3, 0.05, catch_up_ms=1.0) == pytest.approx(3333.3 * 0.95)
    expected = 3333.3 * 0.95 * FRAME_MS_3_3 / (FRAME_MS_3_3 + 0.5)
    assert late.floor_kbit(3333.3, 0.05, catch_up_ms=1.0) == pytest.approx(expected, rel=0.01)
    assert late.floor_kbit(3333.3, 0.05) == pytest.approx(3333.3 * 0.95)  # not a bucket
    assert "timers late by 1.50 ms median" in late.describe()


@given(late=st.lists(st.floats(0.0, 100.0), min_size=1, max_size=50),
       capacity=st.floats(100.0, 1e5), catch_up=st.floats(0.0, 5.0))
def test_a_bucket_never_carries_more_than_its_rate_and_more_catch_up_never_hurts(
        late: list[float], capacity: float, catch_up: float) -> None:
    share = bucket_share(capacity, late, catch_up_ms=catch_up)
    assert 0.0 < share <= 1.0
    assert bucket_share(capacity, late, catch_up_ms=catch_up + 1.0) >= share - 1e-9
