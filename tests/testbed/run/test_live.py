"""Live campaigns end to end: real node processes (loopback), the stand-in model server
as a real child process, the presets as users run them (shrunk to a few tasks).

The stand-in decides from the requirement it is given (rule-based, not a model), so
these tests check what the harness and the policies do with such a decider: the paper's
patterns of Table 1(b), C.2 and appendix F's live cohort, recorded decisions, and replay.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from testbed.campaign.decisions import read_calls
from testbed.campaign.model import Campaign
from testbed.campaign.parse import load_campaign, parse_campaign
from testbed.report.build import build_report
from testbed.run.episode import EpisodeRunner
from testbed.run.loop import run_campaign
from testbed.tools.stand_in_process import open_stand_in

pytestmark = pytest.mark.slow
NAMESPACES = os.geteuid() == 0 and os.path.exists("/dev/net/tun")


def preset(name: str, url: str, templates: int) -> Campaign:
    campaign = load_campaign(name).with_templates(templates)
    assert campaign.model is not None
    return dataclasses.replace(campaign, model=dataclasses.replace(campaign.model,
                                                                   base_url=url))


async def run(campaign: Campaign, out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    console = Console(file=io.StringIO(), width=200)
    await run_campaign(campaign, out, resume=False, runner=EpisodeRunner(campaign),
                       console=console)
    return pd.read_parquet(out / "actions.parquet"), pd.read_parquet(out / "episodes.parquet")


@pytest.fixture
async def stand_in() -> AsyncIterator[str]:
    async with open_stand_in() as url:
        yield url


async def test_table_1b_pattern_and_its_report(stand_in: str, tmp_path: Path) -> None:
    actions, episodes = await run(preset("live", stand_in, 3), tmp_path / "live")
    assert len(actions) == 9
    assert not episodes["aborted"].any()
    fresh = actions[actions["policy"] == "owner_head_freshness"]
    assert (fresh["primary_outcome"] == "obsolete").all()
    assert fresh["invalid"].all()
    assert (fresh["replans"] == 0).all()
    assert not fresh["task_success"].any()
    for policy in ("planfence", "centralized_lineage"):
        mine = actions[actions["policy"] == policy]
        assert (mine["replans"] == 1).all()
        assert (mine["outcome"] == "released").all()
        assert (mine["primary_outcome"] == "correct").all()
        assert mine["task_success"].all()
        assert not mine["invalid"].any()
        assert (mine["model_failures"] == 0).all()
        assert mine["replan_call_ms"].notna().all()
        assert (mine["role_calls"] == 4).all()
    assert (episodes["model_bytes"] > 0).all()
    # C.4's endpoint from recorded parents: the freshness executor held the revision and
    # acted from a plan derived from the initial requirement; the replacements did not
    assert fresh["executor_held_revision"].all()
    assert fresh["plan_from_initial"].all()
    assert not actions[actions["policy"] == "planfence"]["plan_from_initial"].any()
    summary = build_report(tmp_path / "live", draws=50)
    assert {"table_1b_loopback", "table_c4_loopback", "table_live_costs_loopback"} <= set(
        summary["tables"])
    table = pd.read_csv(tmp_path / "live" / "tables" / "table_1b_loopback.csv")
    by = table.set_index("policy")
    assert by.loc["owner_head_freshness", "primary_obsolete"] == 3
    assert by.loc["planfence", "task_success"] == 3
    assert by.loc["centralized_lineage", "successful_replans"] == 3
    report = (tmp_path / "live" / "report.md").read_text()
    assert "STAND-IN SERVER" in report
    assert "not a model" in report
    manifest = json.loads((tmp_path / "live" / "manifest.json").read_text())
    assert manifest["model"]["stand_in"]
    assert manifest["model"]["model"] == "planfence-stand-in"


async def test_every_role_decision_is_recorded_with_its_exact_parents(
        stand_in: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-never-written-anywhere-1234"
    monkeypatch.setenv("PFT_TEST_KEY", secret)  # the agents send it; nothing records it
    campaign = preset("live", stand_in, 3)
    assert campaign.model is not None
    campaign = dataclasses.replace(campaign, grids=tuple(
        {**g, "policy": ("planfence",)} for g in campaign.grids),
        model=dataclasses.replace(campaign.model, api_key_env="PFT_TEST_KEY"))
    await run(campaign, tmp_path / "run")
    written = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert not [p for p in written if secret.encode() in p.read_bytes()]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["model"]["api_key_env"] == "PFT_TEST_KEY"
    calls = list(read_calls(tmp_path / "run"))
    assert len(calls) == 12
    assert {c["role"] for c in calls} == {"planner", "executor", "replan", "auditor"}
    for task in {c["episode"] for c in calls}:
        mine = {c["role"]: c for c in calls if c["episode"] == task}
        plan, chosen, replan = mine["planner"], mine["executor"], mine["replan"]
        assert chosen["parents"][0] == plan["record"]  # the plan it was given ...
        assert chosen["parents"][1] == plan["parents"][0]  # ... and its own stale copy
        assert replan["parents"] != plan["parents"]
        assert len(replan["parents"]) == 1
        assert mine["auditor"]["parents"][0] == replan["record"]
        for call in mine.values():
            assert call["prompt_digest"]
            assert call["responses"]
            assert call["latency_ms"] > 0
            assert call["prompt_tokens"] > 0
            assert "api_key" not in json.dumps(call)


async def test_c2_the_fresh_control_adapts_and_its_auditor_undoes_it(
        stand_in: str, tmp_path: Path) -> None:
    actions, _ = await run(preset("live_fresh_before", stand_in, 3), tmp_path / "fb")
    fresh = actions[actions["executor_inputs"] == "fresh"]
    assert len(fresh) == 3
    assert (fresh["primary_outcome"] == "correct").all()
    assert (fresh["auditor_incorrect"] == 1).all()
    assert not fresh["task_success"].any()
    original = actions[(actions["executor_inputs"] == "local")
                       & (actions["policy"] == "owner_head_freshness")]
    assert (original["primary_outcome"] == "obsolete").all()
    planfence = actions[actions["policy"] == "planfence"]
    assert planfence["task_success"].all()
    assert (planfence["auditor_incorrect"] == 0).all()
    summary = build_report(tmp_path / "fb", draws=50)
    assert "table_c2_loopback" in summary["tables"]


async def test_an_update_during_the_replacement_generation_blocks(tmp_path: Path) -> None:
    async with open_stand_in("--latency", "matched") as url:  # 0.6 s per answer
        actions, _ = await run(preset("live_overlap", url, 3), tmp_path / "ov")
    overlapped = actions[actions["overlap"] == "in_generation"]
    assert len(overlapped) == 6
    assert overlapped["overlap_confirmed"].all()
    assert (overlapped["outcome"] == "blocked").all()
    assert (overlapped["replans"] == 1).all()
    assert overlapped["block_reason"].str.startswith("stale after replan").all()
    controls = actions[actions["overlap"] == "none"]
    assert (controls["primary_outcome"] == "correct").all()
    assert controls["overlap_confirmed"].isna().all()
    assert (overlapped["replan_call_ms"] > 500).all()  # the stand-in's 0.6 s, with margin
    summary = build_report(tmp_path / "ov", draws=50)
    table = pd.read_csv(tmp_path / "ov" / "tables" / "table_f_live_loopback.csv")
    assert "table_f_live_loopback" in summary["tables"]
    assert set(table.loc[table["overlap"] == "in_generation", "blocked_after_replan"]) == {3}


async def test_an_auditor_that_repeats_a_valid_primary_is_a_redundant_action(
        tmp_path: Path) -> None:
    """The auditor's own action goes through its policy's validation and is judged at
    its issue: after a correct primary a repeat is redundant (Table 1(b)'s column); after
    an obsolete one (owner-head freshness: the auditor's copy is as stale) it is wrong."""
    async with open_stand_in("--auditor-repeat-rate", "1") as url:
        actions, episodes = await run(preset("live", url, 3), tmp_path / "repeat")
    assert not episodes["aborted"].any()
    for policy in ("planfence", "centralized_lineage"):
        mine = actions[actions["policy"] == policy]
        assert (mine["auditor_actions"] == 1).all()
        assert (mine["redundant_auditor_actions"] == 1).all()
        assert (mine["auditor_incorrect"] == 0).all()
        assert mine["task_success"].all()
    fresh = actions[actions["policy"] == "owner_head_freshness"]
    assert (fresh["auditor_actions"] == 1).all()
    assert (fresh["redundant_auditor_actions"] == 0).all()
    assert (fresh["auditor_incorrect"] == 1).all()
    build_report(tmp_path / "repeat", draws=50)
    table = pd.read_csv(tmp_path / "repeat" / "tables" / "table_1b_loopback.csv")
    assert dict(zip(table["policy"], table["redundant_auditor_actions"], strict=True)) == {
        "owner_head_freshness": 0, "centralized_lineage": 3, "planfence": 3}


async def test_model_failures_are_counted_never_accepted(tmp_path: Path) -> None:
    async with open_stand_in("--fault", "malformed") as url:
        campaign = preset("live", url, 3)
        actions, episodes = await run(campaign, tmp_path / "bad")
    assert not episodes["aborted"].any()
    assert (actions["primary_outcome"] == "model_failure").all()
    assert (actions["outcome"] == "blocked").all()
    assert not actions["task_success"].any()
    assert (actions["model_failures"] == 1).all()
    assert (actions["corrections"] == 1).all()
    assert actions["block_reason"].str.contains("schema violation").all()


async def test_recorded_decisions_replay_to_identical_schedules_and_outcomes(
        stand_in: str, tmp_path: Path) -> None:
    await run(preset("live", stand_in, 3), tmp_path / "live")
    # the live workflow again, its answers taken from the recorded decisions
    async with open_stand_in("--replay", str(tmp_path / "live")) as url:
        again, _ = await run(preset("live", url, 3), tmp_path / "again")
    first = pd.read_parquet(tmp_path / "live" / "actions.parquet")
    keep = ["episode", "schedule_digest", "outcome", "replans", "primary_outcome",
            "task_success", "invalid", "plan_from_initial"]
    pd.testing.assert_frame_equal(first[keep].sort_values("episode").reset_index(drop=True),
                                  again[keep].sort_values("episode").reset_index(drop=True))
    # a replay campaign of the cost grid on the decisions the live run's planners made
    replay = {"name": "replay", "seed": 9, "templates": 3,
              "decisions": str(tmp_path / "live"),
              "grid": {"policy": ["planfence", "owner_head_freshness"],
                       "network": ["loopback"], "units": [16]}}
    outcomes = []
    for n in (1, 2):
        actions, _ = await run(parse_campaign(replay), tmp_path / f"replay{n}")
        outcomes.append(actions[["episode", "action", "schedule_digest", "outcome",
                                 "invalid", "replans"]].sort_values(["episode", "action"])
                        .reset_index(drop=True))
    pd.testing.assert_frame_equal(outcomes[0], outcomes[1])
    plain = parse_campaign({k: v for k, v in replay.items() if k != "decisions"})
    ours = parse_campaign(replay)
    cell = ours.cells()[0]
    recorded = {json.dumps(c["decision"], sort_keys=True, separators=(",", ":"))
                for c in read_calls(tmp_path / "live") if c["role"] == "planner"}
    for template in ours.templates:
        assert ours.schedule(cell, template).digest != plain.schedule(cell, template).digest
        assert {p.decision for p in ours.schedule(cell, template).plans()} <= recorded


def test_an_unreachable_endpoint_is_one_host_error_before_any_episode(tmp_path: Path) -> None:
    path = tmp_path / "live.toml"
    path.write_text('name = "x"\nseed = 1\ntemplates = 3\nkind = "live"\n'
                    '[model]\nbase_url = "http://127.0.0.1:9/v1"\n'
                    '[grid]\npolicy = ["planfence"]\nnetwork = ["loopback"]\n')
    proc = subprocess.run([sys.executable, "-m", "testbed", "run", str(path), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120, check=False, stdin=subprocess.DEVNULL)
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        "testbed run: model.base_url: http://127.0.0.1:9/v1 is unreachable")
    assert not (tmp_path / "out" / "shards" / "episodes").exists() or not any(
        (tmp_path / "out" / "shards" / "episodes").iterdir())


async def test_a_model_the_server_does_not_serve_is_a_user_error(stand_in: str,
                                                                  tmp_path: Path) -> None:
    campaign = preset("live", stand_in, 3)
    assert campaign.model is not None
    campaign = dataclasses.replace(campaign, model=dataclasses.replace(
        campaign.model, model="qwen-imaginary"))
    with pytest.raises(Exception, match=r"^model\.model: 'qwen-imaginary' is not served by"):
        await run(campaign, tmp_path / "out")


@pytest.mark.privileged
@pytest.mark.skipif(not NAMESPACES, reason="needs root and /dev/net/tun")
async def test_a_server_behind_the_central_host_is_reached_across_the_links(
        stand_in: str, tmp_path: Path) -> None:
    """On ``fixed`` (20 ms per link crossing) a role call to a server behind the central
    host crosses the agent's uplink and the central host's downlink and back: at least
    one 80 ms round trip, which a server beside the agent never costs, and its bytes are
    on the links."""
    results = {}
    for placement in ("beside", "central"):
        campaign = preset("live", stand_in, 1)
        assert campaign.model is not None
        campaign = dataclasses.replace(
            campaign, model=dataclasses.replace(campaign.model, placement=placement),
            grids=tuple({**g, "policy": ("planfence",), "network": ("fixed",)}
                        for g in campaign.grids))
        results[placement] = await run(campaign, tmp_path / placement)
    (beside, beside_ep), (central, central_ep) = results["beside"], results["central"]
    assert beside["task_success"].all()
    assert central["task_success"].all()
    # one 80 ms round trip at least (the pooled connection is reused), whatever the load
    assert central["replan_call_ms"].iloc[0] >= 75
    assert central["replan_call_ms"].iloc[0] > beside["replan_call_ms"].iloc[0]
    extra = int(central_ep["link_bytes"].iloc[0]) - int(beside_ep["link_bytes"].iloc[0])
    model_bytes = int(central_ep["model_bytes"].iloc[0])
    assert model_bytes > 0
    assert extra >= model_bytes
    assert central_ep["kib_per_action"].iloc[0] == pytest.approx(
        beside_ep["kib_per_action"].iloc[0], rel=0.05)  # data plane unchanged
