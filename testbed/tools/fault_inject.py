"""Fault injection for ``testbed faults``: a runner that wraps the real episode runner,
injects one fault per episode at a seeded event, and checks the verdict with an oracle.

The oracle: the controller runs an episode's events one at a time, so the owner's head
of every key at an action is exactly the last ``seed``/``update`` reply for that key
before it. A released action is invalid if an input differs from that head.

An episode is *wrongly judged* when its recorded result says something false about it:

- it completed, and an action's ``invalid`` (the verdict from the owners' head logs)
  disagrees with the oracle (a fault slipped altered or replayed data into a store or a
  head log);
- it completed although its fault must abort it (``must_abort``: a node killed, or
  stopped or frozen beyond the heartbeat timeout): its stall and traffic would carry the
  fault's time as if the policy had spent it;
- it aborted blaming a node (``NodeDied``, ``node_unresponsive``) other than the one
  the fault hit;
- it completed without being flagged ``disturbed`` although its fault must flag it
  (``must_disturb``: the run's link emulator frozen mid-episode delays every packet in
  flight, time the policy did not spend).

So the count means the same for kinds that complete and kinds that abort: episodes
whose row a reader would misread.
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
from testbed.campaign.workload import Act, Schedule
from testbed.host.processes import is_running, process_start_ticks
from testbed.run.contract import DelegatingGroup, EpisodeAborted, EpisodeResult
from testbed.run.episode import EpisodeRunner, TeamGroup
from testbed.run.team import Team
from testbed.tools.fault_floods import FloodMeasure, measured

#: What an injector gets: the live group, the agent to hit, the trial's RNG, and a
#: nursery for what must happen later (it lives as long as the group).
Injector = Callable[[TeamGroup, str, random.Random, trio.Nursery], Awaitable[None]]
STOP_S = 3.0  # SIGSTOP this long: well above the 1 s heartbeat timeout of rpc_timeout_s = 2
FREEZE_FACTOR = 1.1  # node_freeze: just above the heartbeat timeout (issue 20)


@dataclass
class Tally:
    """What a fault kind's trials observed (beyond the result tables)."""

    injected: int = 0
    wrongly_judged: int = 0  # episodes (see the module docstring)
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


def stop_for(seconds: float) -> Injector:
    """SIGSTOP the node for ``seconds``, then SIGCONT it (unless the team killed it)."""
    async def stop(group: TeamGroup, agent: str, rng: random.Random,
                   nursery: trio.Nursery) -> None:
        pid = group.team.pid(agent)
        if pid is None:
            return
        os.kill(pid, signal.SIGSTOP)

        async def resume_later() -> None:
            await trio.sleep(seconds)
            with contextlib.suppress(ProcessLookupError):  # the team already killed it
                os.kill(pid, signal.SIGCONT)

        nursery.start_soon(resume_later)

    return stop


stop_node = stop_for(STOP_S)


def freeze_emulator(seconds: float) -> Injector:
    """SIGSTOP the group's link emulator (this run's own process) for ``seconds``."""
    async def freeze(group: TeamGroup, agent: str, rng: random.Random,
                     nursery: trio.Nursery) -> None:
        emulator = getattr(group.topo.links, "emulator", None)
        if emulator is None:
            raise RuntimeError("fault emulator_freeze: this network has no userspace "
                               "emulator")
        pid = int(emulator.process.pid)
        os.kill(pid, signal.SIGSTOP)

        async def resume_later() -> None:
            try:
                await trio.sleep(seconds)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

        nursery.start_soon(resume_later)

    return freeze


class FloodInjector:
    """Starts an attack on the victim beside the episode (testbed/tools/fault_floods.py)
    and keeps what it measured; :meth:`settle` waits for the attack to end."""

    def __init__(self, attack: Callable[[Team, str, FloodMeasure], Awaitable[None]]) -> None:
        self.attack = attack
        self.measures: list[FloodMeasure] = []
        self._running: list[trio.Event] = []

    async def __call__(self, group: TeamGroup, agent: str, rng: random.Random,
                       nursery: trio.Nursery) -> None:
        measure = FloodMeasure(agent)
        self.measures.append(measure)
        done = trio.Event()
        self._running.append(done)

        async def run() -> None:
            try:
                await measured(group.team, agent, measure,
                               self.attack(group.team, agent, measure))
            finally:
                done.set()

        nursery.start_soon(run)

    async def settle(self) -> None:
        for done in self._running:
            await done.wait()
        self._running.clear()


def link_fault(kind: str, *, seconds: tuple[float, float], rate: float) -> Injector:
    async def inject(group: TeamGroup, agent: str, rng: random.Random,
                     nursery: trio.Nursery) -> None:
        links = group.topo.links
        if links is None:
            raise RuntimeError(f"fault {kind}: this network has no link backend")
        await links.fault(agent, kind, seconds=rng.uniform(*seconds), rate=rate)

    return inject


async def overwrite_store(group: TeamGroup, agent: str, rng: random.Random,
                          nursery: trio.Nursery) -> None:
    """Overwrite the victim's store database and WAL in place with seeded random bytes
    (the node must notice on its read-back and end, never serve from memory)."""
    base = group.team.store_path(agent)

    def scribble() -> None:
        for path in (base, Path(f"{base}-wal")):
            with contextlib.suppress(FileNotFoundError), open(path, "r+b") as f:
                size = os.fstat(f.fileno()).st_size
                f.write(rng.randbytes(size))

    await trio.to_thread.run_sync(scribble)


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
                 after_episode: Callable[[], None] | None = None, must_abort: bool = False,
                 must_disturb: bool = False, at_key_owner: bool = False) -> None:
        self.inner = inner
        self.inject = inject
        self.seed = seed
        self.after_episode = after_episode
        #: The fault must abort its episode (a completed one is wrongly judged).
        self.must_abort = must_abort
        #: A completed episode with the fault must be flagged ``disturbed``.
        self.must_disturb = must_disturb
        #: Hit the owner of a key that the action at the fault point asks (so the action
        #: waits on it) instead of a random agent.
        self.at_key_owner = at_key_owner
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
        at, victim = _fault_point(schedule, rng, at_key_owner=runner.at_key_owner)
        real_call = team.call
        heads: dict[str, bytes] = {}
        oracle: dict[str, bool] = {}
        seen = 0
        injected = False

        async def call(agent: str, op: str, **args: Any) -> dict[str, Any]:
            nonlocal seen, injected
            if op in ("seed", "update", "plan", "act"):
                if seen == at:
                    runner.tally.injected += 1
                    injected = True
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
        except EpisodeAborted as exc:
            if injected and _blames_another_node(exc.reason, victim):
                runner.tally.wrongly_judged += 1
            raise
        finally:
            team.call = real_call  # type: ignore[method-assign]
            if runner.after_episode is not None:
                runner.after_episode()
            settle = getattr(runner.inject, "settle", None)
            if settle is not None:
                await settle()
        misjudged = any(bool(row["invalid"]) != oracle.get(str(row["action"]), False)
                        for row in result.actions)
        unflagged = injected and runner.must_disturb and not result.episode.get("disturbed")
        if misjudged or unflagged or (injected and runner.must_abort):
            runner.tally.wrongly_judged += 1
        counters = await team.counters()
        runner.tally.channel_rejections += sum(int(c.get("rejected", 0))
                                               for c in counters.values())
        return result


def _fault_point(schedule: Schedule, rng: random.Random, *, at_key_owner: bool
                 ) -> tuple[int, str]:
    """The index (among seed, update, plan and act calls) before which the fault hits,
    and the agent it hits: a seeded point inside the episode and a seeded agent, or
    with ``at_key_owner`` a seeded action that asks another node and that node."""
    first = len(schedule.seeds)
    if at_key_owner:
        points = [(first + i, owner) for i, event in enumerate(schedule.events)
                  if isinstance(event, Act)
                  for owner in sorted({schedule.owners[k] for k in event.keys})
                  if owner != event.executor]
        if points:
            return rng.choice(points)
    return rng.randrange(first, first + len(schedule.events)), rng.choice(schedule.agents)


def _blames_another_node(reason: str, victim: str) -> bool:
    """An abort reason that names a failed node, and not ``victim``."""
    for head in ("NodeDied: node ", "node_unresponsive: "):
        if reason.startswith(head):
            return not reason[len(head):].startswith(f"{victim} ")
    return False
