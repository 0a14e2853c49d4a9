"""A committed live study replays from its recordings, with no model present.

``results/live`` was run against a real model (SmolLM2 under llama.cpp, its identity in
the manifest). Here the stand-in server answers every prompt with the responses that
run recorded (``testbed model-server --replay``), the committed campaign file runs
again on its first templates, and every outcome must equal the committed one: the
recordings, the harness and the policies together reproduce what the model's run
showed. A prompt the recordings lack is an HTTP 500 there, never an invented answer, so
a prompt that changed shows up as a differing outcome.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from testbed.campaign.parse import load_campaign
from testbed.run.episode import EpisodeRunner
from testbed.run.loop import run_campaign
from testbed.tools.stand_in_process import open_stand_in

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
RUN = ROOT / "results" / "live"
TEMPLATES = 6  # two tasks per family, three arms: 18 tasks
OUTCOMES = ["episode", "policy", "schedule_digest", "outcome", "primary_outcome", "replans",
            "task_success", "invalid", "plan_from_initial", "executor_held_revision",
            "model_failures", "corrections", "auditor_actions", "auditor_incorrect"]


async def test_the_committed_live_run_replays_to_identical_outcomes(tmp_path: Path) -> None:
    committed = pd.read_parquet(RUN / "actions.parquet")
    campaign = load_campaign(ROOT / "results" / "configs" / "live.toml")
    assert campaign.model is not None
    campaign = campaign.with_templates(TEMPLATES)
    async with open_stand_in("--replay", str(RUN)) as url:  # serves the recorded name
        campaign = dataclasses.replace(campaign, model=dataclasses.replace(
            campaign.model, base_url=url))
        await run_campaign(campaign, tmp_path / "replay", resume=False,
                           runner=EpisodeRunner(campaign),
                           console=Console(file=io.StringIO(), width=200))
    again = pd.read_parquet(tmp_path / "replay" / "actions.parquet")
    assert len(again) == 3 * TEMPLATES
    keep = [c for c in OUTCOMES if c in committed.columns]
    expected = committed[committed["episode"].isin(set(again["episode"]))][keep]
    assert len(expected) == len(again)
    pd.testing.assert_frame_equal(
        again[keep].sort_values("episode").reset_index(drop=True),
        expected.sort_values("episode").reset_index(drop=True))
