"""The episode runner: one schedule replayed against real node processes.

Rules this module obeys:

1. A group (cells sharing network, trace offset, team size and central service) gets
   one topology and one set of node processes; every episode starts from fresh
   stores, zeroed counters and new policy objects (``reset``), and restarts the trace
   clock at the offset, so paired episodes of different policies see the same link.
2. Events run in unit order, one at a time, from the controller over the control
   plane (never counted, never stall). Owner updates report their timed policy hook
   (central commits, quorum writes) as commit stall; a policy with a unit-end hook
   (synchronisation barriers) runs it at every member concurrently after each unit and
   the barrier counts by elapsed time, i.e. the slowest member's time.
3. Stall per episode = action-path stall + barrier stall + commit stall, divided by the
   attempted protected actions (appendix C.1). Traffic = frame bytes sent by every
   node (each frame counted once, at its sender), which is both directions of every
   exchange; link counters are recorded beside it.
4. Invalid is judged from the owners' head logs: a released action is invalid if the
   recorded input of some declared key differs from the owner's head at the instant
   the action was issued (both on CLOCK_MONOTONIC, which is system wide).
5. A node failure or a timeout aborts the episode (EpisodeAborted); nothing is imputed.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from protocols.errors import ProtocolError
from protocols.policies import describe_policy
from testbed.errors import RunFailure
from testbed.links.profiles import get_profile
from testbed.net.topology import Topology, open_topology
from testbed.run.contract import EpisodeAborted, EpisodeResult
from testbed.run.team import Team, open_team
from testbed.run.verdict import HeadLog, build_head_log, judge_invalid
from testbed.spec.campaign import Campaign, Cell, GroupKey
from testbed.spec.workload import Act, Plan, Schedule, Seed, Update


@dataclass
class StallTally:
    """Stall of one episode by where it was spent (ms)."""

    action_ms: float = 0.0
    barrier_ms: float = 0.0
    commit_ms: float = 0.0


class TeamGroup:
    """A live topology with its node processes, shared by the cells of one group."""

    def __init__(self, topo: Topology, team: Team, campaign: Campaign) -> None:
        self.topo = topo
        self.team = team
        self.campaign = campaign
        #: (setup seconds, whole episode seconds) per episode, for `testbed bench episode`.
        self.setup_times: list[tuple[float, float]] = []

    @property
    def backend(self) -> str:
        return self.topo.backend

    @property
    def description(self) -> Mapping[str, Any]:
        return self.topo.describe()

    async def run_episode(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        timeout_s = self.campaign.options.episode_timeout_s
        try:
            with trio.fail_after(timeout_s):
                return await self._run(cell, schedule)
        except trio.TooSlowError:
            raise EpisodeAborted(f"episode timeout after {timeout_s:g} s") from None
        except (RunFailure, ProtocolError) as exc:  # a node died or refused an operation
            raise EpisodeAborted(f"{type(exc).__name__}: {exc}") from None

    async def _run(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        team, topo = self.team, self.topo
        started = time.monotonic()
        await team.reset_all(policy=cell.policy, connection=cell.connection,
                             owners=schedule.owners)
        async def seed_key(seed: Seed) -> None:
            await team.call(seed.owner, "seed", key=seed.key, content=seed.content,
                            rtype=seed.rtype)

        async with trio.open_nursery() as nursery:
            for seed in schedule.seeds:
                nursery.start_soon(seed_key, seed)
        await topo.restart_trace()
        links_before = await topo.link_counters()
        barrier = describe_policy(cell.policy).has_unit_end_hook
        setup_s = time.monotonic() - started

        by_unit: dict[int, list[Update | Plan | Act]] = defaultdict(list)
        for event in schedule.events:
            by_unit[event.unit].append(event)
        tally = StallTally()
        plans: dict[str, bytes] = {}
        acts: list[tuple[Act, dict[str, Any]]] = []
        for unit in range(schedule.units):
            for event in by_unit.get(unit, []):
                if isinstance(event, Update):
                    reply = await team.call(event.owner, "update", key=event.key,
                                            content=event.content)
                    tally.commit_ms += float(reply["stall_ms"])
                elif isinstance(event, Plan):
                    reply = await team.call(event.planner, "plan", action=event.action,
                                            executor=event.executor, keys=list(event.keys),
                                            depth=event.depth, decision=event.decision)
                    plans[event.action] = bytes(reply["root"])
                else:
                    reply = await team.call(event.executor, "act", action=event.action,
                                            roots=[plans[event.action]],
                                            keys=list(event.keys))
                    tally.action_ms += float(reply["stall_ms"])
                    acts.append((event, reply))
            if barrier:
                tally.barrier_ms += await self._barrier(unit)

        logs = {}
        for agent in team.agents:
            logs[agent] = (await team.call(agent, "head_log"))["log"]
        timeline = build_head_log(logs)
        counters = await team.counters()
        links_after = await topo.link_counters()
        wall_s = time.monotonic() - started
        self.setup_times.append((setup_s, wall_s))
        return self._result(schedule, acts, timeline, counters, links_before, links_after,
                            tally, wall_s)

    async def _barrier(self, unit: int) -> float:
        """Run the unit-end hook at every member at once; elapsed = the slowest member."""
        slowest = 0.0

        async def one(agent: str) -> None:
            nonlocal slowest
            reply = await self.team.call(agent, "unit_end", unit=unit)
            slowest = max(slowest, float(reply["stall_ms"]))

        async with trio.open_nursery() as nursery:
            for agent in self.team.members:
                nursery.start_soon(one, agent)
        return slowest

    def _result(self, schedule: Schedule, acts: list[tuple[Act, dict[str, Any]]],
                timeline: HeadLog, counters: Mapping[str, Mapping[str, int]],
                links_before: Mapping[str, Mapping[str, int]],
                links_after: Mapping[str, Mapping[str, int]], tally: StallTally,
                wall_s: float) -> EpisodeResult:
        rows: list[dict[str, Any]] = []
        for act, reply in acts:
            released = reply["outcome"] == "released"
            inputs = {str(k): bytes(v) for k, v in dict(reply.get("inputs") or {}).items()}
            invalid = released and judge_invalid(timeline, act.keys, inputs,
                                                 int(reply["issue_t_ns"]))
            rows.append({
                "action": act.action, "outcome": reply["outcome"], "invalid": invalid,
                "complete": released and not invalid, "replans": int(reply["replans"]),
                "stall_ms": float(reply["stall_ms"]), "bytes": int(reply["bytes"]),
                "connections": int(reply["connections"]),
                "block_reason": str(reply.get("block_reason") or ""),
            })
        attempted = max(len(acts), 1)
        sent = sum(int(c.get("bytes_sent", 0)) for c in counters.values())
        opened = sum(int(c.get("connections_opened", 0)) for c in counters.values())
        link_bytes = sum(
            int(links_after[h].get("up_bytes", 0)) - int(links_before.get(h, {}).get("up_bytes", 0))
            for h in links_after)
        stall_total = tally.action_ms + tally.barrier_ms + tally.commit_ms
        episode = {
            "stall_ms_per_action": stall_total / attempted,
            "stall_action_ms": tally.action_ms,
            "stall_barrier_ms": tally.barrier_ms,
            "stall_commit_ms": tally.commit_ms,
            "kib_per_action": sent / 1024 / attempted,
            "connections": opened,
            "link_bytes": link_bytes,
            "wall_s": wall_s,
            "congestion_control": str(self.topo.describe().get("congestion_control", "")),
        }
        return EpisodeResult(actions=rows, episode=episode)


class EpisodeRunner:
    """Builds a topology and a team per group of cells (the campaign's Runner)."""

    def __init__(self, campaign: Campaign, *, workdir_root: Path | None = None,
                 backend: str | None = None) -> None:
        self.campaign = campaign
        self.workdir_root = workdir_root
        self.backend = backend or campaign.options.backend
        self.groups: list[TeamGroup] = []

    @asynccontextmanager
    async def open_group(self, key: GroupKey, cells: Sequence[Cell]) -> AsyncIterator[TeamGroup]:
        options = self.campaign.options
        # The campaign's delay option sets the one-way delay of every shaped access link.
        delay_ms = None if key.network == "loopback" else options.delay_ms
        profile = get_profile(key.network, delay_ms=delay_ms)
        first = cells[0]
        # The workload names the agents and owns the keys; the team follows it.
        first_schedule = self.campaign.schedule(first, self.campaign.templates[0])
        agents = list(first_schedule.agents)
        workdir = Path(tempfile.mkdtemp(prefix="planfence-", dir=self.workdir_root))
        try:
            async with open_topology(profile, agents, central=key.central,
                                     trace_offset_s=key.trace_offset_s,
                                     backend=self.backend, seed=self.campaign.seed) as topo:
                hosts = {name: (host.netns, host.address) for name, host in topo.hosts.items()}
                async with open_team(agents=agents, central=key.central, hosts=hosts,
                                     workdir=workdir, campaign_seed=self.campaign.seed,
                                     connection=first.connection, policy=first.policy,
                                     durability=options.durability,
                                     rpc_timeout_s=options.rpc_timeout_s,
                                     owners=first_schedule.owners,
                                     congestion_control=topo.socket_congestion_control,
                                     ) as team:
                    group = TeamGroup(topo, team, self.campaign)
                    self.groups.append(group)
                    yield group
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
