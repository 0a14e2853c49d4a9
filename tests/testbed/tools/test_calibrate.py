"""The calibration arithmetic of rate checks on a slow machine (testbed/tools/calibrate.py),
pure: no link, no clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.tools.calibrate import BASE_MARGIN, TESTABLE_FRACTION, Calibration, merged


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
    before = Calibration((10_000.0, 12_000.0), (1.0,))
    after = Calibration((9_000.0,), (2.0,))
    both = merged(before, after)
    assert both.rates_kbit == (10_000.0, 12_000.0, 9_000.0)
    assert both.rtts_ms == (1.0, 2.0)
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
