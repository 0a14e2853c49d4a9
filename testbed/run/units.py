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
5. Attempts (``testbed/run/attempts.py``): a unit carries each episode's plan (the
   repeats it still needs and its next attempt number). Repeats run round by round
   (every episode's first pending repeat, then every second one ...), so the paired
   policies of a template alternate; a disturbed attempt with tries left runs again at
   once, under the next number. Every attempt is its own outcome, an aborted one too.
"""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from testbed.campaign.model import Campaign, Cell, GroupKey, episode_key, fmt_number
from testbed.campaign.workload import Schedule
from testbed.run.attempts import ONE_ATTEMPT, EpisodePlan
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
    #: Per episode (same order), what it still needs (rule 5); empty: one attempt each.
    plans: tuple[EpisodePlan, ...] = ()

    @property
    def keys(self) -> list[str]:
        return [episode_key(cell, template) for cell, template in self.episodes]

    def plan(self, index: int) -> EpisodePlan:
        return self.plans[index] if self.plans else ONE_ATTEMPT

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
    attempt: int = 1
    repeat: int = 1
    #: Another attempt of the same repeat follows (this one was disturbed).
    rerun: bool = False

    @property
    def aborted(self) -> bool:
        return self.result is None


def plan_units(todo: Sequence[tuple[Cell, str]], *, per_template: bool,
               plans: Mapping[str, EpisodePlan] | None = None) -> list[WorkUnit]:
    """Cut the pending episodes (in campaign order) into units (rule 1), each episode
    with its plan (rule 5; default one attempt)."""
    def unit_key(item: tuple[Cell, str]) -> Any:
        cell, template = item
        return (cell.group_key, template) if per_template else cell.group_key

    units = []
    for items in (list(g) for _, g in itertools.groupby(todo, key=unit_key)):
        unit_plans = () if plans is None else tuple(
            plans.get(episode_key(c, t), ONE_ATTEMPT) for c, t in items)
        units.append(WorkUnit(items[0][0].group_key, tuple(items), unit_plans))
    return units


@dataclass
class _Job:
    cell: Cell
    template: str
    key: str
    repeat: int
    tries: int


def attempt_jobs(unit: WorkUnit) -> list[_Job]:
    """The unit's repeats in the order they run: round by round (rule 5)."""
    rounds: list[list[_Job]] = []
    for index, (cell, template) in enumerate(unit.episodes):
        key = episode_key(cell, template)
        for i, slot in enumerate(unit.plan(index).slots):
            while len(rounds) <= i:
                rounds.append([])
            rounds[i].append(_Job(cell, template, key, slot.repeat, slot.tries))
    return [job for jobs in rounds for job in jobs]


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
    """Run every episode of ``unit`` (rules 2-5); ``on_start(key)`` is called right
    before an episode runs, ``on_outcome`` right after it ended, ``on_failure`` for
    each failure of the unit (``testbed.run.failures``)."""
    state = _UnitRun(unit, campaign, schedules or ScheduleCache(campaign), on_start,
                     on_outcome)
    starts = 0
    while state.pending:
        cells = list(dict.fromkeys(job.cell for job in state.pending))
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
    """The attempts of one unit still to run, and the one in flight."""

    def __init__(self, unit: WorkUnit, campaign: Campaign, cache: ScheduleCache,
                 on_start: Callable[[str], None],
                 on_outcome: Callable[[EpisodeOutcome], None]) -> None:
        self.unit, self.campaign, self.cache = unit, campaign, cache
        self.on_start, self.on_outcome = on_start, on_outcome
        self.pending = attempt_jobs(unit)
        self.numbers = {episode_key(c, t): unit.plan(i).next_attempt
                        for i, (c, t) in enumerate(unit.episodes)}
        self.host = worker_host()
        self.entered = False
        self.backend = ""
        self.running: tuple[_Job, int, float] | None = None

    def _number(self, job: _Job) -> int:
        """The next attempt number of ``job``'s episode (used once)."""
        attempt = self.numbers[job.key]
        self.numbers[job.key] += 1
        return attempt

    async def run_group(self, group: Group) -> None:
        """Run pending episodes on ``group`` until one aborts or none is left."""
        self.entered, self.backend = True, group.backend
        description = dict(group.description)
        while self.pending:
            job = self.pending.pop(0)
            attempt = self._number(job)
            self._call(self.on_start, job.key)
            self.running = (job, attempt, time.monotonic())
            result, reason, wall_s = await _run_episode(
                self.campaign, group.run_episode, job.cell,
                self.cache.get(job.cell, job.template))
            self.running = None
            rerun = (result is not None and job.tries > 1
                     and bool(result.episode.get("disturbed")))
            self._call(self.on_outcome, EpisodeOutcome(
                job.key, job.cell, job.template, result, reason, wall_s, group.backend,
                self.unit.group, description, self.host, attempt, job.repeat, rerun))
            if rerun:
                self.pending.insert(0, _Job(job.cell, job.template, job.key, job.repeat,
                                            job.tries - 1))
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
        for job in self.pending:
            self.on_start(job.key)
            self.on_outcome(EpisodeOutcome(job.key, job.cell, job.template, None, reason, 0.0,
                                           "", self.unit.group, {}, self.host,
                                           self._number(job), job.repeat))
            keys.append(job.key)
        self.pending.clear()
        return list(dict.fromkeys(keys))

    def abort_running(self, reason: str) -> list[str]:
        """The group failed under an episode: that episode is aborted."""
        if self.running is None:
            return []
        job, attempt, started = self.running
        self.running = None
        self.on_outcome(EpisodeOutcome(job.key, job.cell, job.template, None, reason,
                                       time.monotonic() - started, self.backend,
                                       self.unit.group, {}, self.host, attempt, job.repeat))
        return [job.key]


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
