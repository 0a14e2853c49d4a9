"""Result rows of a command workload's episode (the campaign loop's half of the contract).

Rules:

1. An action row is what the program reported (``testbed.run.metrics``) with the cell's
   and the episode's columns; when its id is an action of the schedule it also gets that
   action's ``unit`` and ``planner``; ``executor`` is the host that reported it.
2. The episode row counts ``scheduled_actions`` from the schedule (the program may
   report fewer, or actions of its own) and ``attempted_actions`` as the rows reported.
"""

from __future__ import annotations

from typing import Any

from testbed.campaign.model import Campaign
from testbed.campaign.workload import Schedule
from testbed.results.schema import (
    RUNNER_ACTION_FIELDS,
    RUNNER_ACTION_OPTIONAL,
    RUNNER_EPISODE_FIELDS,
    ResultRowError,
    check_fields,
)
from testbed.run.contract import EpisodeResult

REQUIRED_ACTION = ("action", "outcome", "ok", "host")


def command_rows(base: dict[str, Any], campaign: Campaign, schedule: Schedule,
                 result: EpisodeResult, wall_s: float, key: str
                 ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rules above, checking the runner's fields."""
    acts = {a.action: a for a in schedule.acts()}
    planners = {p.action: p.planner for p in schedule.plans()}
    rows = []
    for row in result.actions:
        check_fields(row, REQUIRED_ACTION, (*RUNNER_ACTION_FIELDS, *RUNNER_ACTION_OPTIONAL),
                     f"episode {key}: action")
        if row["outcome"] not in ("ok", "failed"):
            raise ResultRowError(f"episode {key}: action {row['action']}: outcome "
                                 f"{row['outcome']!r}; allowed: ok, failed")
        act = acts.get(row["action"])
        rows.append({**base, "unit": None if act is None else act.unit,
                     "planner": planners.get(row["action"]), "executor": row["host"], **row})
    check_fields(result.episode, (), RUNNER_EPISODE_FIELDS, f"episode {key}: episode")
    episode_row = {**base, "seed": campaign.seed, "scheduled_actions": schedule.counts.actions,
                   "attempted_actions": len(rows), "updates": schedule.counts.updates,
                   "aborted": False, "abort_reason": None, "wall_s": wall_s, **result.episode}
    return rows, episode_row
