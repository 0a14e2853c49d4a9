"""The contract between the campaign loop and the episode runner.

``run_campaign`` (``testbed.run.loop``) calls ``runner.open_group(GroupKey, cells)``, an
async context manager yielding a :class:`Group` whose ``run_episode(cell, schedule)``
returns an :class:`EpisodeResult`: per action exactly ``RUNNER_ACTION_FIELDS``, per
episode ``RUNNER_EPISODE_FIELDS`` (``testbed.results.schema``). A failing node or a
timeout raises :class:`EpisodeAborted`; the loop records the abort and reopens the group.
Several groups may be live at once (lanes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from testbed.campaign.model import Cell, GroupKey
from testbed.campaign.workload import Schedule

#: The runner enforces options.episode_timeout_s itself; the loop cancels an episode
#: that outlives it by this much (a backstop against a runner that hangs).
BACKSTOP_GRACE_S = 30.0


class EpisodeAborted(Exception):
    """Raised by a runner when an episode cannot finish (node failure, timeout)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason



@dataclass(frozen=True)
class EpisodeResult:
    """Measurements of one finished episode.

    ``actions``: one dict per scheduled protected action with exactly the fields in
    ``testbed.results.schema.RUNNER_ACTION_FIELDS``. ``episode``: the fields in
    ``RUNNER_EPISODE_FIELDS`` (``wall_s`` and ``congestion_control`` may be
    left out). The campaign adds the cell, schedule and identity columns. ``decisions``:
    the role calls of a live workflow (``nodes.role_calls``), which the loop writes to
    the run directory's ``decisions/`` before it commits the episode. ``history``: the
    episode's history files (docs/history.md), name (a host, or a program's label) ->
    text, which the loop writes to the run directory's ``history/`` before it commits
    the episode.
    """

    actions: list[dict[str, Any]]
    episode: dict[str, Any]
    decisions: list[dict[str, Any]] = field(default_factory=list)
    history: dict[str, str] = field(default_factory=dict)


class Group(Protocol):
    """A live topology (and its node processes) shared by the cells of one group."""

    @property
    def backend(self) -> str:
        """Link backend in use: "userspace", "netem" or "none"."""
        ...

    @property
    def description(self) -> Mapping[str, Any]:
        """JSON-able description of the topology for the manifest."""
        ...

    async def run_episode(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        """Run one episode on fresh stores and counters; raise EpisodeAborted on failure."""
        ...


G = TypeVar("G", bound=Group)


class DelegatingGroup(Generic[G]):
    """A Group that forwards to another; wrappers (benchmarks, the fault suite, tests)
    subclass it and override ``run_episode`` only."""

    def __init__(self, group: G) -> None:
        self.group = group

    @property
    def backend(self) -> str:
        return self.group.backend

    @property
    def description(self) -> dict[str, Any]:
        return dict(self.group.description)

    async def run_episode(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        return await self.group.run_episode(cell, schedule)


class Runner(Protocol):
    def open_group(self, key: GroupKey, cells: Sequence[Cell]
                   ) -> AbstractAsyncContextManager[Group]:
        """Build the group's topology and processes; tear them down on exit."""
        ...


@dataclass(frozen=True)
class RunSummary:
    out_dir: Path
    episodes: int  # in the campaign
    skipped: int  # already complete when this run started (resume)
    ran: int
    aborted: int
    wall_s: float
    #: Unit failures that lost episodes or left host state (testbed.run.failures);
    #: starts that a retry overcame are in the manifest only.
    failures: tuple[Any, ...] = ()
    #: What the run could not remove at its end (recorded for `testbed clean`).
    left: tuple[str, ...] = ()
