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
4. A failure of the unit itself (its group does not start, fails under an episode, or
   fails to tear down) never escapes ``run_unit``: it is retried, recorded as aborted
   episodes and reported as a ``UnitFailure`` (``testbed.run.failures``).
"""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from testbed.campaign.model import Campaign, Cell, GroupKey, episode_key, fmt_number
from testbed.campaign.workload import Schedule
from testbed.run.contract import BACKSTOP_GRACE_S, EpisodeAborted, EpisodeResult, Group, Runner
from testbed.run.failures import (
    START_ATTEMPTS,
    CallbackError,
    UnitFailure,
    run_in_group,
    unit_reason,
)
from testbed.run.startup import forget_measurement


@dataclass(frozen=True)
class WorkUnit:
    """Episodes (cell, template) of one topology group, in the order they run."""

    group: GroupKey
    episodes: tuple[tuple[Cell, str], ...]

    @property
    def keys(self) -> list[str]:
        return [episode_key(cell, template) for cell, template in self.episodes]

    @property
    def loopback(self) -> bool:
        """Unshaped units measure CPU time: they run alone (docs/campaigns.md)."""
        return self.group.network == "loopback"


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


def plan_units(todo: Sequence[tuple[Cell, str]], *, per_template: bool) -> list[WorkUnit]:
    """Cut the pending episodes (in campaign order) into units (rule 1)."""
    def unit_key(item: tuple[Cell, str]) -> Any:
        cell, template = item
        return (cell.group_key, template) if per_template else cell.group_key

    return [WorkUnit(items[0][0].group_key, tuple(items))
            for items in (list(g) for _, g in itertools.groupby(todo, key=unit_key))]


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
                   schedules: ScheduleCache | None = None,
                   on_failure: Callable[[UnitFailure], None] | None = None) -> None:
    """Run every episode of ``unit`` (rules 2-4); ``on_start(key)`` is called right
    before an episode runs, ``on_outcome`` right after it ended, ``on_failure`` for
    each failure of the unit (``testbed.run.failures``)."""
    state = _UnitRun(unit, campaign, schedules or ScheduleCache(campaign), on_start,
                     on_outcome)
    starts = 0
    while state.pending:
        cells = list(dict.fromkeys(c for c, _ in state.pending))
        end = await run_in_group(runner, unit.group, cells, state.run_group)
        if state.entered:
            starts = 0
        if end.stage is None:
            continue
        aborted: list[str] = []
        if end.stage == "start":
            starts += 1
            forget_measurement()
            if starts >= START_ATTEMPTS:
                reason = f"{end.reason} (attempt {starts} of {START_ATTEMPTS})"
                aborted += state.abort_pending(unit_reason("start", reason))
        aborted += state.abort_running(unit_reason(end.stage, end.reason))
        if on_failure is not None:
            on_failure(UnitFailure(unit.group.id, end.stage, end.reason, tuple(aborted),
                                   max(starts, 1), state.host, end.trace))


class _UnitRun:
    """The episodes of one unit still to run, and the one in flight."""

    def __init__(self, unit: WorkUnit, campaign: Campaign, cache: ScheduleCache,
                 on_start: Callable[[str], None],
                 on_outcome: Callable[[EpisodeOutcome], None]) -> None:
        self.unit, self.campaign, self.cache = unit, campaign, cache
        self.on_start, self.on_outcome = on_start, on_outcome
        self.pending = list(unit.episodes)
        self.host = worker_host()
        self.entered = False
        self.backend = ""
        self.running: tuple[Cell, str, float] | None = None

    async def run_group(self, group: Group) -> None:
        """Run pending episodes on ``group`` until one aborts or none is left."""
        self.entered, self.backend = True, group.backend
        description = dict(group.description)
        while self.pending:
            cell, template = self.pending.pop(0)
            key = episode_key(cell, template)
            self._call(self.on_start, key)
            self.running = (cell, template, time.monotonic())
            result, reason, wall_s = await _run_episode(
                self.campaign, group.run_episode, cell, self.cache.get(cell, template))
            self.running = None
            self._call(self.on_outcome, EpisodeOutcome(
                key, cell, template, result, reason, wall_s, group.backend, self.unit.group,
                description, self.host))
            if result is None:
                break  # rebuild the topology and processes before going on

    @staticmethod
    def _call(callback: Callable[[Any], None], arg: Any) -> None:
        """The loop's callbacks fail as the loop, not as the unit (CallbackError)."""
        try:
            callback(arg)
        except Exception as exc:
            raise CallbackError(exc) from exc

    def abort_pending(self, reason: str) -> list[str]:
        keys = []
        for cell, template in self.pending:
            key = episode_key(cell, template)
            self.on_start(key)
            self.on_outcome(EpisodeOutcome(key, cell, template, None, reason, 0.0, "",
                                           self.unit.group, {}, self.host))
            keys.append(key)
        self.pending.clear()
        return keys

    def abort_running(self, reason: str) -> list[str]:
        """The group failed under an episode: that episode is aborted."""
        if self.running is None:
            return []
        cell, template, started = self.running
        self.running = None
        key = episode_key(cell, template)
        self.on_outcome(EpisodeOutcome(key, cell, template, None, reason,
                                       time.monotonic() - started, self.backend,
                                       self.unit.group, {}, self.host))
        return [key]


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
