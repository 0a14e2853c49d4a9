"""Repeats, reruns of disturbed attempts and resume, with real node processes on loopback.

The episodes are real (node processes, sockets, SQLite, the nodes' own scheduling-delay
measurements); only *which* attempts count as disturbed is scripted here, by a group
wrapper that overrides the measured verdict, so the rerun logic is tested apart from the
host's load (tests/testbed/run/test_disturbance_hog.py tests the measurement itself).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pandas as pd
import pytest

from testbed.campaign.model import Cell, GroupKey, episode_key
from testbed.campaign.parse import parse_campaign
from testbed.campaign.workload import Schedule
from testbed.report.load import load_run
from testbed.results.rundir import RunDir
from testbed.run.attempts import AttemptPolicy
from testbed.run.contract import DelegatingGroup, EpisodeResult, Group
from testbed.run.episode import EpisodeRunner
from testbed.run.loop import run_campaign
from tests.testbed.run.fake_runner import SimulatedCrash, quiet

CAMPAIGN = {
    "name": "attempts", "seed": 5, "templates": 2,
    "options": {"episode_timeout_s": 120},
    "grid": {"policy": ["planfence", "batched_all_key"], "network": ["loopback"],
             "agents": [3], "keys": [6], "units": [8], "rho": [4]},
}

Script = Callable[[str, int], bool]  # (episode key, run number of that key) -> disturbed


class ScriptedRunner:
    """Real groups whose episodes' ``disturbed`` verdict follows a script."""

    def __init__(self, inner: EpisodeRunner, script: Script,
                 crash_at: tuple[str, int] | None = None) -> None:
        self.inner = inner
        self.script = script
        self.crash_at = crash_at
        self.runs: Counter[str] = Counter()

    @asynccontextmanager
    async def open_group(self, key: GroupKey, cells: Sequence[Cell]) -> AsyncIterator[Group]:
        async with self.inner.open_group(key, cells) as group:
            yield _Scripted(group, self)


class _Scripted(DelegatingGroup[Group]):
    def __init__(self, group: Group, runner: ScriptedRunner) -> None:
        super().__init__(group)
        self.runner = runner

    async def run_episode(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        key = episode_key(cell, schedule.template)
        self.runner.runs[key] += 1
        n = self.runner.runs[key]
        if self.runner.crash_at == (key, n):
            raise SimulatedCrash(key)
        result = await self.group.run_episode(cell, schedule)
        assert result.episode["node_cpu_ms"] > 0  # measured by the real nodes
        disturbed = self.runner.script(key, n)
        result.episode["disturbed"] = disturbed
        result.episode["disturbed_reason"] = "scripted" if disturbed else ""
        return result


def _holds(exc: BaseException, kind: type[BaseException]) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_holds(e, kind) for e in exc.exceptions)
    return isinstance(exc, kind)


def _episodes(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "episodes.parquet").sort_values(["episode", "attempt"])


async def _run(out: Path, runner: ScriptedRunner, policy: AttemptPolicy, *,
               resume: bool = False) -> None:
    campaign = parse_campaign(CAMPAIGN)
    await run_campaign(campaign, out, resume=resume, console=quiet(), runner=runner,
                       attempts=policy)


@pytest.mark.slow
async def test_repeats_are_separate_numbered_attempts_and_the_cost_is_their_median(
        tmp_path: Path) -> None:
    campaign = parse_campaign(CAMPAIGN)
    runner = ScriptedRunner(EpisodeRunner(campaign), lambda key, n: False)
    out = tmp_path / "out"
    await _run(out, runner, AttemptPolicy(repeats=3))
    episodes = _episodes(out)
    keys = [episode_key(c, t) for c, t in campaign.episodes()]
    assert len(episodes) == 3 * len(keys)
    for _, part in episodes.groupby("episode"):
        assert list(part["attempt"]) == [1, 2, 3]
        assert sorted(part["repeat"]) == [1, 2, 3]
        assert part["schedule_digest"].nunique() == 1
        assert part["node_runq_wait_ms"].notna().all()
    shards = sorted(p.name for p in (out / "shards" / "episodes").iterdir())
    assert sum("@" in name for name in shards) == 2 * len(keys)
    actions = pd.read_parquet(out / "actions.parquet")
    assert set(actions.groupby("episode")["attempt"].nunique()) == {3}
    run = load_run(out)
    assert len(run.episodes) == len(keys)
    for key, row in run.episodes.set_index("episode").iterrows():
        attempts = episodes[episodes["episode"] == key]
        assert row["stall_ms_per_action"] == pytest.approx(
            attempts["stall_ms_per_action"].median())
        assert row["scheduled"] == attempts["scheduled_actions"].sum()
        assert row["attempts"] == 3
    assert sum(runner.runs.values()) == 3 * len(keys)


@pytest.mark.slow
async def test_a_disturbed_attempt_is_rerun_up_to_n_times_and_every_attempt_is_kept(
        tmp_path: Path) -> None:
    campaign = parse_campaign(CAMPAIGN)
    keys = [episode_key(c, t) for c, t in campaign.episodes()]
    always = keys[0]  # disturbed every time: 1 + 2 attempts, verdict from the first

    def script(key: str, n: int) -> bool:
        return key == always or n == 1  # every other episode: only its first attempt

    runner = ScriptedRunner(EpisodeRunner(campaign), script)
    out = tmp_path / "out"
    await _run(out, runner, AttemptPolicy(rerun_disturbed=2))
    episodes = _episodes(out)
    counts = episodes.groupby("episode")["attempt"].apply(list).to_dict()
    assert counts[always] == [1, 2, 3]
    for key in keys[1:]:
        assert counts[key] == [1, 2]
    assert (episodes["repeat"] == 1).all()
    view = load_run(out).episodes.set_index("episode")
    assert bool(view.loc[always, "disturbed"])
    first = episodes[(episodes["episode"] == always) & (episodes["attempt"] == 1)]
    assert view.loc[always, "stall_ms_per_action"] == pytest.approx(
        float(first["stall_ms_per_action"].iloc[0]))
    for key in keys[1:]:
        second = episodes[(episodes["episode"] == key) & (episodes["attempt"] == 2)]
        assert not bool(view.loc[key, "disturbed"])
        assert view.loc[key, "stall_ms_per_action"] == pytest.approx(
            float(second["stall_ms_per_action"].iloc[0]))
    # without --rerun-disturbed nothing is rerun, however disturbed
    plain = ScriptedRunner(EpisodeRunner(campaign), lambda key, n: True)
    await _run(tmp_path / "plain", plain, AttemptPolicy())
    assert set(plain.runs.values()) == {1}


@pytest.mark.slow
async def test_resume_finishes_an_interrupted_rerun_without_duplicates(tmp_path: Path) -> None:
    campaign = parse_campaign(CAMPAIGN)
    keys = [episode_key(c, t) for c, t in campaign.episodes()]
    victim = keys[1]
    policy = AttemptPolicy(repeats=2, rerun_disturbed=1)

    def script(key: str, n: int) -> bool:
        return n == 1  # the first run of every episode is disturbed

    crashing = ScriptedRunner(EpisodeRunner(campaign), script, crash_at=(victim, 2))
    out = tmp_path / "out"
    with pytest.raises((SimulatedCrash, BaseExceptionGroup)) as caught:
        await _run(out, crashing, policy)
    assert _holds(caught.value, SimulatedCrash)
    run_dir = RunDir(out)
    run_dir.open()
    try:
        before = run_dir.attempts()
    finally:
        run_dir.close()
    assert [a.attempt for a in before[victim]] == [1]  # its rerun died with no rows
    resumed = ScriptedRunner(EpisodeRunner(campaign), lambda key, n: False)
    await _run(out, resumed, policy, resume=True)
    episodes = _episodes(out)
    assert not episodes.duplicated(["episode", "attempt"]).any()
    victim_rows = episodes[episodes["episode"] == victim]
    assert list(victim_rows["attempt"]) == [1, 2, 3]  # rerun of repeat 1, then repeat 2
    assert list(victim_rows["repeat"]) == [1, 1, 2]
    for key in keys:
        part = episodes[episodes["episode"] == key]
        assert list(part["attempt"]) == list(range(1, len(part) + 1))
        assert set(part["repeat"]) == {1, 2}
    # a further resume has nothing left to do
    idle = ScriptedRunner(EpisodeRunner(campaign), lambda key, n: False)
    await _run(out, idle, policy, resume=True)
    assert sum(idle.runs.values()) == 0
