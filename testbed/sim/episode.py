"""The campaign loop's Runner for ``--backend sim``: each episode in virtual time.

Rules (``testbed.run.episode``'s, in virtual time; what differs is said here):

1. Every episode gets a loop of its own starting at 0, a fresh network, fresh nodes and
   identities bound to the episode key, so an episode's result depends on the campaign,
   the cell, the template and the calibration only (byte-identical on any machine).
2. The campaign's options that shape what nodes do apply: ``wire_encoding`` (the frames'
   bytes), ``durability`` (which install time the calibration charges),
   ``rpc_timeout_s``. Setup as ``testbed.run.prepare``: ``reuse_warm`` opens the pools, every key is
   seeded at its owner at once (its traffic is ``setup``), then the traces restart.
3. Events run in unit order, one at a time (the controller's control plane costs no
   virtual time); a policy with a unit-end hook runs it at every member at once and the
   barrier costs its slowest member. Stall, traffic, rounds and invalidity are computed
   as ``testbed.run.episode`` computes them, from the same reply fields.
4. The episode row's link columns come from the simulated queues (bytes and drops per
   direction; queueing delay and emulator lateness are null: the model has none to
   report); ``wall_s`` is the episode's virtual duration and ``replay_s`` that less the
   setup; the disturbance columns are null (nothing else shares a virtual host).
5. Only what ``testbed.campaign.sim_support`` allows runs here (episode campaigns); the rest is
   refused with one line before anything runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, TypeVar

from protocols.errors import ProtocolError
from protocols.identity import CENTRAL_ID, Identity, Member, Roster
from protocols.policies import describe_policy
from protocols.records import set_wire_encoding, wire_encoding
from testbed.campaign.model import Campaign, Cell, GroupKey, episode_key
from testbed.campaign.sim_support import check_campaign
from testbed.campaign.workload import Act, Plan, Schedule, Update
from testbed.run.accounting import (
    PhaseTally,
    StallTally,
    action_costs,
    episode_costs,
    total_sent,
)
from testbed.run.contract import EpisodeAborted, EpisodeResult
from testbed.run.verdict import action_row, build_head_log
from testbed.sim.calibration import Calibration
from testbed.sim.kernel import Loop, SimDeadlock, gather
from testbed.sim.network import SimNetwork
from testbed.sim.node import SimNode
from testbed.sim.paper import MODEL as PAPER_MODEL
from testbed.sim.paper import PaperLinks, paper_client
from testbed.sim.tcp import TcpLayer

BACKEND = "sim"
#: The models an episode can run under: TCP with the calibration's CPU, or the paper's
#: harness (``testbed.sim.paper``).
TCP_MODEL = "tcp"
T = TypeVar("T")


class SimEpisode:
    """One episode's loop, network and nodes (rule 1)."""

    def __init__(self, campaign: Campaign, cell: Cell, schedule: Schedule, *,
                 central: bool, calibration: Calibration, model: str = TCP_MODEL) -> None:
        self.loop = Loop()
        key = episode_key(cell, schedule.template)
        agents = list(schedule.agents)
        self.members = agents + ([CENTRAL_ID] if central else [])
        identities = {a: Identity.derive(a, campaign.seed, episode=f"sim/{key}")
                      for a in self.members}
        roster = Roster.build([Member(a, identities[a].public_key, "sim", 0)
                               for a in self.members], schedule.owners, agents)
        profile = campaign.network_profile(cell.network)
        self.tcp = TcpLayer(self.loop, lambda deliver: SimNetwork(
            self.loop, profile, self.members, trace_offset_s=cell.trace_offset_s,
            seed=campaign.seed, deliver=deliver))
        self.paper: PaperLinks | None = None
        client = None
        self.nodes: dict[str, SimNode] = {}
        if model == PAPER_MODEL:
            self.paper = PaperLinks(self.loop, profile, self.members,
                                    trace_offset_s=cell.trace_offset_s)
            client = paper_client(self.paper, self.nodes)
        elif model != TCP_MODEL:
            raise ValueError(f"model: {model!r} is not one of {TCP_MODEL}, {PAPER_MODEL}")
        for a in self.members:
            self.nodes[a] = SimNode(loop=self.loop, tcp=self.tcp, identity=identities[a],
                                    roster=roster, policy=cell.policy,
                                    connection=cell.connection,
                                    rpc_timeout_s=campaign.options.rpc_timeout_s,
                                    durability=campaign.options.durability,
                                    calibration=calibration, client=client)
        self.tcp.on_accept = lambda conn: self.nodes[conn.server].accept(conn)

    def restart_trace(self) -> None:
        self.tcp.network.restart_trace()
        if self.paper is not None:
            self.paper.restart_trace()

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()

    def counters(self) -> dict[str, dict[str, int]]:
        return {a: n.counters.snapshot() for a, n in self.nodes.items()}

    async def setup(self, schedule: Schedule, connection: str) -> PhaseTally:
        """Rule 2."""
        if connection == "reuse_warm":
            _each(await gather(self.loop, [n.client.warm for n in self.nodes.values()
                                           if n.agent_id != CENTRAL_ID]))
        _each(await gather(self.loop, [partial(self.nodes[s.owner].seed, s.key, s.content,
                                               s.rtype) for s in schedule.seeds]))
        return PhaseTally(setup=total_sent(self.counters()))


def _each(results: Sequence[T | BaseException]) -> list[T]:
    """Every result of a gather, or the first exception one of them raised."""
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return [r for r in results if not isinstance(r, BaseException)]


def run_sim_episode(campaign: Campaign, cell: Cell, schedule: Schedule, *, central: bool,
                    calibration: Calibration, model: str = TCP_MODEL) -> EpisodeResult:
    """One episode in virtual time (module rules); EpisodeAborted if it cannot finish.
    MODEL ``paper``: the paper's harness instead of TCP and CPU (``testbed.sim.paper``)."""
    previous = wire_encoding()  # a node process's own setting; here the episode's
    set_wire_encoding(campaign.options.wire_encoding)
    sim = SimEpisode(campaign, cell, schedule, central=central, calibration=calibration,
                     model=model)
    try:
        return _run(sim, campaign, cell, schedule)
    except (ProtocolError, SimDeadlock) as exc:
        raise EpisodeAborted(f"{type(exc).__name__}: {exc}") from None
    finally:
        sim.close()
        set_wire_encoding(previous)


def _run(sim: SimEpisode, campaign: Campaign, cell: Cell, schedule: Schedule
         ) -> EpisodeResult:
    loop, nodes = sim.loop, sim.nodes
    phases = loop.run(sim.setup(schedule, cell.connection))
    sim.restart_trace()
    setup_ns = loop.now_ns
    links_before = sim.tcp.network.counters()
    barrier = describe_policy(cell.policy).has_unit_end_hook
    by_unit: dict[int, list[Update | Plan | Act]] = defaultdict(list)
    for event in schedule.events:
        by_unit[event.unit].append(event)
    tally = StallTally()
    plans: dict[str, bytes] = {}
    acts: list[tuple[Act, dict[str, Any]]] = []
    for unit in range(schedule.units):
        for event in by_unit.get(unit, []):
            if isinstance(event, Update):
                reply = loop.run(nodes[event.owner].update(event.key, event.content))
                tally.commit_ms += float(reply["stall_ms"])
                tally.commit_rounds += int(reply.get("rounds", 0))
                tally.commit_handshake_rounds += int(reply.get("handshake_rounds", 0))
                phases.commit += int(reply.get("bytes", 0))
            elif isinstance(event, Plan):
                reply = loop.run(nodes[event.planner].plan(
                    action=event.action, executor=event.executor, keys=list(event.keys),
                    depth=event.depth, decision=event.decision))
                plans[event.action] = bytes(reply["root"])
                phases.planning += int(reply.get("bytes", 0))
            else:
                reply = loop.run(nodes[event.executor].act(
                    action=event.action, roots=(plans[event.action],),
                    keys=tuple(event.keys), critical=event.critical))
                tally.action_ms += float(reply["stall_ms"])
                acts.append((event, reply))
        if barrier:
            replies = _each(loop.run(gather(loop, [partial(n.unit_end, unit)
                                                   for n in nodes.values()])))
            tally.barrier_ms += max(float(r["stall_ms"]) for r in replies)
            tally.barrier_rounds += max(int(r.get("rounds", 0)) for r in replies)
            tally.barrier_handshake_rounds += max(int(r.get("handshake_rounds", 0))
                                                  for r in replies)
    end_ns = loop.now_ns
    timeline = build_head_log({a: n.head_log() for a, n in nodes.items()})
    result = _result(acts, timeline, sim.counters(), links_before,
                     sim.tcp.network.counters(), tally, phases)
    result.episode["wall_s"] = end_ns / 1e9
    result.episode["replay_s"] = (end_ns - setup_ns) / 1e9
    return result


def _result(acts: list[tuple[Act, dict[str, Any]]], timeline: Any,
            counters: Mapping[str, Mapping[str, int]],
            links_before: Mapping[str, Mapping[str, int]],
            links_after: Mapping[str, Mapping[str, int]], tally: StallTally,
            phases: PhaseTally) -> EpisodeResult:
    """The rows ``testbed.run.episode.TeamGroup._result`` builds, from sim replies."""
    rows: list[dict[str, Any]] = []
    for act, reply in acts:
        rows.append({**action_row(act.action, act.keys, reply, timeline),
                     **action_costs(reply),
                     "rpc_timeouts": int(reply.get("rpc_timeouts") or 0)})
    attempted = max(len(acts), 1)
    sent = total_sent(counters)
    opened = total_sent(counters, "connections_opened")
    stall_total = tally.action_ms + tally.barrier_ms + tally.commit_ms

    def delta(side: str, what: str) -> int:
        return sum(int(links_after[h].get(f"{side}_{what}", 0))
                   - int(links_before.get(h, {}).get(f"{side}_{what}", 0)) for h in links_after)

    episode: dict[str, Any] = {
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
        "link_bytes": delta("up", "bytes"),
        "congestion_control": "sim",
        **episode_costs(counters, phases, rows, attempted),
        "rpc_timeouts": total_sent(counters, "rpc_timeouts"),
        "link_up_drops": delta("up", "drops"),
        "link_down_drops": delta("down", "drops"),
    }
    return EpisodeResult(actions=rows, episode=episode)


class SimGroup:
    """The Group of one GroupKey: nothing lives between episodes (rule 1)."""

    def __init__(self, campaign: Campaign, key: GroupKey, calibration: Calibration) -> None:
        self.campaign = campaign
        self.key = key
        self.calibration = calibration

    @property
    def backend(self) -> str:
        return BACKEND

    @property
    def description(self) -> Mapping[str, Any]:
        profile = self.campaign.network_profile(self.key.network)
        return {"backend": BACKEND, "profile": profile.name,
                "trace_offset_s": self.key.trace_offset_s,
                "sim_calibration": self.calibration.to_json()}

    async def run_episode(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        result = run_sim_episode(self.campaign, cell, schedule, central=self.key.central,
                                 calibration=self.calibration)
        result.episode["sim_calibration"] = self.calibration.id
        return result


class SimRunner:
    """``testbed.run.contract.Runner`` for the sim backend."""

    def __init__(self, campaign: Campaign, calibration: Calibration) -> None:
        check_campaign(campaign)
        self.campaign = campaign
        self.calibration = calibration

    @asynccontextmanager
    async def open_group(self, key: GroupKey, cells: Sequence[Cell]
                         ) -> AsyncIterator[SimGroup]:
        yield SimGroup(self.campaign, key, self.calibration)
