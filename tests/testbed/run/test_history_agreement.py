"""The history checker agrees with the testbed's own judge on real loopback campaigns.

A small campaign of a no-check baseline (``local_replica``), the unsafe
``owner_head_freshness`` and PlanFence, and one of every registered policy, run on real
node processes. Every committed episode has a history folder derived from the nodes'
logs; the checker, reading only those files, must call each released action stale
exactly when the testbed's ``invalid`` accounting does, give blocked actions no ``act``,
and its episode columns must match. Owner-head freshness refreshes memory before
acting, so its stale actions outside a validation window are "fresh memory, stale plan".
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import trio
from rich.console import Console

from protocols.history_check import CURRENT, STALE, check_history
from testbed.campaign.parse import parse_campaign
from testbed.report.load import load_run
from testbed.report.table_common import Options
from testbed.report.tables_history import history_tables
from testbed.results.history import episode_folders, read_episode
from testbed.run.episode import EpisodeRunner
from testbed.run.loop import run_campaign
from tests.names import policies

pytestmark = pytest.mark.slow

POLICIES = ["local_replica", "owner_head_freshness", "planfence"]


async def _campaign(tmp_path: Path, policies: list[str], *, templates: int, rho: list[float],
                    units: int) -> Path:
    campaign = parse_campaign({
        "name": "history-agreement", "seed": 7, "templates": templates,
        "options": {"episode_timeout_s": 120},
        "grid": {"policy": policies, "network": ["loopback"], "rho": rho, "agents": [3],
                 "keys": [6], "deps": [3], "units": [units], "connection": ["reuse"]}})
    out = tmp_path / "out"
    await run_campaign(campaign, out, resume=False, runner=EpisodeRunner(campaign),
                       console=Console(file=io.StringIO(), width=200))
    return out


def _assert_agreement(out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per released action: stale exactly when invalid; blocked: no act; the columns."""
    actions = pd.read_parquet(out / "actions.parquet")
    episodes = pd.read_parquet(out / "episodes.parquet").set_index("episode")
    assert not episodes["aborted"].any(), episodes["abort_reason"].dropna().tolist()
    folders = dict(episode_folders(out))
    assert set(folders) == set(episodes.index)
    judged = 0
    for key, rows in actions.groupby("episode"):
        result = check_history(read_episode(folders[str(key)]))
        verdicts = {v.action: v for v in result.verdicts}
        for row in rows.itertuples():
            if row.outcome != "released":
                assert row.action not in verdicts  # a blocked action issues nothing
                continue
            verdict = verdicts[str(row.action)]
            assert (verdict.status != CURRENT) == bool(row.invalid), (key, row.action)
            if row.policy == "owner_head_freshness" and verdict.status == STALE:
                assert verdict.fresh_memory_stale_plan, (key, row.action)
            judged += 1
        assert len(verdicts) == (rows["outcome"] == "released").sum()
        episode = episodes.loc[key]
        assert episode["stale_actions"] == rows["invalid"].sum()
        stale = [v for v in result.verdicts if v.status != CURRENT]
        assert episode["fresh_memory_stale_plan"] == sum(v.fresh_memory_stale_plan
                                                         for v in stale)
    assert judged == (actions["outcome"] == "released").sum() > 0
    return actions, episodes


async def test_the_checker_agrees_with_the_invalid_accounting_on_every_action(
        tmp_path: Path) -> None:
    out = await _campaign(tmp_path, POLICIES, templates=3, rho=[1, 4], units=32)
    actions, episodes = _assert_agreement(out)
    by_policy = actions.groupby("policy")["invalid"].sum()
    assert by_policy["local_replica"] > 0
    assert by_policy["owner_head_freshness"] > 0
    assert by_policy["planfence"] == 0
    assert (actions[actions["policy"] == "local_replica"]["invalid"] == 0).any()
    assert episodes["fresh_memory_stale_plan"].sum() > 0
    (table,) = history_tables(load_run(out), Options(draws=10, seed=0))
    stale = table.data.set_index("policy")["stale_actions"].to_dict()
    assert stale == {p: int(n) for p, n in by_policy.items()}

    proc = await trio.run_process(
        [sys.executable, "-m", "testbed", "history", "check", str(out)],
        capture_stdout=True, capture_stderr=True, check=False)
    assert proc.returncode == 1, proc.stderr
    summary = proc.stdout.decode().splitlines()[-1]
    assert f"{int(actions['invalid'].sum())} stale" in summary
    anomalies = [json.loads(line) for line in
                 (out / "history" / "anomalies.jsonl").read_text().splitlines()]
    assert {(a["episode"], a["action"]) for a in anomalies} == {
        (r.episode, r.action) for r in actions[actions["invalid"]].itertuples()}


async def test_the_checker_agrees_on_every_registered_policy(tmp_path: Path) -> None:
    out = await _campaign(tmp_path, policies(), templates=2, rho=[4], units=16)
    actions, _ = _assert_agreement(out)
    assert set(actions["policy"]) == set(policies())
    assert actions["invalid"].any()  # the unsafe ones issue stale actions
