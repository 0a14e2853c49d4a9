"""A frozen node aborts its episode as ``node_unresponsive``, never measured as stall
(issue 11, "A frozen node is measured as stall"). Real node processes on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.campaign.model import Campaign, Cell, GroupKey
from testbed.campaign.parse import load_campaign
from testbed.campaign.workload import Schedule
from testbed.run.contract import DelegatingGroup, EpisodeResult
from testbed.run.episode import EpisodeRunner, TeamGroup
from testbed.run.loop import run_campaign
from tests.testbed.run.fake_runner import quiet

CAMPAIGN = """
name = "frozen"
seed = 3
templates = 1

[options]
rpc_timeout_s = 2
episode_timeout_s = 60

[grid]
policy = ["planfence"]
network = ["loopback"]
rho = [4]
agents = [3]
keys = [6]
connection = ["reuse"]
units = [16]
"""
STOP_FOR_S = 8.0  # the node stays stopped until the episode is over (then SIGCONT)


def campaign(tmp_path: Path) -> Campaign:
    path = tmp_path / "frozen.toml"
    path.write_text(CAMPAIGN)
    return load_campaign(str(path))


class _Freezing(DelegatingGroup[TeamGroup]):
    """Wraps the real group: SIGSTOPs one node shortly after its first episode starts."""

    def __init__(self, group: TeamGroup, stopped: list[float]) -> None:
        super().__init__(group)
        self.stopped = stopped

    async def run_episode(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        """At the episode's first protected action, freeze a node other than the
        executor (so the controller is not itself waiting on the frozen node)."""
        team = self.group.team
        real_call = team.call
        pids: list[int] = []

        async def call(agent: str, op: str, **args: Any) -> dict[str, Any]:
            if op == "act" and not self.stopped:
                victim = next(a for a in team.agents if a != agent)
                pid = team.pid(victim)
                assert pid is not None
                os.kill(pid, signal.SIGSTOP)
                pids.append(pid)
                self.stopped.append(time.monotonic())
            return await real_call(agent, op, **args)

        team.call = call  # type: ignore[method-assign]
        try:
            return await self.group.run_episode(cell, schedule)
        finally:
            team.call = real_call  # type: ignore[method-assign]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)


class _FreezingRunner:
    def __init__(self, inner: EpisodeRunner) -> None:
        self.inner = inner
        self.stopped: list[float] = []

    @asynccontextmanager
    async def open_group(self, key: GroupKey, cells: Sequence[Cell]
                         ) -> AsyncIterator[_Freezing]:
        async with self.inner.open_group(key, cells) as group:
            yield _Freezing(group, self.stopped)


async def test_sigstopped_node_aborts_episode_as_node_unresponsive(tmp_path: Path) -> None:
    camp = campaign(tmp_path)
    runner = _FreezingRunner(EpisodeRunner(camp, workdir_root=tmp_path))
    started = time.monotonic()
    summary = await run_campaign(camp, tmp_path / "out", resume=False, runner=runner,
                                 console=quiet())
    assert runner.stopped, "the node was never stopped (episode too short?)"
    assert summary.aborted == 1
    episodes = pd.read_parquet(tmp_path / "out" / "episodes.parquet")
    row = episodes.iloc[0]
    assert bool(row["aborted"])
    assert row["abort_reason"].startswith("node_unresponsive"), row["abort_reason"]
    # nothing charged: no stall, no action rows
    assert pd.isna(row["stall_ms_per_action"])
    assert not (tmp_path / "out" / "actions.parquet").exists() or \
        pd.read_parquet(tmp_path / "out" / "actions.parquet").empty
    # found within the heartbeat bound (1 s here; wide margin), and the whole run
    # (with the teardown of the frozen team) bounded too
    assert row["wall_s"] < STOP_FOR_S
    assert time.monotonic() - started < 30
