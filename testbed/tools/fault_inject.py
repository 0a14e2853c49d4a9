"""Fault injection for ``testbed faults``: a runner that wraps the real episode runner,
injects one fault per episode at a seeded event, and checks the verdict with an oracle.

The oracle: the controller runs an episode's events one at a time, so the owner's head
of every key at an action is exactly the last ``seed``/``update`` reply for that key
before it. A released action is invalid if an input differs from that head. A row
whose ``invalid`` (the verdict from the owners' head logs) disagrees with the oracle is
*wrongly judged*; a fault that slipped altered or replayed data into a store or a head
log would show up here.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from testbed.campaign.model import Cell, GroupKey
from testbed.campaign.workload import Schedule
from testbed.host.processes import is_running, process_start_ticks
from testbed.run.contract import DelegatingGroup, EpisodeResult
from testbed.run.episode import EpisodeRunner, TeamGroup

#: What an injector gets: the live group, the agent to hit, the trial's RNG, and a
#: nursery for what must happen later (it lives as long as the group).
Injector = Callable[[TeamGroup, str, random.Random, trio.Nursery], Awaitable[None]]
STOP_S = 3.0  # SIGSTOP this long: well above the 1 s heartbeat timeout of rpc_timeout_s = 2


@dataclass
class Tally:
    """What a fault kind's trials observed (beyond the result tables)."""

    injected: int = 0
    wrongly_judged: int = 0
    pids: list[tuple[int, int | None]] = field(default_factory=list)  # node (pid, ticks)
    channel_rejections: int = 0
    topology_prefixes: set[str] = field(default_factory=set)

    def live_processes(self) -> int:
        return sum(1 for pid, ticks in self.pids if is_running(pid, ticks))


async def kill_node(group: TeamGroup, agent: str, rng: random.Random,
                    nursery: trio.Nursery) -> None:
    pid = group.team.pid(agent)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)


async def stop_node(group: TeamGroup, agent: str, rng: random.Random,
                    nursery: trio.Nursery) -> None:
    pid = group.team.pid(agent)
    if pid is None:
        return
    os.kill(pid, signal.SIGSTOP)

    async def resume_later() -> None:
        await trio.sleep(STOP_S)
        with contextlib.suppress(ProcessLookupError):  # the team already killed it
            os.kill(pid, signal.SIGCONT)

    nursery.start_soon(resume_later)


def link_fault(kind: str, *, seconds: tuple[float, float], rate: float) -> Injector:
    async def inject(group: TeamGroup, agent: str, rng: random.Random,
                     nursery: trio.Nursery) -> None:
        links = group.topo.links
        if links is None:
            raise RuntimeError(f"fault {kind}: this network has no link backend")
        await links.fault(agent, kind, seconds=rng.uniform(*seconds), rate=rate)

    return inject


def fill_disk(root: Path) -> Injector:
    """Fill the (small, private) file system holding the stores until it is full."""
    async def inject(group: TeamGroup, agent: str, rng: random.Random,
                     nursery: trio.Nursery) -> None:
        def fill() -> None:
            chunk = b"\0" * (1 << 20)
            with open(root / "filler", "ab") as f, contextlib.suppress(OSError):
                while True:
                    f.write(chunk)
                    f.flush()

        await trio.to_thread.run_sync(fill)

    return inject


class FaultRunner:
    """The real :class:`EpisodeRunner`, with one fault per episode at a seeded event."""

    def __init__(self, inner: EpisodeRunner, inject: Injector, *, seed: int,
                 after_episode: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self.inject = inject
        self.seed = seed
        self.after_episode = after_episode
        self.tally = Tally()
        self.episodes = 0

    @asynccontextmanager
    async def open_group(self, key: GroupKey, cells: Sequence[Cell]
                         ) -> AsyncIterator[_FaultyGroup]:
        async with self.inner.open_group(key, cells) as group, trio.open_nursery() as nursery:
            for agent in group.team.members:
                pid = group.team.pid(agent)
                if pid is not None:
                    self.tally.pids.append((pid, process_start_ticks(pid)))
            self.tally.topology_prefixes.add(group.topo.prefix)
            yield _FaultyGroup(self, group, nursery)
            nursery.cancel_scope.cancel()


class _FaultyGroup(DelegatingGroup[TeamGroup]):
    def __init__(self, runner: FaultRunner, group: TeamGroup, nursery: trio.Nursery) -> None:
        super().__init__(group)
        self.runner = runner
        self.nursery = nursery

    async def run_episode(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        runner, team = self.runner, self.group.team
        rng = random.Random(runner.seed * 1_000_003 + runner.episodes)
        runner.episodes += 1
        n_events = len(schedule.seeds) + len(schedule.events)
        at = rng.randrange(len(schedule.seeds), n_events)  # a point inside the episode
        victim = rng.choice(team.agents)
        real_call = team.call
        heads: dict[str, bytes] = {}
        oracle: dict[str, bool] = {}
        seen = 0

        async def call(agent: str, op: str, **args: Any) -> dict[str, Any]:
            nonlocal seen
            if op in ("seed", "update", "plan", "act"):
                if seen == at:
                    runner.tally.injected += 1
                    await runner.inject(self.group, victim, rng, self.nursery)
                seen += 1
            reply = await real_call(agent, op, **args)
            if op in ("seed", "update"):
                heads[str(args["key"])] = bytes(reply["head"]["id"])
            elif op == "act":
                inputs = {str(k): bytes(v) for k, v in dict(reply.get("inputs") or {}).items()}
                oracle[str(args["action"])] = reply["outcome"] == "released" and any(
                    inputs.get(k) != heads.get(k) for k in args["keys"])
            return reply

        team.call = call  # type: ignore[method-assign]
        try:
            result = await self.group.run_episode(cell, schedule)
        finally:
            team.call = real_call  # type: ignore[method-assign]
            if runner.after_episode is not None:
                runner.after_episode()
        for row in result.actions:  # (an aborted episode raised above: no rows to judge)
            if bool(row["invalid"]) != oracle.get(str(row["action"]), False):
                runner.tally.wrongly_judged += 1
        counters = await team.counters()
        runner.tally.channel_rejections += sum(int(c.get("rejected", 0))
                                               for c in counters.values())
        return result
