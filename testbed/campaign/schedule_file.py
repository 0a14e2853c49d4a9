"""The seeded schedule as a file your own program can follow (pure).

A command workload's episode writes its schedule (``testbed.campaign.workload``) as JSON
at ``$TESTBED_SCHEDULE`` before its programs start, so a user's protocol is driven by the
same seeded workload as PlanFence. Rules:

1. Every event has its work unit and a time, ``t_ms = lead_ms + unit * unit_ms`` after
   replay time 0 (``$TESTBED_T0_NS``; the lead leaves the programs time to start): one
   event per unit, as the testbed's own episodes run them, only paced by the clock
   instead of by the controller.
2. Events name who acts: an ``update`` its ``owner`` (the key, the version's size and its
   content in base64), a ``plan`` its ``planner`` (for its ``executor``, from the current
   heads of ``keys``), an ``act`` its ``executor`` (the protected action, by id). A
   program on host H does the events whose owner, planner or executor is H
   (``by_host`` lists their indices).
3. ``seeds`` are the keys' initial versions (owner, size, content), written before replay
   time 0 by their owners; ``owners`` maps every key to its owner.
4. The document names the episode, template, family, seed and the schedule's digest, so
   a program's output can be tied to the row that records it.
"""

from __future__ import annotations

import base64
from typing import Any

from testbed.campaign.workload import Act, Plan, Schedule, Update

FORMAT = "planfence-testbed/schedule/1"


def _content(data: bytes) -> dict[str, Any]:
    return {"size": len(data), "content_b64": base64.b64encode(data).decode()}


def schedule_document(schedule: Schedule, *, episode: str, unit_ms: float,
                      program_seed: int, lead_ms: float = 0.0) -> dict[str, Any]:
    """The schedule file of one episode (module rules)."""
    events: list[dict[str, Any]] = []
    by_host: dict[str, list[int]] = {agent: [] for agent in schedule.agents}
    for event in schedule.events:
        base = {"unit": event.unit, "t_ms": lead_ms + event.unit * unit_ms}
        if isinstance(event, Update):
            item = {**base, "kind": "update", "key": event.key, "owner": event.owner,
                    "rtype": event.rtype, **_content(event.content)}
            actors = [event.owner]
        elif isinstance(event, Plan):
            item = {**base, "kind": "plan", "action": event.action, "planner": event.planner,
                    "executor": event.executor, "keys": list(event.keys),
                    "depth": event.depth, "decision": event.decision}
            actors = [event.planner]
        else:
            assert isinstance(event, Act)
            item = {**base, "kind": "act", "action": event.action, "executor": event.executor,
                    "keys": list(event.keys)}
            actors = [event.executor]
        for actor in actors:
            by_host.setdefault(actor, []).append(len(events))
        events.append(item)
    return {
        "format": FORMAT, "episode": episode, "template": schedule.template,
        "family": schedule.family, "seed": program_seed, "digest": schedule.digest,
        "unit_ms": unit_ms, "lead_ms": lead_ms, "units": schedule.units, "agents": list(schedule.agents),
        "keys": list(schedule.keys), "owners": dict(schedule.owners),
        "seeds": [{"key": s.key, "owner": s.owner, "rtype": s.rtype, **_content(s.content)}
                  for s in schedule.seeds],
        "counts": {"actions": schedule.counts.actions, "updates": schedule.counts.updates},
        "events": events, "by_host": by_host,
    }
