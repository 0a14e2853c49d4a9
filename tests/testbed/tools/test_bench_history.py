"""``testbed bench history`` on a small history: every action judged, some stale."""

from __future__ import annotations

from testbed.tools.bench_history import bench_history


def test_the_benchmark_judges_a_seeded_history_with_stale_and_current_actions() -> None:
    first, again = bench_history(5_000), bench_history(5_000)
    assert first["events"] >= 5_000
    assert 0 < first["stale"] < first["actions"]
    assert first["fresh_memory_stale_plan"] > 0
    assert first["events_per_s"] > 0
    # seeded: the same history gives the same verdicts
    assert {k: first[k] for k in ("events", "actions", "stale", "stale_in_window")} == \
        {k: again[k] for k in ("events", "actions", "stale", "stale_in_window")}
