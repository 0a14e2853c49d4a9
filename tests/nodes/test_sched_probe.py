"""The node's scheduling probe counts the node's threads, not its own sampling thread."""

from __future__ import annotations

import threading
import time

import pytest

from nodes import sched_probe
from nodes.sched_probe import SchedProbe, read_schedstat, task_schedstats


def test_the_sum_leaves_out_the_excluded_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    per_task = {101: (5_000, 700), 102: (3_000, 9_000), 103: (1_000, 50)}
    monkeypatch.setattr(sched_probe, "task_schedstats", lambda pid="self": per_task)
    assert read_schedstat() == (9_000, 9_750)
    assert read_schedstat(exclude=frozenset({102})) == (6_000, 750)


def test_every_thread_of_this_process_is_read_by_its_id() -> None:
    stats = task_schedstats()
    if not stats:
        pytest.skip("this kernel has no schedstat (CONFIG_SCHED_INFO)")
    assert threading.get_native_id() in stats
    assert all(cpu >= 0 and wait >= 0 for cpu, wait in stats.values())


def test_the_probe_knows_and_leaves_out_its_sampling_thread() -> None:
    probe = SchedProbe(period_ms=1.0)
    assert probe.sampler_tid is None
    probe.start()
    try:
        tid = probe.sampler_tid
        assert tid is not None
        assert tid != threading.get_native_id()
        stats = task_schedstats()
        if not stats:
            pytest.skip("this kernel has no schedstat (CONFIG_SCHED_INFO)")
        assert tid in stats
        probe.reset()
        report = probe.report()
        assert report["runq_wait_ms"] >= 0
        assert report["cpu_ms"] >= 0
    finally:
        probe.stop()


def test_a_probe_that_is_off_has_no_sampling_thread() -> None:
    probe = SchedProbe(period_ms=0.0)
    probe.start()
    assert probe.sampler_tid is None
    probe.stop()


def _samples_after(probe: SchedProbe, at_least: int, limit_s: float = 30.0) -> int:
    deadline = time.monotonic() + limit_s
    while probe.samples < at_least and time.monotonic() < deadline:
        time.sleep(0.01)
    return probe.samples


def test_the_sampling_thread_samples_only_inside_a_window() -> None:
    probe = SchedProbe(period_ms=1.0)
    probe.start()
    try:
        time.sleep(0.2)  # 200 periods before the first reset: none sampled
        assert probe.samples == 0
        assert not probe.sampling
        probe.reset()
        assert probe.sampling
        assert _samples_after(probe, 5) >= 5
        report = probe.report()
        assert not probe.sampling
        paused_at = probe.samples
        time.sleep(0.2)  # at most the sample that was asleep when report paused it
        assert probe.samples <= paused_at + 1
        assert report["samples"] <= paused_at
        probe.reset()  # the next window samples again, from zero
        assert _samples_after(probe, 3) >= 3
    finally:
        probe.stop()
