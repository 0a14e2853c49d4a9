"""`testbed bench link --backend`: the choice reaches the bench, and each backend's own
figures are labelled, the other's not applicable (pure; the bench itself needs root)."""

from __future__ import annotations

import pytest

from testbed.cli import build_parser
from testbed.tools.bench_link import link_health


def test_bench_link_takes_a_backend() -> None:
    parser = build_parser()
    assert parser.parse_args(["bench", "link"]).backend == "userspace"
    assert parser.parse_args(["bench", "link", "--backend", "netem"]).backend == "netem"
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "link", "--backend", "auto"])
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "rpc", "--backend", "netem"])


def test_each_backend_reports_its_own_health() -> None:
    emulator = {"late_p50_ms": 0.1, "late_p99_ms": 0.4, "realtime": 1.0, "written": 9.0}
    assert link_health("userspace", emulator) == {
        "emulator_late_p99_ms": 0.4, "emulator_realtime": 1.0, "replay_late_p99_ms": None,
        "replay_late_max_ms": None, "replay_steps_skipped": None}
    replay = {"late_p50_ms": 0.5, "late_p99_ms": 2.5, "late_max_ms": 7.0,
              "rate_changes": 100.0, "steps_skipped": 3.0}
    assert link_health("netem", replay) == {
        "emulator_late_p99_ms": None, "emulator_realtime": None, "replay_late_p99_ms": 2.5,
        "replay_late_max_ms": 7.0, "replay_steps_skipped": 3.0}


def test_the_matched_comparison_runs_in_either_order() -> None:
    from testbed.links.model import direction_spec
    from testbed.tools.bench_link import bench_profiles

    default = {bp.key: bp.profile for bp in bench_profiles()}
    mahimahi = {bp.key: bp.profile for bp in bench_profiles("mahimahi")}
    assert set(default) == set(mahimahi)
    for key, profile in mahimahi.items():
        link = profile.link
        assert link is not None
        assert link.order == "mahimahi"
        assert default[key].link.order == "link_then_delay"  # type: ignore[union-attr]
        assert direction_spec(link, "down").delay_first
        assert not direction_spec(link, "up").delay_first
