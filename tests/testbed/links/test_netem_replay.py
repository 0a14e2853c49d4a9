"""The netem backend's trace replay when it falls behind: it catches up and says how late
it was (trio's mock clock; the netlink calls replaced by a sleep of a chosen length)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import trio
import trio.testing

from testbed.links.backend import LinkHost
from testbed.links.netem import NetemBackend
from testbed.links.netem_plan import (
    LATE_BIN_MS,
    ReplayLateness,
    compile_schedule,
    current_step,
    step_changes,
)
from testbed.links.profiles import LinkSpec, NetworkProfile
from testbed.links.traces import Trace

# stamps 5, 20, 20 every 20 ms: 1 opportunity in [0, 10), none in [10, 20), 3 in
# [20, 30) (20, 20 and the next period's 25), none in [30, 40), ... so every step
# changes the rate: 1200, 0, 3600, 0, 3600, 0, ...
FLIP = Trace(name="flip.up", direction="up", stamps_ms=np.asarray([5, 20, 20], dtype=np.int64),
             period_ms=20)
STEADY = Trace(name="steady.down", direction="down", stamps_ms=np.asarray([1], dtype=np.int64),
               period_ms=1)


def expected_rate(trace: Trace, step: int) -> float:
    return compile_schedule(trace, offset_ms=0, interval_ms=10, duration_ms=10,
                            start_ms=step * 10.0)[0].rate_kbit


class SlowBackend(NetemBackend):
    """The real replay loop; each batch of rate changes takes `apply_s` of (mock) time."""

    def __init__(self, apply_s: float) -> None:
        super().__init__(NetworkProfile("flip", LinkSpec(up_trace="x.up", down_trace="x.down")),
                         prefix="tbslow", interval_ms=10)
        self.apply_s = apply_s
        self.calls: list[tuple[float, list[tuple[int, float]]]] = []

    def _create(self, hosts: object) -> None:
        pass

    def _traces(self) -> list[Trace | None]:
        return [FLIP, STEADY]

    async def _apply_changes(self, changes: list[tuple[int, float]]) -> None:
        self.calls.append((trio.current_time(), changes))
        await trio.sleep(self.apply_s)
        for i, rate in changes:
            self._directions[i].current_kbit = rate


async def _replay_for(backend: SlowBackend, seconds: float, *, chunk_ms: float) -> float:
    backend.build([LinkHost("a0", "tbslowns", "198.18.0.1")])
    async with trio.open_nursery() as nursery:
        t0 = trio.current_time()
        nursery.start_soon(partial(backend.run_schedule, chunk_ms=chunk_ms))
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()
    return t0


async def test_on_time_replay_applies_every_step_and_is_never_late(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = SlowBackend(apply_s=0.0)
    t0 = await _replay_for(backend, 0.495, chunk_ms=30)
    assert len(backend.calls) == 50  # the up direction changes at every step
    for n, (t, changes) in enumerate(backend.calls):
        assert round((t - t0) * 1000, 6) == 10 * n
        assert changes[0] == (0, pytest.approx(expected_rate(FLIP, n)))
    stats = await backend.statistics()
    assert stats == {"late_p50_ms": 0.0, "late_p99_ms": 0.0, "late_max_ms": 0.0,
                     "rate_changes": 50.0, "steps_skipped": 0.0}


@pytest.mark.parametrize(("apply_s", "chunk_ms"), [(0.025, 30), (0.025, 10_000), (0.1, 30)])
async def test_a_late_replay_skips_to_the_step_in_force_and_keeps_real_time(
    autojump_clock: trio.testing.MockClock, apply_s: float, chunk_ms: float,
) -> None:
    # each netlink batch takes 25 ms (or 100 ms, longer than a 30 ms chunk): the old loop
    # applied every step in turn and fell 15 ms further behind per step
    backend = SlowBackend(apply_s=apply_s)
    t0 = await _replay_for(backend, 2.0, chunk_ms=chunk_ms)
    steps = [current_step((t - t0) * 1000.0, 10) for t, _ in backend.calls]
    assert steps == sorted(set(steps))  # forward only, never a step twice
    for step, (_, changes) in zip(steps, backend.calls, strict=True):
        # what is applied is the schedule in force when the call is made
        for i, rate in changes:
            assert rate == pytest.approx(expected_rate(FLIP if i == 0 else STEADY, step))
    # real time kept: the last change was for a step less than one call + a step ago
    assert (2.0 - (backend.calls[-1][0] - t0)) * 1000 <= apply_s * 1000 + 10 + 1e-6
    stats = await backend.statistics()
    # (the last call may have been cut off by the cancellation before it returned)
    assert stats["rate_changes"] in (len(backend.calls) - 1, len(backend.calls))
    # a step is either skipped or played (with or without a change): 200 steps in 2 s
    assert 0 < stats["steps_skipped"] <= 201 - len(backend.calls)
    # here a step played without a change is always followed by a call: at most one per call
    assert stats["steps_skipped"] >= 200 - 2 * len(backend.calls) - 2
    assert stats["late_max_ms"] >= apply_s * 1000 - 1e-6
    assert stats["late_max_ms"] <= apply_s * 1000 + 10
    assert stats["late_p50_ms"] <= stats["late_p99_ms"] <= stats["late_max_ms"]
    await backend.clear_statistics()
    assert await backend.statistics() == {"late_p50_ms": 0.0, "late_p99_ms": 0.0,
                                          "late_max_ms": 0.0, "rate_changes": 0.0,
                                          "steps_skipped": 0.0}


def test_lateness_histogram() -> None:
    late = ReplayLateness()
    assert late.snapshot()["late_p99_ms"] == 0.0
    for ms in [0.05] * 98 + [3.0, 812.5]:
        late.record(ms)
    snap = late.snapshot()
    assert snap["late_p50_ms"] == pytest.approx(LATE_BIN_MS)  # upper edge of the first bin
    assert snap["late_p99_ms"] == pytest.approx(3.1)
    assert snap["late_max_ms"] == 812.5  # beyond the histogram: the maximum stays exact
    assert snap["rate_changes"] == 100
    late.record(-1.0)  # a clock that says early counts as on time
    assert late.histogram[0] == 99


def test_catch_up_and_changes() -> None:
    late = ReplayLateness()
    assert late.catch_up(3, 3, 10) == 3
    assert late.catch_up(3, 2, 10) == 3  # woke early: still step 3
    assert late.catch_up(3, 7, 10) == 7
    assert late.skipped == 4
    assert late.catch_up(8, 25, 10) == 10  # the rest of the chunk is past
    assert late.skipped == 6
    assert current_step(29.999999999, 10) == 3  # float noise on a due time is that step
    assert current_step(29.9, 10) == 2
    up = compile_schedule(FLIP, offset_ms=0, interval_ms=10, duration_ms=40)
    assert step_changes([up, None], 2, [0.0, None]) == [(0, pytest.approx(3600.0))]
    assert step_changes([up, None], 2, [3600.0, None]) == []
    assert step_changes([up, None], 4, [0.0, None]) == []  # past this direction's steps
