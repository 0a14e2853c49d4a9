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
3. :func:`judge` is pure: an episode is ``disturbed`` when any of the thresholds below is
   crossed; ``disturbed_reason`` names each crossed one with its value. The thresholds
   and the measurements that justify them are in docs/campaigns.md ("Disturbance").

   * run-queue wait, when both hold: the team's nodes spent more than
     :data:`WAIT_SHARE` of their runnable time waiting for a CPU (``wait / (wait +
     cpu)``; a team's own contention on a quiet host stays well below it), and their
     wait per action exceeds :data:`RUNQ_SHARE` of the episode's stall per action. All
     nodes' wait per action bounds how much CPU contention can have added to the stall
     per action (stall is the time of sequential work at these nodes; the wait of other
     phases only makes the bound looser), so an undisturbed episode's stall is inflated
     by at most half the 10% tie band.
   * oversleep: the worst node's 99th percentile timer lateness above
     :data:`OVERSLEEP_P99_MS` (catches what run-queue wait cannot see: a virtual CPU
     that the hypervisor did not run).
   * steal: the host's CPUs lost more than :data:`STEAL_PCT` of their time to the
     hypervisor during the episode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.results.schema import DISTURBANCE_FIELDS

__all__ = ["DISTURBANCE_FIELDS", "HostSample", "episode_disturbance", "judge"]

#: Thresholds (docs/campaigns.md, "Disturbance", has the measurements behind them).
RUNQ_SHARE = 0.05
WAIT_SHARE = 0.10
OVERSLEEP_P99_MS = 20.0
STEAL_PCT = 5.0



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


def judge(columns: Mapping[str, Any], *, stall_ms_per_action: float | None,
          actions: int) -> tuple[bool, str]:
    """(disturbed, reason) from the disturbance columns (rule 3); pure."""
    reasons = []
    runq = _number(columns.get("node_runq_wait_ms"))
    cpu = _number(columns.get("node_cpu_ms")) or 0.0
    if runq is not None and actions > 0 and runq + cpu > 0:
        per_action = runq / actions
        limit = RUNQ_SHARE * (_number(stall_ms_per_action) or 0.0)
        share = runq / (runq + cpu)
        if share > WAIT_SHARE and per_action > limit:
            reasons.append(f"runq_wait {per_action:.2f} ms/action > {limit:.2f} "
                           f"({RUNQ_SHARE:.0%} of stall), {share:.0%} of runnable time "
                           f"> {WAIT_SHARE:.0%}")
    oversleep = _number(columns.get("node_oversleep_p99_ms"))
    if oversleep is not None and oversleep > OVERSLEEP_P99_MS:
        reasons.append(f"oversleep_p99 {oversleep:.1f} ms > {OVERSLEEP_P99_MS:g}")
    steal = _number(columns.get("host_steal_pct"))
    if steal is not None and steal > STEAL_PCT:
        reasons.append(f"steal {steal:.1f}% > {STEAL_PCT:g}%")
    return bool(reasons), "; ".join(reasons)


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


async def episode_disturbance(team: Any, before: HostSample | None, episode: Mapping[str, Any],
                              actions: int) -> dict[str, Any]:
    """The disturbance columns of an episode that just ended (rules 1-3); ``team`` is
    a ``testbed.run.team.Team`` (its ``sched`` replies)."""
    replies = dict(zip(team.members, await team.each_call("sched"), strict=True))
    columns = {**node_columns(replies), **host_columns(before, HostSample.read())}
    disturbed, reason = judge(columns, stall_ms_per_action=episode.get("stall_ms_per_action"),
                              actions=actions)
    return {**columns, "disturbed": disturbed, "disturbed_reason": reason}
