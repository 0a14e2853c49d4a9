"""The startup limit's rules (testbed/run/startup.py) on a clock the test moves, and the
CPU reading on this process."""

from __future__ import annotations

import os
import time

import pytest

from testbed.host.processes import cpu_seconds
from testbed.run.startup import (
    PROGRESS_WINDOW_S,
    STARTUP_CAP_S,
    STARTUP_CPU_BUDGET_S,
    STARTUP_FLOOR_S,
    StartupClock,
    startup_timeout_s,
)


class Fake:
    def __init__(self) -> None:
        self.now = 0.0
        self.cpu: float | None = 0.0

    def clock(self, limit_s: float = 10.0) -> StartupClock:
        return StartupClock(limit_s, lambda: self.cpu, now=lambda: self.now)


def test_the_limit_scales_with_members_per_cpu_between_floor_and_cap() -> None:
    assert startup_timeout_s(0.4, 5, 2) == STARTUP_FLOOR_S
    assert startup_timeout_s(4.0, 8, 2) == pytest.approx(5 * 4.0 * 4)
    assert startup_timeout_s(1000.0, 5, 2) == STARTUP_CAP_S
    with pytest.raises(ValueError, match="probe_s"):
        startup_timeout_s(float("nan"), 5, 2)


def test_before_the_limit_nothing_is_asked() -> None:
    fake = Fake()
    clock = fake.clock()
    fake.cpu = None  # even a reading of "gone" is not looked at before the limit
    fake.now = 9.9
    assert not clock.expired()


def test_a_starved_node_that_still_gets_cpu_waits_past_the_limit() -> None:
    fake = Fake()
    clock = fake.clock()
    for step in range(1, 100):  # 0.05 s of CPU per window: a load of 40 on 2 CPUs
        fake.now = 10.0 + step * PROGRESS_WINDOW_S
        fake.cpu = 0.05 * step
        assert not clock.expired(), fake.now
    assert clock.waited_s() > 10 * clock.limit_s


def test_a_node_that_gets_no_cpu_for_a_window_past_the_limit_has_failed() -> None:
    fake = Fake()
    clock = fake.clock()
    fake.cpu = 0.3
    fake.now = 10.0
    assert not clock.expired()  # the window starts
    fake.now = 10.0 + PROGRESS_WINDOW_S / 2
    assert not clock.expired()
    fake.now = 10.0 + PROGRESS_WINDOW_S
    assert clock.expired()
    assert clock.describe_cpu() == "0.30 s of CPU used"


def test_a_node_that_burns_its_cpu_budget_or_reaches_the_cap_or_is_gone_has_failed() -> None:
    fake = Fake()
    clock = fake.clock()
    fake.now, fake.cpu = 11.0, STARTUP_CPU_BUDGET_S
    assert clock.expired()
    fake = Fake()
    clock = fake.clock()
    fake.now, fake.cpu = STARTUP_CAP_S, 1.0
    assert clock.expired()
    fake = Fake()
    clock = fake.clock()
    fake.now, fake.cpu = 11.0, None
    assert clock.expired()
    assert clock.describe_cpu() == "process gone"


def test_cpu_seconds_reads_this_process_and_grows_with_work() -> None:
    before = cpu_seconds(os.getpid())
    assert before is not None
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    after = cpu_seconds(os.getpid())
    assert after is not None
    assert after - before >= 0.1
    assert cpu_seconds(2**22 + 12345) is None  # beyond pid_max: no such process
