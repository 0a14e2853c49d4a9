"""Work units: what one lane (or one cluster worker) runs on one topology, and how.

Rules:

1. A unit is a run of episodes that share a topology group: a whole group, or with
   several lanes one (group, template) slice of it, so that the policies of a template
   run back to back on one topology (paired episodes see the link close in time).
2. ``run_unit`` runs a unit's episodes in order on groups opened by the runner; an
   aborted episode closes its group, and the next episode of the unit runs on a fresh
   one, so a dead node cannot abort the rest of the unit.
3. Each episode ends as an :class:`EpisodeOutcome`: the runner's measurements or an
   abort reason, its wall time, the group's backend and description, and the host
   that ran it. Outcomes are plain data (they cross process boundaries when a unit
   runs on a cluster worker); only the campaign loop turns them into result rows and
   commits them, so it stays the one writer of the run directory.
"""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from testbed.campaign.model import Campaign, Cell, GroupKey, episode_key, fmt_number
from testbed.campaign.workload import Schedule
from testbed.run.contract import BACKSTOP_GRACE_S, EpisodeAborted, EpisodeResult, Runner


@dataclass(frozen=True)
class WorkUnit:
    """Episodes (cell, template) of one topology group, in the order they run.

    ``unshaped``: the group's network has no link (its profile's ``link`` is None, as
    ``loopback``'s): its stall is CPU time, so the unit runs alone (docs/campaigns.md).
    """

    group: GroupKey
    episodes: tuple[tuple[Cell, str], ...]
    unshaped: bool = False

    @property
    def keys(self) -> list[str]:
        return [episode_key(cell, template) for cell, template in self.episodes]


@dataclass(frozen=True)
class EpisodeOutcome:
    """How one episode ended (rule 3)."""

    key: str
    cell: Cell
    template: str
    result: EpisodeResult | None
    abort_reason: str
    wall_s: float
    backend: str
    group: GroupKey
    group_description: dict[str, Any] = field(default_factory=dict)
    worker: str = ""

    @property
    def aborted(self) -> bool:
        return self.result is None


def plan_units(todo: Sequence[tuple[Cell, str]], *, per_template: bool,
               unshaped: Collection[str] = ()) -> list[WorkUnit]:
    """Cut the pending episodes (in campaign order) into units (rule 1); UNSHAPED names
    the networks whose profile has no link (``unshaped_networks``)."""
    def unit_key(item: tuple[Cell, str]) -> Any:
        cell, template = item
        return (cell.group_key, template) if per_template else cell.group_key

    return [WorkUnit(items[0][0].group_key, tuple(items),
                     unshaped=items[0][0].network in unshaped)
            for items in (list(g) for _, g in itertools.groupby(todo, key=unit_key))]


def unshaped_networks(campaign: Campaign) -> frozenset[str]:
    """The networks of CAMPAIGN's grid that run without a link (decided by the profile,
    never by the name: a campaign's own ``unshaped = true`` network counts)."""
    return frozenset(name for name in campaign.network_names()
                     if campaign.network_profile(name).link is None)


class ScheduleCache:
    """Schedules are identical across the policies of a template; build each once."""

    def __init__(self, campaign: Campaign) -> None:
        self.campaign = campaign
        self.last: tuple[tuple[Any, ...], Schedule] | None = None

    def get(self, cell: Cell, template: str) -> Schedule:
        ident = (template, cell.agents, cell.keys, cell.units, cell.deps, cell.rho, cell.tier)
        if self.last is None or self.last[0] != ident:
            self.last = (ident, self.campaign.schedule(cell, template))
        return self.last[1]


def worker_host() -> str:
    return socket.gethostname()


async def run_unit(unit: WorkUnit, runner: Runner, campaign: Campaign, *,
                   on_start: Callable[[str], None],
                   on_outcome: Callable[[EpisodeOutcome], None],
                   schedules: ScheduleCache | None = None) -> None:
    """Run every episode of ``unit`` (rules 2 and 3); ``on_start(key)`` is called right
    before an episode runs, ``on_outcome`` right after it ended."""
    cache = schedules or ScheduleCache(campaign)
    pending = list(unit.episodes)
    host = worker_host()
    while pending:
        cells = list(dict.fromkeys(c for c, _ in pending))
        async with runner.open_group(unit.group, cells) as group:
            description = dict(group.description)
            while pending:
                cell, template = pending.pop(0)
                key = episode_key(cell, template)
                on_start(key)
                result, reason, wall_s = await _run_episode(
                    campaign, group.run_episode, cell, cache.get(cell, template))
                on_outcome(EpisodeOutcome(key, cell, template, result, reason, wall_s,
                                          group.backend, unit.group, description, host))
                if result is None:
                    break  # rebuild the topology and processes before going on


async def _run_episode(campaign: Campaign, run: Any, cell: Cell, schedule: Schedule,
                       ) -> tuple[EpisodeResult | None, str, float]:
    started = time.monotonic()
    result: EpisodeResult | None = None
    reason = ""
    try:
        limit_s = campaign.options.episode_timeout_s
        with trio.move_on_after(limit_s + BACKSTOP_GRACE_S) as scope:
            result = await run(cell, schedule)
        if scope.cancelled_caught:
            reason = (f"episode exceeded options.episode_timeout_s ({fmt_number(limit_s)} s) "
                      f"by {fmt_number(BACKSTOP_GRACE_S)} s; the runner did not stop it")
    except EpisodeAborted as exc:
        reason = exc.reason or "aborted (no reason given)"
        result = None
    return result, reason, time.monotonic() - started
