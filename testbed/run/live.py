"""One live task against a team whose roles call a model (the ``live`` kind).

Rules this module obeys (docs/live.md has the workflow; the paper's Table 1(b), C.2,
C.4/C.5 and appendix F's live cohort):

1. Setup is an episode's (fresh stores, every key seeded, the trace restarted); a
   failure before the first role call aborts the task with reason ``initialization``.
2. The planner reads the owner's current requirement and plans from it by a role call;
   the plan (parent: that exact record) is handed to the executor and to the auditor.
   Then the owner commits one revision: every arm meets a plan derived from a
   superseded requirement.
3. The executor decides its primary action by a role call from what it holds: its
   local state (the original path: the plan and its own copy of the requirement), or,
   with ``executor_inputs = "fresh"`` (C.2's control), the requirement refreshed from
   the owner first. The action record's parents are the records given to the call. The
   policy then validates it (``act``): a derivation-current policy finds the revision,
   refreshes it, and the executor's replacement generation is another role call (at the
   node, ``nodes.role_calls`` rule 3) before the single revalidation.
4. With ``overlap = "in_generation"`` the controller waits, on a second control
   connection, for the executor's replacement call to start and has the owner commit a
   relevant update at once; the owners' logs and the call's recorded times later confirm
   (or not) that the commit landed inside the generation (``live_judge`` rule 5).
5. An issued primary is handed to the auditor: with the validated inputs when the
   policy is derivation-current (its repair path), as the decision alone otherwise. The
   auditor reviews it by a role call from the requirement it holds; a decision to act
   is an action of its own, validated by the same policy.
6. A role call that produced no decision is counted (``model_failures``) and ends the
   task's chain there; it never aborts the episode and is never replaced by a guess.
   A role call whose endpoint gave no answer at all after every retry (the node's
   ``unavailable``: the server was killed or hung) is no decision of the model: the
   episode aborts with reason ``model_endpoint: <base_url> ...``, an infrastructure
   failure that ``--resume`` runs again (``testbed.results.aborts``).
7. Traffic: the data-plane columns as for trials (role calls' handoffs and the auditor's
   validation count as planning); the role calls' HTTP bytes are ``model_bytes`` (the
   relay's count), a column of their own. Every role call goes to ``decisions``.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import trio

from nodes.control import ControlClient
from protocols.errors import ProtocolError, RemoteProtocolError
from protocols.policies import describe_policy
from testbed.campaign.live import ACTION, live_roles, task_content
from testbed.campaign.model import Campaign, Cell
from testbed.campaign.workload import Schedule
from testbed.errors import RunFailure
from testbed.net.topology import Topology
from testbed.results.aborts import MODEL_ENDPOINT
from testbed.run.accounting import PhaseTally, action_costs, episode_costs, total_sent
from testbed.run.contract import EpisodeAborted, EpisodeResult
from testbed.run.live_judge import TaskTrace, judge_task, versions
from testbed.run.model_access import ModelAccess
from testbed.run.prepare import start_episode
from testbed.run.team import Team
from testbed.run.verdict import build_head_log

ZERO_COSTS = {"rounds": 0, "query_bytes": 0, "fetch_bytes": 0, "revalidation_bytes": 0,
              "query_ms": 0.0, "fetch_ms": 0.0, "revalidation_ms": 0.0, "handshake_bytes": 0}


class LiveGroup(Protocol):
    """What a live task needs of its group (``testbed.run.episode.TeamGroup``)."""

    team: Team
    topo: Topology
    campaign: Campaign
    model_access: ModelAccess | None


async def run_live_task(group: LiveGroup, cell: Cell, schedule: Schedule) -> EpisodeResult:
    """Run one live task on fresh stores (module rules)."""
    team, topo, campaign, access = group.team, group.topo, group.campaign, group.model_access
    if access is None:
        raise EpisodeAborted("initialization: the group has no model relay")
    started = time.monotonic()
    roles = live_roles(schedule)
    try:
        phases = await start_episode(team, topo, cell, schedule)
        links_before = await topo.link_counters()
    except (RunFailure, ProtocolError) as exc:
        raise EpisodeAborted(f"initialization: {type(exc).__name__}: {exc}") from None
    access.take_bytes()
    trace = TaskTrace(roles.key, schedule.seed, schedule.template,
                      overlap=cell.overlap == "in_generation", started_ns=time.monotonic_ns())
    await _workflow(team, campaign, cell, schedule, trace, phases)
    trace.ended_ns = time.monotonic_ns()
    for agent in team.agents:
        trace.calls += (await team.call(agent, "role_calls"))["calls"]
    logs = {agent: (await team.call(agent, "head_log"))["log"] for agent in team.agents}
    row = _row(trace, build_head_log(logs), versions(logs, roles.key))
    counters = await team.counters()
    links_after = await topo.link_counters()
    episode = {
        "stall_ms_per_action": row["stall_ms"], "stall_action_ms": row["stall_ms"],
        "stall_barrier_ms": 0.0, "stall_commit_ms": 0.0,
        "kib_per_action": total_sent(counters) / 1024,
        "connections": sum(int(c.get("connections_opened", 0)) for c in counters.values()),
        "link_bytes": sum(int(links_after[h].get("up_bytes", 0))
                          - int(links_before.get(h, {}).get("up_bytes", 0))
                          for h in links_after),
        "wall_s": time.monotonic() - started,
        "congestion_control": str(topo.describe().get("congestion_control", "")),
        "rpc_timeouts": sum(int(c.get("rpc_timeouts", 0)) for c in counters.values()),
        "model_bytes": access.take_bytes(),
        **episode_costs(counters, phases, [row], 1),
    }
    return EpisodeResult(actions=[row], episode=episode, decisions=trace.calls)


async def _workflow(team: Team, campaign: Campaign, cell: Cell, schedule: Schedule,
                    trace: TaskTrace, phases: PhaseTally) -> None:
    """Rules 2-6; stops at the first role call without a decision."""
    roles = live_roles(schedule)
    key = roles.key
    plan = _answered(campaign, await team.call(
        roles.planner, "role", role="planner", action=ACTION, key=key,
        executor=roles.executor, handoff=[roles.auditor]))
    phases.planning += int(plan.get("bytes", 0))
    if plan.get("failed"):
        trace.failed = str(plan["failed"])
        return
    revision = schedule.updates()[0]
    reply = await team.call(roles.owner, "update", key=key, content=revision.content)
    phases.commit += int(reply.get("bytes", 0))
    if cell.executor_inputs == "fresh":
        read = await team.call(roles.executor, "read", keys=[key])
        phases.planning += sum(int(read.get(f"{p}_bytes", 0))
                               for p in ("query", "fetch", "revalidation"))
    chosen = _answered(campaign, await team.call(
        roles.executor, "role", role="executor", action=ACTION, key=key,
        roots=[bytes(plan["record"])]))
    phases.planning += int(chosen.get("bytes", 0))
    if chosen.get("failed"):
        trace.failed = str(chosen["failed"])
        return
    trace.candidate = bytes(chosen["record"]).hex()
    act_args: dict[str, Any] = {"action": ACTION, "roots": [bytes(chosen["record"])],
                                "keys": [key], "deadline_s": campaign.options.action_deadline_s,
                                "effect_delay_s": campaign.options.effect_delay_s}
    if trace.overlap:
        trace.primary = await _act_with_overlap(team, schedule, roles.executor, roles.owner,
                                                key, act_args, trace, phases)
    else:
        trace.primary = await team.call(roles.executor, "act", **act_args)
    _answered(campaign, trace.primary)
    if trace.primary["outcome"] != "released":
        return
    issued = bytes(trace.primary["issued_roots"][0])
    handed = [issued]
    if describe_policy(cell.policy).derivation_current:  # the repair path (rule 5)
        handed = [bytes(v) for v in dict(trace.primary.get("inputs") or {}).values()] + handed
    reply = await team.call(roles.executor, "handoff", to=roles.auditor, ids=handed)
    phases.planning += int(reply.get("bytes", 0))
    review = _answered(campaign, await team.call(
        roles.auditor, "role", role="auditor", action=ACTION, key=key, primary=issued))
    phases.planning += int(review.get("bytes", 0))
    if review.get("failed") or review.get("record") is None:
        return
    trace.auditor = _answered(campaign, await team.call(roles.auditor, "act", **{
        **act_args, "roots": [bytes(review["record"])]}))
    phases.planning += int(trace.auditor.get("bytes", 0))


def _answered(campaign: Campaign, reply: dict[str, Any]) -> dict[str, Any]:
    """The reply, unless its role call's endpoint gave no answer (rule 6): then the
    episode aborts with the endpoint named."""
    if reply.get("unavailable"):
        url = campaign.model.base_url if campaign.model is not None else "?"
        raise EpisodeAborted(f"{MODEL_ENDPOINT}: {url} unavailable: {reply['unavailable']}")
    return reply


async def _act_with_overlap(team: Team, schedule: Schedule, executor: str, owner: str,
                            key: str, act_args: dict[str, Any], trace: TaskTrace,
                            phases: PhaseTally) -> dict[str, Any]:
    """The primary action, with the owner's update sent as soon as the executor's
    replacement generation starts (rule 4)."""
    replies: list[dict[str, Any]] = []
    waiting = trio.CancelScope()
    deadline_s = float(act_args["deadline_s"])

    async def overlap(after_ns: int) -> None:
        side = await ControlClient.connect(team.control_path(executor))
        try:
            with waiting:
                started = await side.request("wait_role", role="replan", after_t_ns=after_ns,
                                             timeout_s=deadline_s)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError,
                RemoteProtocolError) as exc:
            raise RunFailure(f"{executor}: wait_role: {exc!r}") from None
        finally:
            await side.aclose()
        if waiting.cancelled_caught or not started.get("ok") or not started.get("t_ns"):
            return
        update = await team.call(owner, "update", key=key,
                                 content=task_content(schedule.seed, schedule.template, 2))
        trace.overlap_update_t_ns = int(update["t_ns"])
        phases.commit += int(update.get("bytes", 0))

    async def act() -> None:
        try:
            replies.append(await team.call(executor, "act", **act_args))
        finally:
            waiting.cancel()  # a wait still pending ends; an update already sent finishes

    async with trio.open_nursery() as nursery:
        nursery.start_soon(overlap, time.monotonic_ns())
        nursery.start_soon(act)
    return replies[0]


def _row(trace: TaskTrace, timeline: Any, seqs: dict[bytes, int]) -> dict[str, Any]:
    reply = trace.primary
    judged = judge_task(trace, timeline, seqs)
    if reply is None:
        return {"action": ACTION, "outcome": "blocked", "replans": 0, "stall_ms": 0.0,
                "bytes": 0, "connections": 0, "rpc_timeouts": 0,
                "block_reason": f"model_failure: {trace.failed}", **ZERO_COSTS, **judged}
    return {"action": ACTION, "outcome": reply["outcome"], "replans": int(reply["replans"]),
            "stall_ms": float(reply["stall_ms"]), "bytes": int(reply["bytes"]),
            "connections": int(reply["connections"]),
            "rpc_timeouts": int(reply.get("rpc_timeouts") or 0),
            "block_reason": str(reply.get("block_reason") or ""),
            **action_costs(reply), **judged}
