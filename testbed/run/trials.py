"""Single-action trials against a live team: updates during replanning and the handoff
evidence ablation (the ``replanning`` and ``handoff`` kinds of ``testbed.campaign.trials``).

Rules this module obeys:

1. Setup is the same as an episode's (fresh stores, every key seeded, the trace clock
   restarted), then the planner plans the action and hands it off. A failure before
   the action starts is an initialization failure: the trial is aborted with reason
   ``initialization: ...`` (the report's Infra. column), never imputed.
2. Replanning (appendix F): the owner revises the requirement (the executor's first
   check finds it stale), then the executor acts with the cell's synthetic replanning
   delay and the campaign's action deadline while the owner keeps updating (the
   requirement, or for the control row only its unrelated key) at the seeded Poisson
   times of :func:`testbed.campaign.trials.poisson_times`. The updater is a concurrent
   task on the owner's own control connection, so the updates really overlap the
   validation on the wire; it starts with the action and stops issuing at the recorded
   effect (an update already sent is waited for, never cut off mid-request).
3. Judging, from the owners' head logs only: a blocked action is Block (with its
   reason); a released one is Complete if every declared input is still its owner's
   head at the recorded effect; otherwise Gap if the input changed after the final
   check's requests were sent (after the final validation: ``gap_ms`` is the change's
   time after the final head read returned, negative while that answer was in flight),
   and Stale if it had changed at its owner before them, which only a source that lags
   the owner allows (centralized lineage's directory, between an owner's write and its
   commit).
4. Handoff (Table G.1): ``unchanged`` (no revision), ``same_session`` (the executor
   plans the action itself, the owner revises the input, the executor acts) and
   ``handoff`` (the planner hands off, the owner revises, the executor retrieves the
   revised input, then acts). The planner's reported inputs travel with the action as
   the version set an application would carry (``act`` ``versions``); only the
   inherited-version-set stand-in reads it. Issued actions are Complete or Invalid
   (judged at issue time like every episode), others Block.
5. A trial's history (``testbed/run/history.py``) is derived like an episode's, so its
   checker columns judge the action at its issue instant like ``invalid``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

import trio

from protocols.errors import ProtocolError
from testbed.campaign.model import Campaign, Cell
from testbed.campaign.trials import poisson_times, trial_content, trial_roles
from testbed.campaign.workload import Act, Schedule
from testbed.errors import RunFailure
from testbed.net.topology import Topology
from testbed.results.history import check_episode, history_columns, history_texts
from testbed.run.accounting import PhaseTally, action_costs, episode_costs, total_sent
from testbed.run.contract import EpisodeAborted, EpisodeResult
from testbed.run.history import node_history
from testbed.run.prepare import start_episode
from testbed.run.team import Team
from testbed.run.verdict import (
    HeadLog,
    build_head_log,
    changes_between,
    effect_verdict,
    judge_invalid,
)

#: Poisson arrivals are drawn this far past the action deadline (none is used after it).
HORIZON_MARGIN_S = 5.0


class TrialGroup(Protocol):
    """What a trial needs of the group it runs in (``testbed.run.episode.TeamGroup``)."""

    team: Team
    topo: Topology
    campaign: Campaign


async def run_trial(group: TrialGroup, cell: Cell, schedule: Schedule) -> EpisodeResult:
    """Run one trial of the campaign's kind on fresh stores (module rules)."""
    team, topo, campaign = group.team, group.topo, group.campaign
    started = time.monotonic()
    planner, executor, key, owner, unrelated = trial_roles(schedule)
    plan_event = schedule.plans()[0]
    same_session = cell.scenario == "same_session"
    if same_session:
        planner = executor
    try:
        phases = await start_episode(team, topo, cell, schedule)
        plan = await team.call(planner, "plan", action=plan_event.action, executor=executor,
                               keys=[key], depth=plan_event.depth,
                               decision=plan_event.decision)
    except (RunFailure, ProtocolError) as exc:
        raise EpisodeAborted(f"initialization: {type(exc).__name__}: {exc}") from None
    phases.planning += int(plan.get("bytes", 0))
    act_args: dict[str, Any] = {
        "action": plan_event.action, "roots": [bytes(plan["root"])], "keys": [key],
        "deadline_s": campaign.options.action_deadline_s,
        "effect_delay_s": campaign.options.effect_delay_s,
        "versions": {str(k): bytes(v) for k, v in dict(plan["inputs"]).items()},
    }
    revision = schedule.updates()[0]
    if campaign.kind == "replanning":
        await _revise(team, revision.owner, key, revision.content, phases)
        target = key if cell.update_target == "relevant" else unrelated
        reply = await _act_under_updates(team, campaign, cell, schedule, executor, owner,
                                         target, act_args, phases)
    else:
        if cell.scenario != "unchanged":
            await _revise(team, revision.owner, key, revision.content, phases)
        if cell.scenario == "handoff":
            await team.call(executor, "read", keys=[key])
        reply = await team.call(executor, "act", **act_args)
    logs = {agent: (await team.call(agent, "head_log"))["log"] for agent in team.agents}
    installs = {agent: (await team.call(agent, "install_log"))["log"] for agent in team.agents}
    timeline = build_head_log(logs)
    rpcs = {agent: await team.call(agent, "rpc_log") for agent in team.agents}
    history = history_texts(node_history(
        owners=schedule.owners, head_logs=logs, install_logs=installs,
        acts=[(Act(0, plan_event.action, executor, (key,)), reply)], rpc_logs=rpcs))
    row = _judge(campaign.kind, plan_event.action, timeline, key, unrelated, reply)
    if same_session:
        row.update(planner=planner, executor=executor)
    counters = await team.counters()
    episode = {
        "stall_ms_per_action": row["stall_ms"], "stall_action_ms": row["stall_ms"],
        "stall_barrier_ms": 0.0, "stall_commit_ms": 0.0,
        "kib_per_action": total_sent(counters) / 1024,
        "connections": sum(int(c.get("connections_opened", 0)) for c in counters.values()),
        "link_bytes": 0, "wall_s": time.monotonic() - started,
        "congestion_control": str(topo.describe().get("congestion_control", "")),
        "rpc_timeouts": sum(int(c.get("rpc_timeouts", 0)) for c in counters.values()),
        **episode_costs(counters, phases, [row], 1),
        **history_columns(check_episode(history)),
    }
    return EpisodeResult(actions=[row], episode=episode, history=history)


async def _revise(team: Team, owner: str, key: str, content: bytes, phases: PhaseTally) -> None:
    reply = await team.call(owner, "update", key=key, content=content)
    phases.commit += int(reply.get("bytes", 0))


async def _act_under_updates(team: Team, campaign: Campaign, cell: Cell, schedule: Schedule,
                             executor: str, owner: str, target: str,
                             act_args: dict[str, Any], phases: PhaseTally) -> dict[str, Any]:
    """The action, with the owner updating ``target`` at the Poisson times (rule 2)."""
    deadline_s = campaign.options.action_deadline_s
    times = poisson_times(seed=campaign.seed, template=schedule.template,
                          rate_per_s=float(cell.update_rate_per_s or 0.0),
                          horizon_s=deadline_s + HORIZON_MARGIN_S)
    size = len(next(s.content for s in schedule.seeds if s.key == target))
    version = 1 if target == schedule.updates()[0].key else 0
    done = trio.Event()
    sleeping: list[trio.CancelScope] = []
    replies: list[dict[str, Any]] = []

    async def updater(t0: float) -> None:
        nonlocal version
        for at in times:
            with trio.CancelScope() as scope:
                sleeping.append(scope)
                await trio.sleep_until(t0 + at)
            if done.is_set():
                return
            version += 1
            await _revise(team, owner, target,
                          trial_content(schedule.template, target, version, size), phases)

    async def actor() -> None:
        try:
            replies.append(await team.call(executor, "act",
                                           replan_delay_s=float(cell.replan_delay_s or 0.0),
                                           **act_args))
        finally:
            done.set()
            for scope in sleeping:
                scope.cancel()

    async with trio.open_nursery() as nursery:
        t0 = trio.current_time()
        nursery.start_soon(updater, t0)
        nursery.start_soon(actor)
    return replies[0]


def _judge(kind: str, action: str, timeline: HeadLog, key: str, unrelated: str,
           reply: Mapping[str, Any]) -> dict[str, Any]:
    """The action row of a trial (rules 3 and 4)."""
    released = reply["outcome"] == "released"
    inputs = {str(k): bytes(v) for k, v in dict(reply.get("inputs") or {}).items()}
    started, decided = int(reply["started_t_ns"]), int(reply["issue_t_ns"])
    effect, last_read = int(reply["effect_t_ns"]), int(reply["last_head_read_t_ns"])
    last_round = int(reply.get("last_head_round_t_ns") or 0)
    invalid = released and judge_invalid(timeline, [key], inputs, decided)
    gap_ms: float | None = None
    if kind == "replanning":
        current, changed = effect_verdict(timeline, [key], inputs, effect)
        outcome = "block" if not released else ("complete" if current else "gap")
        if outcome == "gap" and changed is not None and changed < last_round:
            outcome = "stale"
        if outcome == "gap" and changed is not None and last_read:
            gap_ms = (changed - last_read) / 1e6
    else:
        outcome = "block" if not released else ("invalid" if invalid else "complete")
    return {
        "action": action, "outcome": reply["outcome"],
        "invalid": invalid, "complete": outcome == "complete",
        "replans": int(reply["replans"]), "stall_ms": float(reply["stall_ms"]),
        "bytes": int(reply["bytes"]), "connections": int(reply["connections"]),
        "block_reason": str(reply.get("block_reason") or ""),
        "rpc_timeouts": int(reply.get("rpc_timeouts") or 0),
        **action_costs(reply),
        "trial_outcome": outcome,
        "relevant_updates": changes_between(timeline, key, started, effect),
        "unrelated_updates": changes_between(timeline, unrelated, started, effect),
        "action_s": (decided - started) / 1e9,
        "effect_lag_ms": (effect - last_read) / 1e6 if released and last_read else None,
        "gap_ms": gap_ms,
    }
