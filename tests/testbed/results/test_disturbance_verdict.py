"""The disturbance verdict (testbed/results/verdict.py): a measure flags an episode only
when the bound it gives on the stall's movement exceeds the resolution."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from testbed.results import verdict
from testbed.results.verdict import (
    OVERSLEEP_P99_MS,
    RESOLUTION,
    judge,
    rejudge,
    write_calibration,
)

K = {"loopback": 0.4, "link": 0.2}
OWN = {"loopback": 0.3, "link": 0.1}


@pytest.fixture(autouse=True)
def calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "disturbance.json"
    monkeypatch.setattr(verdict, "CALIBRATION_PATH", path)
    verdict.calibration.cache_clear()
    write_calibration(K, OWN, source="test", revision="r", measured_at="now")
    yield path
    verdict.calibration.cache_clear()


def _wait_for_bound(bound_ms: float, k: float, own: float, cpu: float, actions: int) -> float:
    """Total run-queue wait whose bound is ``bound_ms`` per action."""
    return (bound_ms / k) * actions + own / (1 - own) * cpu


def test_run_queue_wait_flags_only_above_the_resolution() -> None:
    stall, actions, cpu = 1000.0, 10, 500.0
    limit = RESOLUTION * stall
    below = {"node_runq_wait_ms": _wait_for_bound(0.9 * limit, 0.2, 0.1, cpu, actions),
             "node_cpu_ms": cpu}
    above = {**below, "node_runq_wait_ms": _wait_for_bound(1.1 * limit, 0.2, 0.1, cpu,
                                                            actions)}
    assert judge(below, stall_ms_per_action=stall, actions=actions, shaped=True) == (False, "")
    flagged, reason = judge(above, stall_ms_per_action=stall, actions=actions, shaped=True)
    assert flagged
    assert reason.startswith("runq_wait could move stall")
    # the same wait on loopback: k is larger there, and the stall per action smaller
    assert judge(below, stall_ms_per_action=stall, actions=actions)[0]


def test_the_teams_own_contention_is_not_a_disturbance() -> None:
    # five nodes on two CPUs wait 25% of their runnable time alone: below the measured 30%
    own = {"node_runq_wait_ms": 25.0, "node_cpu_ms": 75.0}
    assert not judge(own, stall_ms_per_action=3.0, actions=3)[0]
    # the same team beside a neighbour: 60% of its runnable time waiting
    busy = {"node_runq_wait_ms": 112.5, "node_cpu_ms": 75.0}
    assert judge(busy, stall_ms_per_action=3.0, actions=3)[0]


def test_uncalibrated_verdict_takes_every_ms_of_wait(calibration: Path) -> None:
    calibration.unlink()
    verdict.calibration.cache_clear()
    assert verdict.sensitivity("link") == verdict.UNCALIBRATED_K
    assert verdict.own_wait_share("link") == verdict.WAIT_SHARE
    columns = {"node_runq_wait_ms": 10 * 60.0, "node_cpu_ms": 100.0}
    assert judge(columns, stall_ms_per_action=1000.0, actions=10, shaped=True)[0]


def test_steal_is_bounded_through_the_cpu_it_took() -> None:
    # 10% steal of 5 ms CPU per action on a 1 s link stall: 0.1 ms, far below 50 ms
    link = {"host_steal_pct": 10.0, "node_cpu_ms": 50.0}
    assert not judge(link, stall_ms_per_action=1000.0, actions=10, shaped=True)[0]
    # the same steal where the stall is the CPU work itself
    loop = {"host_steal_pct": 10.0, "node_cpu_ms": 300.0}
    flagged, reason = judge(loop, stall_ms_per_action=3.0, actions=10)
    assert flagged
    assert "steal 10.0%" in reason


def test_oversleep_and_a_frozen_emulator_flag() -> None:
    flagged, reason = judge({"node_oversleep_p99_ms": OVERSLEEP_P99_MS + 1},
                            stall_ms_per_action=100.0, actions=5)
    assert flagged
    assert "oversleep_p99" in reason
    frozen = {"emulator_late_max_ms": 3000.0}
    flagged, reason = judge(frozen, stall_ms_per_action=1000.0, actions=12, shaped=True)
    assert flagged
    assert "emulator late 3000 ms" in reason
    # an ordinary worst lateness of a few ms is not
    assert not judge({"emulator_late_max_ms": 2.3}, stall_ms_per_action=1000.0, actions=12,
                     shaped=True)[0]
    assert judge({}, stall_ms_per_action=None, actions=0) == (False, "")


def test_rejudge_keeps_the_recorded_verdict_and_recomputes() -> None:
    frame = pd.DataFrame([
        {"backend": "userspace", "attempted_actions": 10, "stall_ms_per_action": 1000.0,
         "node_runq_wait_ms": 10 * 5.0, "node_cpu_ms": 100.0, "host_steal_pct": 0.0,
         "disturbed": True, "disturbed_reason": "runq_wait (old rule)", "aborted": False},
        {"backend": "none", "attempted_actions": 3, "stall_ms_per_action": 3.0,
         "node_runq_wait_ms": None, "node_cpu_ms": None, "host_steal_pct": None,
         "disturbed": None, "disturbed_reason": None, "aborted": False},
    ])
    out = rejudge(frame)
    assert list(out["disturbed_recorded"]) == [True, None]
    assert not bool(out.loc[0, "disturbed"])  # 5 ms/action x 0.2 is far below 50 ms
    assert out.loc[0, "disturbed_reason"] == ""
    assert out.loc[1, "disturbed"] is None  # nothing measured: as recorded


def test_describe_records_the_calibration(calibration: Path) -> None:
    described = verdict.describe()
    assert described["version"] == verdict.VERDICT_VERSION
    assert described["sensitivity"] == K
    assert described["own_wait_share"] == OWN
    assert json.loads(calibration.read_text())["measured"]["source"] == "test"
