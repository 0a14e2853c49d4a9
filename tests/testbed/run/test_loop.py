"""The resumable campaign loop (testbed.run.loop), driven by the FakeRunner twin."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
import trio

from testbed.campaign.model import CampaignError, episode_key
from testbed.campaign.parse import load_campaign, parse_campaign
from testbed.errors import HostError
from testbed.results.rundir import RunDir, RunDirError
from testbed.results.schema import ACTION_COLUMNS, EPISODE_COLUMNS, ResultRowError
from testbed.results.summary import summary_frame
from testbed.run.loop import run_campaign
from testbed.run.units import unshaped_networks
from tests.testbed.run.fake_runner import (
    REPO,
    SMALL,
    FakeRunner,
    SimulatedCrash,
    quiet,
    run_small,
)

pytestmark = pytest.mark.slow

# --- the campaign loop ---------------------------------------------------------------------


async def test_run_writes_manifest_shards_and_tables(tmp_path: Path) -> None:
    campaign = parse_campaign(SMALL)
    runner = FakeRunner()
    console = quiet()
    summary = await run_small(campaign, tmp_path / "out", runner, console=console)
    out = tmp_path / "out"
    episodes = pd.read_parquet(out / "episodes.parquet")
    actions = pd.read_parquet(out / "actions.parquet")
    assert tuple(episodes.columns) == EPISODE_COLUMNS
    assert tuple(actions.columns) == ACTION_COLUMNS
    expected = [episode_key(c, t) for c, t in campaign.episodes()]
    assert runner.calls == expected
    assert sorted(episodes["episode"]) == sorted(expected)
    assert len(actions) == episodes["scheduled_actions"].sum()
    assert summary.ran == len(expected) == 24
    assert runner.opened == runner.closed == [k for k, _ in campaign.groups()]
    assert set(actions.loc[actions["invalid"], "policy"]) == {"owner_head_freshness"}
    assert (episodes.groupby(["rho", "template"])["schedule_digest"].nunique() == 1).all()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["campaign"] == "small"
    assert manifest["config"] == campaign.config()
    assert manifest["status"] == "complete"
    assert manifest["versions"]["pyarrow"] == pa.__version__
    assert manifest["system"]["kernel"].startswith(os.uname().sysname)
    assert manifest["system"]["cpu_model"]  # which CPU ran it, and how fast (cpu_speed.py)
    assert manifest["sessions"][0]["python_probe_ms"] > 0
    assert set(manifest["groups"]) == {k.id for k, _ in campaign.groups()}
    assert manifest["backend"] == "none, userspace"
    assert len(manifest["git"]["revision"]) in (40, len("unknown"))
    printed = console.file.getvalue()  # type: ignore[attr-defined]
    assert "stall ms/action" in printed
    assert "owner_head_freshness" in printed


async def test_summary_rows_follow_the_campaign_file_not_shard_names(tmp_path: Path) -> None:
    # shard file names sort "r16" before "r4"; the summary keeps the file's order
    campaign = parse_campaign({**SMALL, "grid": {**SMALL["grid"], "rho": [4, 16]}})
    await run_small(campaign, tmp_path, FakeRunner())
    frame = summary_frame(tmp_path)
    assert list(frame["cell"]) == [c.id for c in campaign.cells()]


async def test_non_empty_directory_needs_resume(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(CampaignError, match="not empty; pass --resume"):
        await run_small(parse_campaign(SMALL), tmp_path, FakeRunner())
    with pytest.raises(CampaignError, match="no campaign manifest"):
        await run_small(parse_campaign(SMALL), tmp_path, FakeRunner(), resume=True)


async def test_resume_reruns_started_and_never_repeats_completed(tmp_path: Path) -> None:
    campaign = parse_campaign(SMALL)
    keys = [episode_key(c, t) for c, t in campaign.episodes()]
    first = FakeRunner(crash_at=[keys[5]])
    with pytest.raises(SimulatedCrash):
        await run_small(campaign, tmp_path, first)
    run_dir = RunDir(tmp_path)
    run_dir.open()
    assert run_dir.completed() == set(keys[:5])
    assert run_dir.ledger()[keys[5]] == ("started", 1)
    run_dir.close()
    assert json.loads((tmp_path / "manifest.json").read_text())["status"] == "interrupted"

    second = FakeRunner()
    summary = await run_small(campaign, tmp_path, second, resume=True)
    assert second.calls == keys[5:]
    assert (summary.skipped, summary.ran) == (5, len(keys) - 5)
    episodes = pd.read_parquet(tmp_path / "episodes.parquet")
    actions = pd.read_parquet(tmp_path / "actions.parquet")
    assert sorted(episodes["episode"]) == sorted(keys)
    assert not actions.duplicated(["episode", "action"]).any()
    assert len(actions) == episodes["scheduled_actions"].sum()
    run_dir.open()
    ledger = run_dir.ledger()
    run_dir.close()
    assert ledger[keys[5]] == ("complete", 2)
    assert all(ledger[k] == ("complete", 1) for k in keys[:5] + keys[6:])

    third = FakeRunner()
    await run_small(campaign, tmp_path, third, resume=True)
    assert third.calls == []
    assert third.opened == [], "no topology is built when nothing is left"


@pytest.mark.parametrize("existing", [False, True])
async def test_a_failed_start_leaves_nothing(tmp_path: Path, existing: bool) -> None:
    """A host that cannot build the first topology: nothing of the run remains, and a
    plain run on the same --out then works (no "not empty; pass --resume")."""
    out = tmp_path / "out"
    if existing:
        out.mkdir()
    campaign = parse_campaign(SMALL)
    for error in (HostError("backend netem: does not work on this host"),
                  KeyboardInterrupt()):
        failing = FakeRunner(open_error=error)
        with pytest.raises(type(error)):
            await run_small(campaign, out, failing)
        assert out.exists() == existing
        if existing:
            assert list(out.iterdir()) == []
    await run_small(campaign, out, FakeRunner())
    assert (out / "episodes.parquet").is_file()


async def test_a_run_that_committed_an_episode_keeps_its_directory(tmp_path: Path) -> None:
    campaign = parse_campaign(SMALL)
    keys = [episode_key(c, t) for c, t in campaign.episodes()]
    with pytest.raises(SimulatedCrash):
        await run_small(campaign, tmp_path / "o", FakeRunner(crash_at=[keys[1]]))
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["status"] == \
        "interrupted"
    with pytest.raises(CampaignError, match="not empty; pass --resume"):
        await run_small(campaign, tmp_path / "o", FakeRunner())


async def test_resume_refuses_a_different_campaign(tmp_path: Path) -> None:
    await run_small(parse_campaign(SMALL), tmp_path, FakeRunner())
    other = parse_campaign({**SMALL, "seed": 12})
    with pytest.raises(CampaignError, match=r"^--resume: .* different campaign \(field seed\)"):
        await run_small(other, tmp_path, FakeRunner(), resume=True)


async def test_resume_refuses_a_run_whose_trace_file_changed(tmp_path: Path) -> None:
    (tmp_path / "own.up").write_text("1\n")
    (tmp_path / "own.down").write_text("1\n")
    text = ('name = "own"\nseed = 2\ntemplates = 1\n[networks.mine]\nup_trace = "own.up"\n'
            'down_trace = "own.down"\n[grid]\npolicy = ["planfence"]\nnetwork = ["mine"]\n'
            'agents = [3]\nunits = [16]\n')
    (tmp_path / "c.toml").write_text(text)
    out = tmp_path / "out"
    campaign = load_campaign(tmp_path / "c.toml")
    await run_small(campaign, out, FakeRunner())
    manifest = RunDir(out).read_manifest()
    files = manifest["networks"]["mine"]["files"]
    assert [(f["role"], f["size"]) for f in files] == [("up_trace", 2), ("down_trace", 2)]
    assert manifest["config"]["networks"]["mine"]["up_trace"] == str(tmp_path / "own.up")
    await run_small(campaign, out, FakeRunner(), resume=True)  # unchanged: resumes
    (tmp_path / "own.down").write_text("1\n1\n")
    with pytest.raises(CampaignError, match=r"^--resume: networks\.mine\.down_trace: .*own\."
                       r"down changed since the run started \(sha256 "):
        await run_small(load_campaign(tmp_path / "c.toml"), out, FakeRunner(), resume=True)


async def test_aborted_episode_is_recorded_without_imputation(tmp_path: Path) -> None:
    campaign = parse_campaign(SMALL)
    keys = [episode_key(c, t) for c, t in campaign.episodes()]
    runner = FakeRunner(abort_at=[keys[2]])
    summary = await run_small(campaign, tmp_path, runner)
    assert summary.aborted == 1
    first = campaign.groups()[0][0]
    assert runner.opened[:2] == [first, first], "the group is rebuilt after an abort"
    assert len(runner.opened) == len(campaign.groups()) + 1
    assert runner.calls == keys
    episodes = pd.read_parquet(tmp_path / "episodes.parquet").set_index("episode")
    actions = pd.read_parquet(tmp_path / "actions.parquet")
    row = episodes.loc[keys[2]]
    assert bool(row["aborted"])
    assert row["abort_reason"] == "node a1 exited with status 1 during update"
    assert row["attempted_actions"] == 0
    assert row["scheduled_actions"] == campaign.schedule(*campaign.episodes()[2]).counts.actions
    assert pd.isna(row["stall_ms_per_action"])
    assert pd.isna(row["kib_per_action"])
    assert keys[2] not in set(actions["episode"])
    assert (~episodes.drop(index=keys[2])["aborted"]).all()


async def test_episode_timeout_aborts_and_the_campaign_goes_on(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    data = {**SMALL, "options": {"episode_timeout_s": 30}}
    campaign = parse_campaign(data)
    keys = [episode_key(c, t) for c, t in campaign.episodes()]
    runner = FakeRunner(hang_at=[keys[0]])
    summary = await run_small(campaign, tmp_path, runner)
    episodes = pd.read_parquet(tmp_path / "episodes.parquet").set_index("episode")
    assert episodes.loc[keys[0], "abort_reason"] == \
        "episode exceeded options.episode_timeout_s (30 s) by 30 s; the runner did not stop it"
    assert (summary.aborted, summary.ran) == (1, len(keys))


async def test_runner_rows_breaking_the_contract_are_refused(tmp_path: Path) -> None:
    campaign = parse_campaign(SMALL)
    with pytest.raises(ResultRowError, match="missing field"):
        await run_small(campaign, tmp_path, FakeRunner(bad_rows=True))
    run_dir = RunDir(tmp_path)
    run_dir.open()
    assert run_dir.completed() == set()
    run_dir.close()


def _measurements(out: Path) -> pd.DataFrame:
    episodes = pd.read_parquet(out / "episodes.parquet")
    return episodes.drop(columns=["wall_s"]).sort_values("episode").reset_index(drop=True)


async def test_lanes_run_each_episode_once_with_the_same_results(tmp_path: Path) -> None:
    campaign = parse_campaign(SMALL)
    keys = [episode_key(c, t) for c, t in campaign.episodes()]
    serial, parallel = FakeRunner(), FakeRunner()
    await run_small(campaign, tmp_path / "serial", serial)
    summary = await run_campaign(campaign, tmp_path / "parallel", resume=False,
                                 runner=parallel, console=quiet(), jobs=3)
    assert sorted(parallel.calls) == sorted(keys)
    assert summary.ran == len(keys)
    assert serial.max_open == 1
    assert parallel.max_open == 3, "three topologies were live at once"
    # loopback slices ran first and alone: never beside another topology
    loopback_calls = [k for k in parallel.calls if "_loopback_" in k]
    assert parallel.calls[:len(loopback_calls)] == loopback_calls
    assert parallel.max_open_with_loopback == 1
    # one (group, template) slice per topology: a template's policies run together
    units = {(c.group_key, t) for c, t in campaign.episodes()}
    assert len(parallel.opened) == len(units)
    assert all(len(t) == 1 for t in parallel.templates_per_group)
    pd.testing.assert_frame_equal(_measurements(tmp_path / "serial"),
                                  _measurements(tmp_path / "parallel"))
    manifest = json.loads((tmp_path / "parallel" / "manifest.json").read_text())
    assert manifest["sessions"][-1]["jobs"] == 3


async def test_a_campaigns_own_unshaped_network_runs_alone_like_loopback(
        tmp_path: Path) -> None:
    """Whether a unit runs alone is the profile's decision (no link), not the name's."""
    campaign = parse_campaign({**SMALL, "networks": {"bare": {"unshaped": True}},
                               "grid": {**SMALL["grid"], "network": ["fixed", "bare"]}})
    runner = FakeRunner(unshaped=("bare",))
    await run_campaign(campaign, tmp_path / "o", resume=False, runner=runner,
                       console=quiet(), jobs=3)
    bare = [k for k in runner.calls if "_bare_" in k]
    assert bare
    assert runner.calls[:len(bare)] == bare, "unshaped slices first"
    assert runner.max_open_with_loopback == 1, "and alone"
    assert unshaped_networks(campaign) == {"bare"}


async def test_a_failing_lane_stops_the_others_and_resume_finishes(tmp_path: Path) -> None:
    campaign = parse_campaign(SMALL)
    keys = [episode_key(c, t) for c, t in campaign.episodes()]
    with pytest.raises(SimulatedCrash):  # the error itself, not an exception group
        await run_campaign(campaign, tmp_path, resume=False, runner=FakeRunner(
            crash_at=[keys[7]]), console=quiet(), jobs=2)
    second = FakeRunner()
    await run_campaign(campaign, tmp_path, resume=True, runner=second, console=quiet(),
                       jobs=2)
    assert keys[7] in second.calls
    episodes = pd.read_parquet(tmp_path / "episodes.parquet")
    assert sorted(episodes["episode"]) == sorted(keys)


@pytest.mark.parametrize("jobs", [0, -1, 1.5])
async def test_jobs_must_be_a_positive_integer(tmp_path: Path, jobs: Any) -> None:
    with pytest.raises(CampaignError, match=r"^jobs: .* allowed: an integer >= 1"):
        await run_campaign(parse_campaign(SMALL), tmp_path, resume=False,
                           runner=FakeRunner(), console=quiet(), jobs=jobs)


async def test_a_directory_holds_one_run_at_a_time(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    holder = RunDir(fresh)
    holder.open()  # only the lock file and empty folders: still an empty run directory
    try:
        assert RunDir(fresh).is_empty() is True  # no manifest, no episode: nothing to keep ...
        with pytest.raises(RunDirError, match=r"in use by another `testbed run` \(pid "
                                              rf"{os.getpid()}\)"):
            RunDir(fresh).open()
    finally:
        holder.close()

    campaign = parse_campaign(SMALL)
    await run_small(campaign, tmp_path / "run", FakeRunner())
    holder = RunDir(tmp_path / "run")
    holder.open()
    try:
        runner = FakeRunner()
        with pytest.raises(RunDirError, match="in use by another `testbed run`"):
            await run_small(campaign, tmp_path / "run", runner, resume=True)
        assert runner.opened == []
    finally:
        holder.close()
    await run_small(campaign, tmp_path / "run", FakeRunner(), resume=True)  # released on close

    only_lock = tmp_path / "only-lock"
    only_lock.mkdir()
    (only_lock / ".run.lock").write_text("123\n")
    assert RunDir(only_lock).is_empty(), "a left-over lock file alone is not a run"


async def test_extend_runs_only_the_new_cells_and_templates(tmp_path: Path) -> None:
    small = parse_campaign(SMALL)
    await run_small(small, tmp_path, FakeRunner())
    grown_data = {**SMALL, "templates": 4, "description": "grown",
                  "grid": {**SMALL["grid"], "policy": [*SMALL["grid"]["policy"],
                                                       "batched_all_key"]}}
    grown = parse_campaign(grown_data)
    with pytest.raises(CampaignError, match=r"different campaign .*--extend"):
        await run_small(grown, tmp_path, FakeRunner(), resume=True)
    runner = FakeRunner()
    summary = await run_campaign(grown, tmp_path, resume=False, extend=True, runner=runner,
                                 console=quiet())
    old = {episode_key(c, t) for c, t in small.episodes()}
    every = [episode_key(c, t) for c, t in grown.episodes()]
    assert runner.calls == [k for k in every if k not in old]
    assert (summary.skipped, summary.ran) == (len(old), len(every) - len(old))
    episodes = pd.read_parquet(tmp_path / "episodes.parquet")
    assert sorted(episodes["episode"]) == sorted(every)
    # old and new episodes of a template share its schedule: they stay paired
    assert (episodes.groupby(["rho", "template"])["schedule_digest"].nunique() == 1).all()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["config"] == grown.config()
    assert manifest["sessions"][-1]["extended_from"] == {"templates": 2, "cells": 12}


async def test_a_clone_without_shards_extends_without_repeating(tmp_path: Path) -> None:
    """results/ commits the consolidated tables, not shards/ or state.sqlite: a clone
    must still resume and extend without rerunning a committed episode."""
    import shutil

    small = parse_campaign(SMALL)
    await run_small(small, tmp_path, FakeRunner())
    before = pd.read_parquet(tmp_path / "episodes.parquet")
    before_actions = pd.read_parquet(tmp_path / "actions.parquet")
    shutil.rmtree(tmp_path / "shards")
    (tmp_path / "state.sqlite").unlink()

    again = FakeRunner()
    await run_small(small, tmp_path, again, resume=True)
    assert again.calls == []
    grown = parse_campaign({**SMALL, "templates": 3})
    runner = FakeRunner()
    await run_campaign(grown, tmp_path, resume=False, extend=True, runner=runner,
                       console=quiet())
    assert runner.calls == [episode_key(c, t) for c, t in grown.episodes()
                            if t not in small.templates]
    after = pd.read_parquet(tmp_path / "episodes.parquet").set_index("episode")
    kept = after.loc[before["episode"]].reset_index()
    pd.testing.assert_frame_equal(kept, before, check_like=True)
    actions = pd.read_parquet(tmp_path / "actions.parquet")
    restored = actions[actions["episode"].isin(before["episode"])].reset_index(drop=True)
    pd.testing.assert_frame_equal(
        restored.sort_values(["episode", "action"]).reset_index(drop=True),
        before_actions.sort_values(["episode", "action"]).reset_index(drop=True))


@pytest.mark.parametrize(("change", "message"), [
    ({"seed": 12}, r"another seed"),
    ({"options": {"rpc_timeout_s": 3}}, r"another options"),
    ({"templates": 1}, r"template .* missing"),
    ({"grid": {**SMALL["grid"], "rho": [4]}}, r"cell .*_r1_.* missing"),
])
async def test_extend_refuses_what_would_change_or_drop_results(
        tmp_path: Path, change: dict[str, Any], message: str) -> None:
    await run_small(parse_campaign(SMALL), tmp_path, FakeRunner())
    other = parse_campaign({**SMALL, **change})
    with pytest.raises(CampaignError, match=r"^--extend: .*" + message):
        await run_campaign(other, tmp_path, resume=False, extend=True, runner=FakeRunner(),
                           console=quiet())


# --- kills: real SIGKILLs in a child process ------------------------------------------------

_CHILD = """
import io, os, signal, sys
from pathlib import Path
import trio
from rich.console import Console
from testbed.results import atomic
from testbed.run.loop import run_campaign
from testbed.run.units import unshaped_networks
from testbed.campaign.parse import load_campaign, parse_campaign
from testbed.errors import HostError
from tests.testbed.run.fake_runner import SMALL, FakeRunner

out, kill_at, at_commit = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "commit"
if at_commit:
    real_replace = os.replace
    def replace(src, dst):
        if "shards/episodes" in str(dst) and kill_at.replace("/", "~") in str(dst):
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(src, dst)
    atomic.os.replace = replace
runner = FakeRunner(kill_at=[] if at_commit else [kill_at])
trio.run(lambda: run_campaign(parse_campaign(SMALL), out, resume=False, runner=runner,
                              console=Console(file=io.StringIO())))
"""


def _killed_child(out: Path, kill_at: str, where: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(out), kill_at, where],
                          cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


@pytest.mark.parametrize("where", ["episode", "commit"])
async def test_sigkill_then_resume_loses_and_duplicates_nothing(tmp_path: Path,
                                                                where: str) -> None:
    campaign = parse_campaign(SMALL)
    keys = [episode_key(c, t) for c, t in campaign.episodes()]
    _killed_child(tmp_path, keys[3], where)
    assert not (tmp_path / "episodes.parquet").exists()
    if where == "commit":
        assert list((tmp_path / "shards" / "episodes").glob(".*.tmp-*")), \
            "the killed write left only a temporary file"
    run_dir = RunDir(tmp_path)
    run_dir.open()
    assert run_dir.completed() == set(keys[:3])
    assert run_dir.ledger()[keys[3]] == ("started", 1)
    assert not list((tmp_path / "shards").rglob(".*.tmp-*")), "leftovers removed on open"
    run_dir.close()

    runner = FakeRunner()
    await run_small(campaign, tmp_path, runner, resume=True)
    assert runner.calls == keys[3:]
    episodes = pd.read_parquet(tmp_path / "episodes.parquet")
    actions = pd.read_parquet(tmp_path / "actions.parquet")
    assert sorted(episodes["episode"]) == sorted(keys)
    assert not actions.duplicated(["episode", "action"]).any()
    assert len(actions) == episodes["scheduled_actions"].sum()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [s.get("status") for s in manifest["sessions"]] == [None, "complete"]



async def test_resume_of_a_run_killed_before_its_manifest_starts_afresh(tmp_path: Path) -> None:
    """A controller SIGKILLed between opening the directory and writing its manifest
    (seen by `testbed faults`, controller_kill) leaves a layout that --resume accepts."""
    killed = RunDir(tmp_path / "run")
    killed.open()
    killed.close()
    assert not killed.manifest_path.exists()
    campaign = parse_campaign(SMALL)
    runner = FakeRunner()
    await run_small(campaign, tmp_path / "run", runner, resume=True)
    assert runner.opened
