"""Disturbance of one episode: did something else on the host take the CPU from it?

Rules this module obeys:

1. Each node process measures its own scheduling delay over the episode's events, from
   the end of its setup (``testbed/run/prepare.py`` rule 5) to its last event
   (``nodes/sched_probe.py``: run-queue wait from schedstat, timer oversleep from a
   sampling thread); the controller asks for it once, after the last event (control op
   ``sched``, never on the action path). The controller reads the host's CPU
   accounting (``/proc/stat``: busy and steal shares of every CPU) before and after the
   episode and the 1-minute load average at its end.
2. The episode row gets :data:`DISTURBANCE_FIELDS`; units are in the names. The node
   columns are totals (run-queue wait, CPU time) or the worst node (oversleep).
3. The verdict (``disturbed``, ``disturbed_reason``) is ``testbed.results.verdict``'s:
   each raw measure bounds how far it can have moved the stall, through the sensitivity
   ``testbed bench disturbance`` measured, and an episode is flagged when a bound
   exceeds the run's resolution (docs/campaigns.md, "Disturbance").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.results.schema import DISTURBANCE_FIELDS
from testbed.results.verdict import (
    CALIBRATION_PATH,
    OVERSLEEP_P99_MS,
    RESOLUTION,
    STEAL_PCT,
    WAIT_SHARE,
    judge,
    write_calibration,
)

__all__ = ["CALIBRATION_PATH", "DISTURBANCE_FIELDS", "OVERSLEEP_P99_MS", "RESOLUTION",
           "STEAL_PCT", "WAIT_SHARE", "HostSample", "episode_disturbance", "judge",
           "write_calibration"]



@dataclass(frozen=True)
class HostSample:
    """Cumulative CPU accounting of the whole host (jiffies over every CPU)."""

    total: int
    idle: int
    steal: int

    @classmethod
    def read(cls, path: str = "/proc/stat") -> HostSample | None:
        try:
            with open(path) as f:
                fields = f.readline().split()
        except OSError:
            return None
        if not fields or fields[0] != "cpu":
            return None
        values = [int(v) for v in fields[1:9]] + [0] * max(0, 9 - len(fields))
        user, nice, system, idle, iowait, irq, softirq, steal = values[:8]
        total = user + nice + system + idle + iowait + irq + softirq + steal
        return cls(total=total, idle=idle + iowait, steal=steal)


def load_1m(path: str = "/proc/loadavg") -> float | None:
    try:
        return float(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def host_columns(before: HostSample | None, after: HostSample | None) -> dict[str, Any]:
    """Busy and steal shares of the host's CPUs between two samples, and the load."""
    busy = steal = None
    if before is not None and after is not None and after.total > before.total:
        span = after.total - before.total
        busy = 100.0 * (span - (after.idle - before.idle)) / span
        steal = 100.0 * (after.steal - before.steal) / span
    return {"host_busy_pct": busy, "host_steal_pct": steal, "host_load_1m": load_1m()}


def node_columns(replies: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The team's scheduling delay from every node's ``sched`` reply (rule 2)."""
    def worst(key: str) -> float | None:
        values = [float(r[key]) for r in replies.values() if r.get(key) is not None]
        return max(values) if values else None

    return {
        "node_runq_wait_ms": sum(float(r.get("runq_wait_ms") or 0.0) for r in replies.values()),
        "node_cpu_ms": sum(float(r.get("cpu_ms") or 0.0) for r in replies.values()),
        "node_oversleep_p99_ms": worst("oversleep_p99_ms"),
        "node_oversleep_max_ms": worst("oversleep_max_ms"),
    }


async def episode_disturbance(team: Any, before: HostSample | None, episode: Mapping[str, Any],
                              actions: int, *, shaped: bool = False) -> dict[str, Any]:
    """The disturbance columns of an episode that just ended (rules 1-3); ``team`` is
    a ``testbed.run.team.Team`` (its ``sched`` replies); ``shaped``: its network has
    emulated links (the verdict's sensitivity and the emulator's lateness)."""
    replies = dict(zip(team.members, await team.each_call("sched"), strict=True))
    columns = {**node_columns(replies), **host_columns(before, HostSample.read())}
    measures = {**columns, "emulator_late_max_ms": episode.get("emulator_late_max_ms")}
    disturbed, reason = judge(measures, stall_ms_per_action=episode.get("stall_ms_per_action"),
                              actions=actions, shaped=shaped)
    return {**columns, "disturbed": disturbed, "disturbed_reason": reason}
