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
   the action was issued (both on CLOCK_MONOTONIC, which is system wide). The episode's
   history (``testbed/run/history.py``) is derived from the same logs and the stores'
   install logs after the last event; the history checker's columns
   (``HISTORY_EPISODE_FIELDS``) come from it, and the loop writes it to ``history/``.
5. A node failure or a timeout aborts the episode (EpisodeAborted); nothing is imputed.
6. Liveness: while an episode runs, every node's control plane is pinged on a second
   connection; a node that does not answer within ``heartbeat_timeout_s`` (derived
   from the campaign's ``rpc_timeout_s``) aborts the episode with reason
   ``node_unresponsive``, so the time a frozen node costs is never measured as stall.
   An RPC timeout inside an episode that finishes is recorded per action and per
   episode (``rpc_timeouts``), so a report can tell network loss from policy cost.
7. The links' own record of an episode: after the trace restart the backend's statistics
   window starts; at the end its queueing delay, utilisation and release lateness land
   in the episode row (``LINK_EPISODE_FIELDS``; null where the backend has none), and
   with ``[options] link_log`` every host's two directions are logged packet by packet
   (Mahimahi format) under ``<run>/links/<episode>/``.
8. Disturbance: after the last event every node reports its own scheduling delay over
   the episode and the controller adds the host's busy and steal shares; the episode row
   gets the ``disturbed`` verdict with its reason (``testbed/run/disturbance.py``).
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from nodes.store_check import describe_location
from protocols.errors import ProtocolError
from protocols.policies import describe_policy
from testbed.campaign.live import LIVE_KIND
from testbed.campaign.model import Campaign, Cell, GroupKey, episode_key
from testbed.campaign.workload import Act, Plan, Schedule, Update
from testbed.errors import LinkFailure, RunFailure
from testbed.host.ledger import Ledger
from testbed.net.topology import Topology, open_topology
from testbed.results.history import check_episode, history_columns, history_texts
from testbed.run.accounting import (
    PhaseTally,
    StallTally,
    action_costs,
    episode_costs,
    total_sent,
)
from testbed.run.contract import EpisodeAborted, EpisodeResult
from testbed.run.disturbance import HostSample, episode_disturbance
from testbed.run.history import node_history
from testbed.run.live import run_live_task
from testbed.run.model_access import ModelAccess, needs_central_host, open_model_access
from testbed.run.node_spawner import one_zygote_for_all
from testbed.run.prepare import start_episode
from testbed.run.team import (
    NodeDied,
    NodeUnresponsive,
    Team,
    heartbeat_timeout_s,
    open_team,
)
from testbed.run.trials import run_trial
from testbed.run.verdict import HeadLog, action_row, build_head_log


class TeamGroup:
    """A live topology with its node processes, shared by the cells of one group."""

    def __init__(self, topo: Topology, team: Team, campaign: Campaign, *,
                 link_log_dir: Path | None = None) -> None:
        self.topo = topo
        self.team = team
        self.campaign = campaign
        self.link_log_dir = link_log_dir
        #: (setup seconds, whole episode seconds) per episode, for `testbed bench episode`.
        self.setup_times: list[tuple[float, float]] = []
        #: A live campaign's relay to the model server (``testbed.run.model_access``).
        self.model_access: ModelAccess | None = None

    @property
    def backend(self) -> str:
        return self.topo.backend

    @property
    def description(self) -> Mapping[str, Any]:
        return self.topo.describe()

    async def run_episode(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        """Run one episode while watching every node's control plane (rule 6)."""
        timeout_s = self.campaign.options.episode_timeout_s
        heartbeat_s = heartbeat_timeout_s(self.campaign.options.rpc_timeout_s)
        result: list[EpisodeResult] = []
        failed: list[BaseException] = []
        aborted: list[EpisodeAborted] = []  # the runner's own (e.g. a live model endpoint)
        unresponsive: list[NodeUnresponsive] = []
        host_before = HostSample.read()
        with trio.move_on_after(timeout_s) as deadline:
            async with trio.open_nursery() as nursery:
                async def body() -> None:
                    try:
                        result.append(await self._run(cell, schedule))
                    except (RunFailure, ProtocolError) as exc:  # a node died or refused
                        if isinstance(exc, LinkFailure):
                            raise  # the emulator failed, not a node: testbed.run.failures
                        failed.append(exc)
                    except EpisodeAborted as exc:  # not through the nursery's group
                        aborted.append(exc)
                    finally:
                        nursery.cancel_scope.cancel()

                async def watch() -> None:
                    try:
                        await self.team.watch_liveness(timeout_s=heartbeat_s)
                    except NodeUnresponsive as exc:
                        unresponsive.append(exc)
                        nursery.cancel_scope.cancel()

                nursery.start_soon(body)
                nursery.start_soon(watch)
        if aborted:
            raise aborted[0]
        if failed and not unresponsive:  # was it a frozen node behind that failure?
            frozen = await self.team.unresponsive(timeout_s=heartbeat_s)
            if frozen is not None:
                unresponsive.append(frozen)
        if failed and not unresponsive:  # or a dead emulator under the nodes' RPCs?
            link_failure = await self._link_failure(timeout_s=heartbeat_s)
            if link_failure is not None:
                raise link_failure  # the emulator's fault, not a node's: a unit failure
        if unresponsive:
            raise EpisodeAborted(str(unresponsive[0]))
        if failed:
            exc = failed[0]
            dead = self.team.dead_members()
            if dead and not isinstance(exc, NodeDied):  # a peer's failure was the symptom
                raise EpisodeAborted(f"NodeDied: node {dead[0]} exited; first failure: "
                                     f"{type(exc).__name__}: {exc}")
            raise EpisodeAborted(f"{type(exc).__name__}: {exc}")
        if deadline.cancelled_caught or not result:
            raise EpisodeAborted(f"episode timeout after {timeout_s:g} s")
        try:  # rule 8: the nodes' scheduling delay and the host's load
            result[0].episode.update(await episode_disturbance(
                self.team, host_before, result[0].episode, len(result[0].actions),
                shaped=self.backend != "none"))
        except (RunFailure, ProtocolError) as exc:
            raise EpisodeAborted(f"{type(exc).__name__}: {exc}") from None
        return result[0]

    async def _link_failure(self, *, timeout_s: float) -> LinkFailure | None:
        """The link backend's own failure, if asking it for its statistics shows one.

        A node's RPC that timed out is a symptom when the emulator carrying its packets
        has died: the nodes' RPC timeout can expire before the controller next talks to
        the emulator. A backend that does not answer within ``timeout_s`` is left to the
        next episode's start, which fails on it as a unit failure too."""
        with trio.move_on_after(timeout_s):
            try:
                await self.topo.link_statistics()
            except LinkFailure as exc:
                return exc
        return None

    async def _run(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        if self.campaign.kind == LIVE_KIND:  # live workflows (testbed/run/live.py)
            return await run_live_task(self, cell, schedule)
        if self.campaign.kind != "episodes":  # single-action trials (testbed/run/trials.py)
            return await run_trial(self, cell, schedule)
        team, topo = self.team, self.topo
        started = time.monotonic()
        phases = await start_episode(team, topo, cell, schedule)
        await topo.clear_link_statistics()
        log_dir = None
        if self.link_log_dir is not None and topo.links is not None:
            key = episode_key(cell, schedule.template)
            log_dir = self.link_log_dir / key.replace("/", "~")
            await topo.start_link_log(str(log_dir), f"episode {key}")
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
                    tally.commit_rounds += int(reply.get("rounds", 0))
                    tally.commit_handshake_rounds += int(reply.get("handshake_rounds", 0))
                    phases.commit += int(reply.get("bytes", 0))
                elif isinstance(event, Plan):
                    reply = await team.call(event.planner, "plan", action=event.action,
                                            executor=event.executor, keys=list(event.keys),
                                            depth=event.depth, decision=event.decision)
                    plans[event.action] = bytes(reply["root"])
                    phases.planning += int(reply.get("bytes", 0))
                else:
                    critical = {"critical": event.critical} if event.critical else {}
                    reply = await team.call(event.executor, "act", action=event.action,
                                            roots=[plans[event.action]],
                                            keys=list(event.keys), **critical)
                    tally.action_ms += float(reply["stall_ms"])
                    acts.append((event, reply))
            if barrier:
                await self._barrier(unit, tally)

        logs, installs, rpcs = {}, {}, {}
        for agent in team.agents:
            logs[agent] = (await team.call(agent, "head_log"))["log"]
            installs[agent] = (await team.call(agent, "install_log"))["log"]
            rpcs[agent] = await team.call(agent, "rpc_log")
        timeline = build_head_log(logs)
        history = history_texts(node_history(owners=schedule.owners, head_logs=logs,
                                             install_logs=installs, acts=acts,
                                             rpc_logs=rpcs))
        counters = await team.counters()
        for agent, reply in zip(team.members, await team.each_call("verify_store"),
                                strict=True):
            if reply.get("reason"):  # its store was overwritten under it: not a result
                raise RunFailure(f"store_failed: {agent}: {reply['reason']}")
        links_after = await topo.link_counters()
        link_stats = await topo.link_statistics()
        if log_dir is not None:
            await topo.stop_link_log()
        wall_s = time.monotonic() - started
        self.setup_times.append((setup_s, wall_s))
        result = self._result(schedule, acts, timeline, counters, links_before, links_after,
                              tally, wall_s, phases, history)
        result.episode["replay_s"] = wall_s - setup_s
        result.episode.update(link_columns(links_before, links_after, link_stats))
        if log_dir is not None:
            result.episode["link_log"] = f"links/{log_dir.name}"
        return result

    async def _barrier(self, unit: int, tally: StallTally) -> None:
        """Run the unit-end hook at every member at once; elapsed = the slowest member,
        and its rounds are the most any member waited for."""
        slowest, rounds, handshakes = 0.0, 0, 0

        async def one(agent: str) -> None:
            nonlocal slowest, rounds, handshakes
            reply = await self.team.call(agent, "unit_end", unit=unit)
            slowest = max(slowest, float(reply["stall_ms"]))
            rounds = max(rounds, int(reply.get("rounds", 0)))
            handshakes = max(handshakes, int(reply.get("handshake_rounds", 0)))

        async with trio.open_nursery() as nursery:
            for agent in self.team.members:
                nursery.start_soon(one, agent)
        tally.barrier_ms += slowest
        tally.barrier_rounds += rounds
        tally.barrier_handshake_rounds += handshakes

    def _result(self, schedule: Schedule, acts: list[tuple[Act, dict[str, Any]]],
                timeline: HeadLog, counters: Mapping[str, Mapping[str, int]],
                links_before: Mapping[str, Mapping[str, int]],
                links_after: Mapping[str, Mapping[str, int]], tally: StallTally,
                wall_s: float, phases: PhaseTally,
                history: dict[str, str]) -> EpisodeResult:
        rows: list[dict[str, Any]] = []
        for act, reply in acts:
            rows.append({**action_row(act.action, act.keys, reply, timeline),
                         **action_costs(reply),
                         "rpc_timeouts": int(reply.get("rpc_timeouts") or 0)})
        attempted = max(len(acts), 1)
        sent = total_sent(counters)
        opened = total_sent(counters, "connections_opened")
        link_bytes = sum(
            int(links_after[h].get("up_bytes", 0)) - int(links_before.get(h, {}).get("up_bytes", 0))
            for h in links_after)
        stall_total = tally.action_ms + tally.barrier_ms + tally.commit_ms
        episode = {
            "stall_ms_per_action": stall_total / attempted,
            "stall_action_ms": tally.action_ms,
            "stall_barrier_ms": tally.barrier_ms,
            "stall_commit_ms": tally.commit_ms,
            "barrier_rounds": tally.barrier_rounds,
            "barrier_handshake_rounds": tally.barrier_handshake_rounds,
            "commit_rounds": tally.commit_rounds,
            "commit_handshake_rounds": tally.commit_handshake_rounds,
            "kib_per_action": sent / 1024 / attempted,
            "connections": opened,
            "link_bytes": link_bytes,
            "wall_s": wall_s,
            "congestion_control": str(self.topo.describe().get("congestion_control", "")),
            **episode_costs(counters, phases, rows, attempted),
            "rpc_timeouts": sum(int(c.get("rpc_timeouts", 0)) for c in counters.values()),
            # messages refused as an owner's equivocation (protocols/heads.py)
            "equivocations": sum(int(c.get("equivocations", 0)) for c in counters.values()),
            **history_columns(check_episode(history)),
        }
        return EpisodeResult(actions=rows, episode=episode, history=history)


def link_columns(before: Mapping[str, Mapping[str, int]], after: Mapping[str, Mapping[str, int]],
                 stats: Mapping[str, float]) -> dict[str, Any]:
    """The episode's link columns (rule 7) from counters and the backend's statistics."""
    def stat(key: str) -> float | None:
        value = stats.get(key)
        return None if value is None or math.isnan(value) else float(value)

    out: dict[str, Any] = {}
    for side in ("up", "down"):
        out[f"link_{side}_qdelay_p50_ms"] = stat(f"{side}_qdelay_p50_ms")
        out[f"link_{side}_qdelay_p95_ms"] = stat(f"{side}_qdelay_p95_ms")
        out[f"link_{side}_utilisation"] = stat(f"{side}_utilisation")
        out[f"link_{side}_drops"] = sum(
            int(after[h].get(f"{side}_drops", 0)) - int(before.get(h, {}).get(f"{side}_drops", 0))
            for h in after)
    out["emulator_late_p99_ms"] = stat("late_p99_ms")
    out["emulator_late_max_ms"] = stat("late_max_ms")
    return out


class EpisodeRunner:
    """Builds a topology and a team per group of cells (the campaign's Runner).

    ``link_log_dir``: where episodes write their packet logs when the campaign asks for
    them (``[options] link_log``; the run directory's ``links/``).
    """

    def __init__(self, campaign: Campaign, *, workdir_root: Path | None = None,
                 backend: str | None = None, ledger: Ledger | None = None,
                 link_log_dir: Path | None = None, shared_emulator: bool = False,
                 startup_timeout_s: float | None = None) -> None:
        self.campaign = campaign
        self.workdir_root = workdir_root
        #: The run's ledger: every temporary directory is recorded in it before it is
        #: made (without one, e.g. in tests, plain mkdtemp directories).
        self.ledger = ledger
        self.backend = backend or campaign.options.backend
        self.link_log_dir = link_log_dir if campaign.options.link_log else None
        #: Lanes share one emulator process (testbed.links.shared_emulator).
        self.shared_emulator = shared_emulator
        #: Node startup limit (None: measured on this host, testbed.run.startup).
        self.startup_timeout_s = startup_timeout_s
        self.groups: list[TeamGroup] = []

    def describe_stores(self) -> dict[str, Any]:
        """Where this runner's nodes keep their stores (the directory its workdirs are
        made in), its file system type (tmpfs: an fsync costs nothing) and the
        campaign's durability setting, for the manifest."""
        root = Path(self.workdir_root or tempfile.gettempdir())
        return {**describe_location(root), "durability": self.campaign.options.durability}

    @asynccontextmanager
    async def one_zygote(self) -> AsyncIterator[None]:
        """Teams opened inside (by this task and the lanes it starts) fork their nodes
        from one zygote (testbed/run/node_spawner.py, rule 5)."""
        logs = self._new_workdir("planfence")  # a workdir of its own: the log
        try:
            async with one_zygote_for_all(logs / "zygote.log", ledger=self.ledger):
                yield
        finally:
            self._remove_workdir(logs)

    def _new_workdir(self, kind: str) -> Path:
        """A temporary directory of KIND (one of the ledger's ``TMPDIR_KINDS``)."""
        if self.ledger is not None:  # recorded before it is made
            return self.ledger.new_tmpdir(kind, self.workdir_root)
        return Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=self.workdir_root))

    def _remove_workdir(self, path: Path) -> None:
        if self.ledger is not None:
            self.ledger.remove_tmpdir(path)
        else:
            shutil.rmtree(path, ignore_errors=True)

    @asynccontextmanager
    async def open_group(self, key: GroupKey, cells: Sequence[Cell]) -> AsyncIterator[TeamGroup]:
        options = self.campaign.options
        profile = self.campaign.network_profile(key.network)
        first = cells[0]
        # The workload names the agents and owns the keys; the team follows it.
        first_schedule = self.campaign.schedule(first, self.campaign.templates[0])
        agents = list(first_schedule.agents)
        ledger = self.ledger
        workdir = self._new_workdir("planfence")
        try:
            central = key.central or needs_central_host(self.campaign)
            async with open_topology(profile, agents, central=central,
                                     trace_offset_s=key.trace_offset_s,
                                     backend=self.backend, seed=self.campaign.seed,
                                     packet_log=self.link_log_dir is not None,
                                     shared_emulator=self.shared_emulator) as topo:
                hosts = {name: (host.netns, host.address) for name, host in topo.hosts.items()}
                async with open_team(agents=agents, central=key.central, hosts=hosts,
                                     workdir=workdir, campaign_seed=self.campaign.seed,
                                     connection=first.connection, policy=first.policy,
                                     durability=options.durability,
                                     rpc_timeout_s=options.rpc_timeout_s,
                                     owners=first_schedule.owners, ledger=ledger,
                                     congestion_control=topo.socket_congestion_control,
                                     startup_timeout_s=self.startup_timeout_s,
                                     plugins=self.campaign.plugins,
                                     wire_encoding=options.wire_encoding,
                                     ) as team:
                    group = TeamGroup(topo, team, self.campaign,
                                      link_log_dir=self.link_log_dir)
                    async with open_model_access(self.campaign, topo, team,
                                                 ledger=ledger) as access:
                        group.model_access = access
                        self.groups.append(group)
                        yield group
        finally:
            self._remove_workdir(workdir)
