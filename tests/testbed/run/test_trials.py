"""Single-action trials on real node processes (loopback): updates during replanning
(appendix F) and the handoff scenarios (Table G.1), plus the explainable-cost columns
of ordinary episodes (handshake-free traffic, bytes by phase).

Each test runs a tiny campaign through the real runner (``EpisodeRunner``, five node
processes per group on 127.0.0.1). Timing is only used with wide margins: an update
scheduled half a second after a validation that takes milliseconds, an effect 1.5 s
after the release.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from rich.console import Console

import testbed.run.trials as trials
from testbed.campaign.model import Campaign
from testbed.campaign.parse import parse_campaign
from testbed.run.episode import EpisodeRunner
from testbed.run.loop import run_campaign
from testbed.run.verdict import build_head_log, effect_verdict

pytestmark = pytest.mark.slow


def campaign(kind: str, grid: dict[str, Any], *, templates: int = 1,
             options: dict[str, Any] | None = None) -> Campaign:
    data: dict[str, Any] = {"name": f"t-{kind}", "seed": 5, "templates": templates,
                            "grid": {"network": ["loopback"], "agents": [3], "keys": [6],
                                     **grid},
                            "options": {"episode_timeout_s": 120, **(options or {})}}
    if kind != "episodes":
        data["kind"] = kind
    return parse_campaign(data)


async def run(c: Campaign, out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    console = Console(file=io.StringIO(), width=200)
    await run_campaign(c, out, resume=False, runner=EpisodeRunner(c), console=console)
    return pd.read_parquet(out / "actions.parquet"), pd.read_parquet(out / "episodes.parquet")


@pytest.fixture
def scheduled_updates(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Replace the Poisson arrivals with explicit times (seconds from the action start)."""
    times: list[float] = []
    monkeypatch.setattr(trials, "poisson_times", lambda **_: list(times))
    return times


async def test_a_trial_without_updates_completes(tmp_path: Path) -> None:
    actions, episodes = await run(campaign("replanning", {
        "policy": ["planfence", "centralized_lineage"], "replan_delay_s": [0.2],
        "update_rate_per_s": [0]}), tmp_path / "out")
    assert list(actions["trial_outcome"]) == ["complete", "complete"]
    assert (actions["replans"] == 1).all()  # the first check found the revision
    assert (actions["relevant_updates"] == 0).all()
    assert (actions["action_s"] >= 0.2).all()  # the synthetic delay was spent ...
    assert (actions["stall_ms"] < 200).all()  # ... and is not stall
    assert not episodes["aborted"].any()


async def test_updates_during_a_long_replan_block_with_the_reason(tmp_path: Path) -> None:
    actions, _ = await run(campaign("replanning", {
        "policy": ["planfence", "centralized_lineage"], "replan_delay_s": [1],
        "update_rate_per_s": [20]}), tmp_path / "out")
    assert list(actions["trial_outcome"]) == ["block", "block"]
    assert actions["block_reason"].str.startswith("stale after replan").all()
    assert (actions["relevant_updates"] >= 1).all()
    assert not actions["invalid"].any()


async def test_unrelated_updates_leave_the_replan_alone(tmp_path: Path) -> None:
    actions, _ = await run(campaign("replanning", {
        "policy": ["planfence"], "replan_delay_s": [1], "update_rate_per_s": [20],
        "update_target": ["unrelated"]}), tmp_path / "out")
    assert list(actions["trial_outcome"]) == ["complete"]
    assert int(actions["unrelated_updates"].iloc[0]) >= 1
    assert int(actions["relevant_updates"].iloc[0]) == 0


async def test_an_update_between_the_final_check_and_the_effect_is_a_gap(
        tmp_path: Path, scheduled_updates: list[float]) -> None:
    scheduled_updates.append(0.6)  # validation takes milliseconds; the effect is at 1.5 s
    actions, _ = await run(campaign("replanning", {
        "policy": ["planfence"], "replan_delay_s": [0], "update_rate_per_s": [1]},
        options={"effect_delay_s": 1.5}), tmp_path / "out")
    row = actions.iloc[0]
    assert row["outcome"] == "released"
    assert row["trial_outcome"] == "gap"
    assert not row["invalid"]  # current when it was decided: the change came later
    assert row["relevant_updates"] == 1
    assert 0 < row["gap_ms"] < row["effect_lag_ms"]


async def test_the_action_deadline_blocks(tmp_path: Path) -> None:
    actions, _ = await run(campaign("replanning", {
        "policy": ["planfence"], "replan_delay_s": [3], "update_rate_per_s": [0]},
        options={"action_deadline_s": 1}), tmp_path / "out")
    assert actions.iloc[0]["trial_outcome"] == "block"
    assert actions.iloc[0]["block_reason"].startswith("deadline")


async def test_handoff_scenarios_on_live_nodes(tmp_path: Path) -> None:
    actions, episodes = await run(campaign("handoff", {
        "policy": ["session_read_set", "inherited_version_set", "planfence"]}),
        tmp_path / "out")
    # The history checker, from the trial's history alone, agrees with `invalid`.
    stale = episodes.set_index("episode")["stale_actions"].sort_index()
    invalid = actions.set_index("episode")["invalid"].astype(int).sort_index()
    assert invalid.to_dict() == stale.to_dict()
    assert int(invalid.sum()) > 0
    got = {(r.policy, r.scenario): (r.replans > 0, bool(r.invalid))
           for r in actions.itertuples()}
    assert got == {
        ("session_read_set", "unchanged"): (False, False),
        ("session_read_set", "same_session"): (True, False),
        ("session_read_set", "handoff"): (False, True),
        ("inherited_version_set", "unchanged"): (False, False),
        ("inherited_version_set", "same_session"): (True, False),
        ("inherited_version_set", "handoff"): (True, False),
        ("planfence", "unchanged"): (False, False),
        ("planfence", "same_session"): (True, False),
        ("planfence", "handoff"): (True, False),
    }
    same = actions[actions["scenario"] == "same_session"]
    assert (same["planner"] == same["executor"]).all()


async def test_handshake_free_traffic_is_the_same_with_fresh_and_reused_connections(
        tmp_path: Path) -> None:
    c = campaign("episodes", {"policy": ["planfence", "batched_all_key", "metadata_sync"],
                              "connection": ["fresh", "reuse"], "units": [16], "rho": [4]})
    _, episodes = await run(c, tmp_path / "out")
    wide = episodes.pivot_table(index="policy", columns="connection",
                                values=["kib_per_action", "kib_per_action_payload"])
    payload, total = wide["kib_per_action_payload"], wide["kib_per_action"]
    assert (payload["fresh"] == payload["reuse"]).all()
    assert (total["fresh"] > total["reuse"]).all()  # only the handshakes differ
    sent = episodes["kib_per_action"] * 1024 * episodes["attempted_actions"]
    phases = episodes[["setup_bytes", "planning_bytes", "query_bytes", "fetch_bytes",
                       "revalidation_bytes", "barrier_bytes", "commit_bytes"]].sum(axis=1)
    assert ((sent - phases).abs() < 1e-6).all()
    barriers = episodes.set_index(["policy", "connection"])["barrier_bytes"]
    assert (barriers.drop("metadata_sync", level="policy") == 0).all()
    assert (barriers.loc["metadata_sync"] > 0).all()


def test_effect_verdict_on_a_constructed_log() -> None:
    """A change logged after the issued version and before the effect is a gap."""
    timeline = build_head_log({"a0": [["k", 1, b"1" * 32, 100], ["k", 2, b"2" * 32, 500]]})
    assert effect_verdict(timeline, ["k"], {"k": b"1" * 32}, 400) == (True, None)
    assert effect_verdict(timeline, ["k"], {"k": b"1" * 32}, 600) == (False, 500)
    assert effect_verdict(timeline, ["k"], {"k": b"2" * 32}, 600) == (True, None)
