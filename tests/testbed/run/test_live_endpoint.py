"""A live campaign whose model server dies mid-run: the episodes it took down are
infrastructure failures with the endpoint named (not model failures), nothing committed
is lost, and ``--resume`` against a restarted server finishes the run.

Real node processes (loopback) and the stand-in server as a real child process, killed
by its pid while the campaign runs.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from urllib.parse import urlsplit

import pandas as pd
import pytest
import trio
from rich.console import Console

from testbed.campaign.model import Campaign
from testbed.campaign.parse import load_campaign
from testbed.report.attempts import collapse
from testbed.results.aborts import retried_on_resume
from testbed.run.episode import EpisodeRunner
from testbed.run.loop import run_campaign
from testbed.tools.stand_in_process import open_stand_in, open_stand_in_process

pytestmark = pytest.mark.slow


def preset(url: str, templates: int) -> Campaign:
    campaign = load_campaign("live").with_templates(templates)
    assert campaign.model is not None
    return dataclasses.replace(campaign, model=dataclasses.replace(campaign.model,
                                                                   base_url=url))


async def run(campaign: Campaign, out: Path, *, resume: bool) -> None:
    # the code may change under a resume here (a shared checkout): not what is tested
    await run_campaign(campaign, out, resume=resume, runner=EpisodeRunner(campaign),
                       console=Console(file=io.StringIO(), width=200),
                       allow_code_change=resume)


def committed(out: Path) -> list[Path]:
    folder = out / "shards" / "episodes"
    return sorted(p for p in folder.glob("*.parquet") if not p.name.startswith(".")) \
        if folder.is_dir() else []


async def test_a_killed_server_aborts_its_episodes_and_resume_finishes_them(
        tmp_path: Path) -> None:
    out = tmp_path / "live"
    async with open_stand_in_process("--latency", "0.05") as (url, process):
        campaign = preset(url, 3)  # 9 episodes: 3 templates x 3 policies

        async def kill_after_two() -> None:
            while len(committed(out)) < 2:
                await trio.sleep(0.05)
            process.kill()  # the server is gone mid-campaign, by its pid

        async with trio.open_nursery() as nursery:
            nursery.start_soon(kill_after_two)
            await run(campaign, out, resume=False)
            nursery.cancel_scope.cancel()
    first = pd.read_parquet(out / "episodes.parquet")
    assert len(first) == 9
    done = first[~first["aborted"]]
    lost = first[first["aborted"]]
    assert 2 <= len(done) < 9
    assert len(lost) >= 1
    # every abort is the endpoint's, named, and none is counted as the model's
    assert lost["abort_reason"].str.startswith(f"model_endpoint: {url} unavailable").all()
    assert lost["abort_reason"].map(retried_on_resume).all()
    actions = pd.read_parquet(out / "actions.parquet")
    assert set(actions["episode"]) == set(done["episode"])  # nothing imputed for an abort
    assert (actions["model_failures"] == 0).all()
    kept = {(e, a) for e, a in zip(done["episode"], done["attempt"], strict=True)}

    port = str(urlsplit(url).port)  # the restarted server: same address, same campaign
    async with open_stand_in("--latency", "0.05", "--port", port) as again:
        assert again == url
        await run(campaign, out, resume=True)
    episodes = pd.read_parquet(out / "episodes.parquet")
    actions = pd.read_parquet(out / "actions.parquet")
    finished = episodes[~episodes["aborted"]]
    # each episode finished exactly once; the committed ones were neither lost nor rerun
    assert sorted(finished["episode"]) == sorted(first["episode"])
    assert kept <= set(zip(finished["episode"], finished["attempt"], strict=True))
    assert len(episodes) == 9 + len(lost)  # the aborted attempts stay on the record
    rerun = finished[finished["episode"].isin(lost["episode"])]
    assert (rerun["attempt"] == 2).all()
    assert len(actions) == 9
    assert actions["episode"].is_unique
    fresh = actions["policy"] == "owner_head_freshness"  # Table 1(b)'s pattern, whole
    assert actions[~fresh]["task_success"].all()
    assert not actions[fresh]["task_success"].any()
    verdicts = collapse(episodes, actions)
    assert len(verdicts.episodes) == 9
    assert not verdicts.episodes["aborted"].any()
    assert len(verdicts.actions) == 9
