"""A frozen node aborts its episode as ``node_unresponsive``, never measured as stall
(issue 11, "A frozen node is measured as stall"; issue 20, a freeze just longer than
the heartbeat timeout). Real node processes on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import trio
import trio.testing

from testbed.campaign.model import Campaign, Cell, GroupKey
from testbed.campaign.parse import load_campaign
from testbed.campaign.workload import Schedule
from testbed.run.contract import DelegatingGroup, EpisodeResult
from testbed.run.episode import EpisodeRunner, TeamGroup
from testbed.run.liveness import PingSchedule, watch_pings
from testbed.run.loop import run_campaign
from testbed.run.team import heartbeat_timeout_s
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


def campaign(tmp_path: Path, *, seed: int = 3) -> Campaign:
    path = tmp_path / "frozen.toml"
    path.write_text(CAMPAIGN.replace("seed = 3", f"seed = {seed}"))
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


@pytest.mark.slow
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


# --- a freeze just longer than the heartbeat timeout (issue 20) ----------------------------
HEARTBEAT_S = 1.0  # heartbeat_timeout_s(rpc_timeout_s = 2)


class _FreezeAfterPing(DelegatingGroup[TeamGroup]):
    """At the first protected action that asks another node (the owner of one of its
    keys), SIGSTOP that owner right after it answered a heartbeat ping (the phase that
    hides a freeze longest from a watcher that sleeps between pings), start the action,
    and SIGCONT the owner ``freeze_s`` later, while the action still waits on it."""

    def __init__(self, group: TeamGroup, freeze_s: float, frozen: list[str]) -> None:
        super().__init__(group)
        self.freeze_s = freeze_s
        self.frozen = frozen

    async def run_episode(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        team = self.group.team
        real_call = team.call
        timers: list[threading.Timer] = []
        pids: list[int] = []

        async def call(agent: str, op: str, **args: Any) -> dict[str, Any]:
            owners = [team.owners[k] for k in args.get("keys", ()) if team.owners[k] != agent]
            if op == "act" and owners and not self.frozen:
                victim = owners[0]
                await _next_ping_answer(team, victim)
                pid = team.pid(victim)
                assert pid is not None
                os.kill(pid, signal.SIGSTOP)
                timer = threading.Timer(self.freeze_s, _resume, (pid,))
                timer.start()
                timers.append(timer)
                pids.append(pid)
                self.frozen.append(victim)
            return await real_call(agent, op, **args)

        team.call = call  # type: ignore[method-assign]
        try:
            return await self.group.run_episode(cell, schedule)
        finally:
            team.call = real_call  # type: ignore[method-assign]
            for timer in timers:
                timer.join()
            for pid in pids:
                _resume(pid)


def _resume(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


async def _next_ping_answer(team: Any, agent: str) -> None:
    """Wait until the controller's heartbeat gets the next answer from ``agent``."""
    heartbeat = team._nodes[agent].heartbeat
    real_request = heartbeat.request
    answered = trio.Event()

    async def request(op: str, **args: Any) -> dict[str, Any]:
        reply = await real_request(op, **args)
        answered.set()
        return reply

    heartbeat.request = request
    try:
        with trio.fail_after(10 * HEARTBEAT_S):
            await answered.wait()
    finally:
        heartbeat.request = real_request


class _FreezeAfterPingRunner:
    def __init__(self, inner: EpisodeRunner, freeze_s: float) -> None:
        self.inner = inner
        self.freeze_s = freeze_s
        self.frozen: list[str] = []

    @asynccontextmanager
    async def open_group(self, key: GroupKey, cells: Sequence[Cell]
                         ) -> AsyncIterator[_FreezeAfterPing]:
        async with self.inner.open_group(key, cells) as group:
            yield _FreezeAfterPing(group, self.freeze_s, self.frozen)


@pytest.mark.slow
@pytest.mark.parametrize("factor", [1.05, 1.3])
async def test_a_freeze_just_longer_than_the_heartbeat_timeout_aborts(
        tmp_path: Path, factor: float) -> None:
    """A key owner frozen for 1.05x (and 1.3x) the heartbeat timeout while an action
    waits on it: the episode aborts as node_unresponsive naming it; its time is never
    stall. (The data-plane RPC timeout, 2 s, outlasts the freeze: without liveness the
    action would simply finish after the freeze, its stall ~1 s longer.)"""
    camp = campaign(tmp_path, seed=1)  # its first action asks another node (unit 4)
    assert heartbeat_timeout_s(camp.options.rpc_timeout_s) == HEARTBEAT_S
    assert factor * HEARTBEAT_S < camp.options.rpc_timeout_s
    runner = _FreezeAfterPingRunner(EpisodeRunner(camp, workdir_root=tmp_path),
                                    factor * HEARTBEAT_S)
    summary = await run_campaign(camp, tmp_path / "out", resume=False, runner=runner,
                                 console=quiet())
    assert runner.frozen, "no action asked another node (schedule too short?)"
    episodes = pd.read_parquet(tmp_path / "out" / "episodes.parquet")
    row = episodes.iloc[0]
    assert summary.aborted == 1, "the freeze was measured as stall: " \
        f"{row['stall_ms_per_action']} ms per action"
    assert row["abort_reason"].startswith(f"node_unresponsive: {runner.frozen[0]} "), \
        row["abort_reason"]
    assert pd.isna(row["stall_ms_per_action"])


# --- the ping schedule alone, on trio's virtual clock -----------------------------------------
def _watch_a_freeze(start_s: float, freeze_s: float, timeout_s: float) -> float | None:
    """Watch a node that is frozen from ``start_s`` for ``freeze_s`` (it answers a ping
    at once, except one that reaches it frozen: at the end of the freeze); the virtual
    time at which the freeze was found, None if not within ``start_s + 5 timeouts``."""
    found: list[float] = []

    async def ping() -> float:
        now = trio.current_time()
        if start_s <= now < start_s + freeze_s:
            await trio.sleep_until(start_s + freeze_s)
        return trio.current_time()  # the node's stamp: when it handled the ping

    async def main() -> None:
        with trio.move_on_after(start_s + 5 * timeout_s):
            if await watch_pings(ping, timeout_s=timeout_s,
                                 clock=trio.current_time) is not None:
                found.append(trio.current_time())

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return found[0] if found else None


@pytest.mark.parametrize("factor", [1.01, 1.05, 1.1, 1.3, 3.0])
def test_every_freeze_longer_than_the_timeout_is_found_while_it_lasts(factor: float) -> None:
    timeout_s = 6.0
    schedule = PingSchedule.for_timeout(timeout_s)
    for i in range(40):  # phases of the freeze against the pings
        start_s = 10.0 + i * schedule.interval_s / 40
        found = _watch_a_freeze(start_s, factor * timeout_s, timeout_s)
        assert found is not None, (factor, start_s)
        assert found < start_s + factor * timeout_s  # during the freeze, not after it


def test_a_pause_shorter_than_the_answer_bound_is_not_a_freeze() -> None:
    timeout_s = 6.0
    schedule = PingSchedule.for_timeout(timeout_s)
    for i in range(20):
        start_s = 10.0 + i * schedule.interval_s / 10
        assert _watch_a_freeze(start_s, 0.99 * schedule.answer_within_s, timeout_s) is None


@pytest.mark.parametrize("starved_before_reading", [True, False])
def test_a_controller_that_was_starved_does_not_judge_a_live_node_frozen(
        starved_before_reading: bool) -> None:
    """The node handles every ping at once; once, the controller process gets no CPU for
    3 timeouts right after the node answered (virtual time jumps), the answer still in
    its socket, either before it could read it or across its own deadline: the node's
    stamp shows that it answered in time."""
    timeout_s = 1.0
    pings: list[float] = []

    async def ping() -> float:
        handled = trio.current_time()
        pings.append(handled)
        if len(pings) == 5:
            clock = trio.lowlevel.current_clock()
            assert isinstance(clock, trio.testing.MockClock)
            clock.jump(3 * timeout_s)  # nothing of this process runs meanwhile
            if not starved_before_reading:
                await trio.sleep(0.01)  # the answer is read after the deadline fired
        return handled

    async def main() -> None:
        with trio.move_on_after(10 * timeout_s):
            overdue = await watch_pings(ping, timeout_s=timeout_s, clock=trio.current_time)
            raise AssertionError(f"judged frozen: {overdue}")

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(pings) > 20  # it went on pinging after the late answer
