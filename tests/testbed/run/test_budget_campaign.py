"""Budgeted validation on real node processes (loopback), with the workload's schedules.

One small campaign runs owner-head freshness, PlanFence and ``planfence_budget`` at
b = 0, b = all and b = 1 with ``critical_first`` on identical schedules. The ends must
reproduce the two reference policies action by action: b = 0 issues exactly the actions
owner-head freshness issues as invalid (and sends nothing), b = all makes PlanFence's
decisions with PlanFence's bytes (none invalid). b = 1 ``critical_first`` must check the
critical input the workload declared, which reaches the executor through the ``act``
op: its invalid actions are predicted from the schedule alone.
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from testbed.campaign.parse import parse_campaign
from testbed.campaign.workload import Act, Plan, Schedule, Update
from testbed.run.episode import EpisodeRunner
from testbed.run.loop import run_campaign

pytestmark = pytest.mark.slow

OHF, PF = "owner_head_freshness", "planfence"
ZERO, FULL = "planfence_budget/b=0", "planfence_budget"
CRITICAL = "planfence_budget/b=1/ranking=critical_first"


def predicted_invalid(schedule: Schedule) -> dict[str, bool]:
    """Per action, whether checking only its critical input leaves it invalid: some
    declared key changed between plan and act other than the critical one, and not
    refreshed by the replan (which happens only when the critical input changed and
    takes the executor's newest local version, current for keys it owns)."""
    out: dict[str, bool] = {}
    open_plans: dict[str, set[str]] = {}
    for event in schedule.events:
        if isinstance(event, Plan):
            open_plans[event.action] = set()
        elif isinstance(event, Update):
            for changed in open_plans.values():
                changed.add(event.key)
        elif isinstance(event, Act):
            changed = open_plans.pop(event.action) & set(event.keys)
            replanned = event.critical in changed
            left = {k for k in changed - {event.critical}
                    if not (replanned and schedule.owners[k] == event.executor)}
            out[event.action] = bool(left)
    return out


async def test_the_ends_of_the_budget_reproduce_owner_head_freshness_and_planfence(
        tmp_path: Path) -> None:
    campaign = parse_campaign({
        "name": "budget-ends", "seed": 11, "templates": 3,
        "options": {"episode_timeout_s": 180},
        "grid": {"policy": [OHF, PF, ZERO, FULL, CRITICAL], "network": ["loopback"],
                 "rho": [1, 4], "agents": [5], "keys": [8], "deps": [3], "units": [24],
                 "connection": ["reuse"]}})
    out = tmp_path / "out"
    await run_campaign(campaign, out, resume=False, runner=EpisodeRunner(campaign),
                       console=Console(file=io.StringIO(), width=200))
    actions = pd.read_parquet(out / "actions.parquet")
    episodes = pd.read_parquet(out / "episodes.parquet")
    assert not episodes["aborted"].any()
    assert (episodes.groupby(["rho", "template"])["schedule_digest"].nunique() == 1).all()
    assert (actions["outcome"] == "released").all()

    key = ["rho", "template", "action"]
    by = {p: actions[actions["policy"] == p].set_index(key).sort_index()
          for p in (OHF, PF, ZERO, FULL, CRITICAL)}
    assert by[OHF]["invalid"].sum() > 0  # the schedules do supersede inputs
    # b = 0: owner-head freshness's invalid actions, action by action, with no message.
    assert by[ZERO]["invalid"].equals(by[OHF]["invalid"])
    assert (by[ZERO]["bytes"] == 0).all()
    assert (by[ZERO]["rounds"] == 0).all()
    # b = all: PlanFence's decisions and bytes, action by action; nothing invalid.
    for column in ("invalid", "replans", "bytes", "rounds"):
        assert by[FULL][column].equals(by[PF][column]), column
    assert not by[FULL]["invalid"].any()

    # b = 1, critical_first: exactly the actions the schedule predicts.
    expected = {}
    for cell in campaign.cells():
        if cell.policy != CRITICAL:
            continue
        for template in campaign.templates:
            schedule = campaign.schedule(cell, template)
            for action, invalid in predicted_invalid(schedule).items():
                expected[(cell.rho, template, action)] = invalid
    got = {k: bool(v) for k, v in by[CRITICAL]["invalid"].items()}
    assert got == expected
    assert 0 < sum(got.values()) < by[OHF]["invalid"].sum()  # one check catches some
