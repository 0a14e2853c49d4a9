"""Execution engines: who runs a campaign's work units.

One execution model, two engines. The campaign loop (``testbed.run.loop``) cuts the
pending episodes into work units (``testbed.run.units``) and hands them to an engine,
which calls back ``on_start(key)`` before an episode runs and ``on_outcome(outcome)``
after it ended; the loop alone writes the run directory.

- :class:`LocalEngine`: trio lanes in this process (``--jobs N``). Each lane opens its
  own topologies (own prefix, namespaces, emulator and node processes).
- ``testbed.run.dask_engine.DaskEngine``: each unit goes to a ``dask.distributed``
  worker, which runs it whole (topology, team, episodes) and returns its outcomes.

Unshaped (loopback-like) units measure CPU time, so both engines run them first, one at
a time, with nothing else running beside them; then the emulated-link units fill the
lanes. Given the host's lane budget (``testbed.host.lanes.HostLanes``, what ``testbed
run`` passes), the local engine also holds a host lane for each unit it runs and the
host's loopback exclusivity for each stretch of unshaped units, so concurrent runs on
one host share it and no other run's episodes run beside an unshaped cell.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

import trio

from testbed.campaign.model import Campaign
from testbed.host.lanes import HostLanes
from testbed.run.contract import Runner
from testbed.run.failures import UnitFailure
from testbed.run.units import EpisodeOutcome, ScheduleCache, WorkUnit, run_unit

OnStart = Callable[[str], None]
OnOutcome = Callable[[EpisodeOutcome], None]
OnFailure = Callable[[UnitFailure], None]


class Engine(Protocol):
    #: Whether units are (group, template) slices (True) or whole groups.
    per_template: bool

    def describe(self) -> dict[str, Any]:
        """What the manifest records of the engine (its kind, lanes, cluster)."""
        ...

    async def run(self, units: Sequence[WorkUnit], campaign: Campaign, *,
                  on_start: OnStart, on_outcome: OnOutcome,
                  on_failure: OnFailure | None = None) -> None:
        """Run every unit; return when all ended. A unit's failure is reported to
        ``on_failure`` and the others go on (``testbed.run.failures``)."""
        ...


class LocalEngine:
    """Lanes in this process: ``jobs`` topologies at once."""

    def __init__(self, runner: Runner, *, jobs: int = 1, host: HostLanes | None = None
                 ) -> None:
        self.runner = runner
        self.jobs = jobs
        self.per_template = jobs > 1
        self.host = host

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine": "local", "jobs": self.jobs}
        if self.host is not None:
            out["host_lanes"] = self.host.budget
        stores = getattr(self.runner, "describe_stores", None)
        if stores is not None:  # where the nodes' stores live (their file system)
            out["stores"] = stores()
        return out

    async def run(self, units: Sequence[WorkUnit], campaign: Campaign, *,
                  on_start: OnStart, on_outcome: OnOutcome,
                  on_failure: OnFailure | None = None) -> None:
        # one node zygote for every team of these lanes, if the runner starts teams
        share = getattr(self.runner, "one_zygote", None)
        async with share() if share is not None else contextlib.nullcontext():
            await self._run(units, campaign, on_start=on_start, on_outcome=on_outcome,
                            on_failure=on_failure)

    async def _run(self, units: Sequence[WorkUnit], campaign: Campaign, *,
                   on_start: OnStart, on_outcome: OnOutcome,
                   on_failure: OnFailure | None) -> None:
        queue = list(units) if self.jobs == 1 else [u for u in units if u.unshaped]

        async def lane() -> None:
            schedules = ScheduleCache(campaign)
            while queue:
                unit = queue.pop(0)
                batch = [unit]
                while unit.unshaped and queue and queue[0].unshaped:
                    batch.append(queue.pop(0))  # a stretch of unshaped units: one hold
                async with self._hold(loopback=unit.unshaped):
                    for each in batch:
                        await run_unit(each, self.runner, campaign, on_start=on_start,
                                       on_outcome=on_outcome, schedules=schedules,
                                       on_failure=on_failure)

        await lane()  # one lane: everything in campaign order; else loopback first, alone
        if self.jobs == 1:
            return
        queue[:] = [u for u in units if not u.unshaped]
        await run_lanes(lane, min(self.jobs, len(queue)))

    @contextlib.asynccontextmanager
    async def _hold(self, *, loopback: bool) -> AsyncIterator[None]:
        """The host's loopback exclusivity or one of its lanes, if a budget is given."""
        if self.host is None:
            yield
            return
        async with self.host.exclusive() if loopback else self.host.lane():
            yield


async def run_lanes(lane: Callable[[], Any], count: int) -> None:
    """Run ``count`` lanes in one nursery; a failure in one stops all of them (their
    episodes stay "started" and run again on --resume). A single failure is re-raised
    as itself, not as an exception group, so callers see the same errors as with one
    lane."""
    if count <= 0:
        return
    if count == 1:
        await lane()
        return
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(lane)
    except BaseExceptionGroup as group:
        leaves = [e for e in _leaves(group) if not isinstance(e, trio.Cancelled)]
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out
