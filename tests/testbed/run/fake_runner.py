"""An in-memory twin of the episode runner for tests of the campaign loop.

:class:`FakeRunner` derives plausible measurements from the schedule itself; it
exercises run-directory bookkeeping, resume, lanes and sharding, not the measurements
(the end-to-end test with real nodes is tests/testbed/run/test_end_to_end.py).
"""

from __future__ import annotations

import io
import os
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from rich.console import Console

from testbed.campaign.model import Campaign, Cell, GroupKey, episode_key
from testbed.campaign.workload import Schedule
from testbed.run.contract import EpisodeAborted, EpisodeResult
from testbed.run.loop import run_campaign

REPO = Path(__file__).resolve().parents[3]

SMALL: dict[str, Any] = {
    "name": "small", "seed": 11, "templates": 2,
    "grid": {"policy": ["planfence", "owner_head_freshness", "centralized_lineage"],
             "network": ["loopback", "fixed"], "rho": [1, 4], "agents": [3],
             "units": [16]},
}
UNSAFE = {"local_replica", "owner_head_freshness"}


class SimulatedCrash(BaseException):
    """Stands for the controller dying mid-episode (in-process variant): like a
    KeyboardInterrupt, no Exception, so no unit contains it (testbed.run.failures)."""


class FakeGroup:
    """In-memory twin of a live group: measurements derived from the schedule."""

    def __init__(self, runner: FakeRunner, key: GroupKey) -> None:
        self.runner = runner
        self.key = key
        self.templates: set[str] = set()

    @property
    def backend(self) -> str:
        return "none" if self.key.network == "loopback" else "userspace"

    @property
    def description(self) -> Mapping[str, Any]:
        return {"hosts": self.key.agents + self.key.central, "fake": True}

    async def run_episode(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        key = episode_key(cell, schedule.template)
        self.runner.calls.append(key)
        self.templates.add(schedule.template)
        await trio.sleep(0.001)
        if key in self.runner.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if key in self.runner.crash_at:
            raise SimulatedCrash(key)
        if key in self.runner.abort_at:
            raise EpisodeAborted("node a1 exited with status 1 during update")
        if key in self.runner.hang_at:
            await trio.sleep_forever()
        return self.runner.measure(cell, schedule)


class FakeRunner:
    """Implements the campaign's Runner protocol without processes or sockets."""

    def __init__(self, *, kill_at: Sequence[str] = (), crash_at: Sequence[str] = (),
                 abort_at: Sequence[str] = (), hang_at: Sequence[str] = (),
                 bad_rows: bool = False) -> None:
        self.kill_at, self.crash_at = set(kill_at), set(crash_at)
        self.abort_at, self.hang_at = set(abort_at), set(hang_at)
        self.bad_rows = bad_rows
        self.calls: list[str] = []
        self.opened: list[GroupKey] = []
        self.closed: list[GroupKey] = []
        self.open_now = 0
        self.max_open = 0
        self.loopback_open = 0
        self.max_open_with_loopback = 0
        self.templates_per_group: list[set[str]] = []

    @asynccontextmanager
    async def open_group(self, key: GroupKey, cells: Sequence[Cell]) -> AsyncIterator[FakeGroup]:
        assert all(c.group_key == key for c in cells)
        self.opened.append(key)
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        self.loopback_open += key.network == "loopback"
        if self.loopback_open:
            self.max_open_with_loopback = max(self.max_open_with_loopback, self.open_now)
        group = FakeGroup(self, key)
        self.templates_per_group.append(group.templates)
        try:
            await trio.sleep(0.01)  # building a topology takes time; lets lanes overlap
            yield group
        finally:
            self.open_now -= 1
            self.loopback_open -= key.network == "loopback"
            self.closed.append(key)

    def measure(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        plans = {p.action: p for p in schedule.plans()}
        rows = []
        for act in schedule.acts():
            changed = any(u.key in act.keys for u in schedule.updates()
                          if plans[act.action].unit < u.unit < act.unit)
            unsafe = cell.policy in UNSAFE
            row: dict[str, Any] = {
                "action": act.action, "outcome": "released", "invalid": unsafe and changed,
                "complete": not (unsafe and changed), "replans": int(changed and not unsafe),
                "stall_ms": 5.0 + 3.0 * int(changed), "bytes": 1024 * (1 + cell.deps),
                "connections": 1, "block_reason": None, "rpc_timeouts": 0}
            if self.bad_rows:
                del row["stall_ms"]
            rows.append(row)
        n = len(rows)
        episode = {"stall_ms_per_action": sum(r.get("stall_ms", 0) for r in rows) / n,
                   "stall_action_ms": sum(r.get("stall_ms", 0) for r in rows),
                   "stall_barrier_ms": 0.0, "stall_commit_ms": 0.0,
                   "kib_per_action": sum(r["bytes"] for r in rows) / 1024 / n,
                   "connections": n, "rpc_timeouts": 0,
                   "link_bytes": sum(r["bytes"] for r in rows) + 40 * n,
                   "congestion_control": "cubic"}
        return EpisodeResult(rows, episode)


def quiet() -> Console:
    return Console(file=io.StringIO(), width=160)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "campaign.toml"
    path.write_text(text)
    return path


async def run_small(campaign: Campaign, out: Path, runner: FakeRunner, *,
                    resume: bool = False, console: Console | None = None) -> Any:
    return await run_campaign(campaign, out, resume=resume, runner=runner,
                              console=console or quiet())
