"""How long a team's node processes may take to start on this host: measured, not fixed.

Rules:

1. Starting a node is an interpreter start plus the node's imports, and both scale with
   the host: this machine takes about 0.4 s, the VM lane's TCG guest 5-10 s, and either
   far more while other work keeps the CPUs busy. A fixed limit (it was 30 s) is either
   too long for a dead node or too short for a slow host, so the limit is a multiple of
   a start measured here and now: ``measure_start_s`` times ``python -c "import
   nodes.node"`` in the environment the nodes get.
2. ``startup_timeout_s(probe_s, members, cpus)`` (pure): the members start at once and
   share the CPUs, so the probe is scaled by members / cpus (at least 1), multiplied
   by :data:`STARTUP_FACTOR`, and kept between :data:`STARTUP_FLOOR_S` and
   :data:`STARTUP_CAP_S`.
3. A measurement serves this process for :data:`MEASUREMENT_TTL_S`, and teams that
   start together wait for one probe (16 lanes once ran 11 probes at once, 4.9 s of
   CPU in the start-up burst); a team that failed to start drops it
   (:func:`forget_measurement`), so its retry is timed against the host as it is then.
4. The load can grow after the measurement (the suite beside other suites measured
   0.4 s, then its nodes took over 15 s). So the limit is where a node is *asked*
   whether it is still starting, not where it is failed: past it, a node whose CPU time
   grew within the last :data:`PROGRESS_WINDOW_S` and is below
   :data:`STARTUP_CPU_BUDGET_S` is starved by a busy host and waits on
   (:class:`StartupClock`), up to :data:`STARTUP_CAP_S`; a node that got no CPU for a
   whole window (blocked), burnt the budget (a loop) or reached the cap has failed.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

import trio

STARTUP_FACTOR = 5.0
STARTUP_FLOOR_S = 15.0
STARTUP_CAP_S = 600.0
MEASUREMENT_TTL_S = 300.0
PROBE_LIMIT_S = 120.0
PROBE_CODE = "import nodes.node"
STARTUP_CPU_BUDGET_S = 60.0  # a start needs 0.4 s of CPU here, about 10 s in a TCG guest
PROGRESS_WINDOW_S = 2.0

_measured: tuple[float, float] | None = None  # (probe seconds, when: monotonic)
_lock: tuple[trio.lowlevel.TrioToken, trio.Lock] | None = None


def startup_timeout_s(probe_s: float, members: int, cpus: int) -> float:
    """The startup limit of a team of ``members`` processes on ``cpus`` CPUs, from one
    measured interpreter start of ``probe_s`` seconds (rule 2)."""
    if not (probe_s >= 0 and math.isfinite(probe_s)):
        raise ValueError(f"probe_s: {probe_s!r}; allowed: a finite number >= 0")
    if members < 1 or cpus < 1:
        raise ValueError(f"members {members}, cpus {cpus}: both must be >= 1")
    scaled = STARTUP_FACTOR * probe_s * max(1.0, members / cpus)
    return min(STARTUP_CAP_S, max(STARTUP_FLOOR_S, scaled))


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except OSError:
        return max(1, os.cpu_count() or 1)


async def measure_start_s(env: Mapping[str, str]) -> float:
    """Seconds one interpreter takes to start and import the node code here, now (the
    cached value while it is fresh, rule 3). A probe that outlives PROBE_LIMIT_S counts
    as that long; one that fails still measured the start (the nodes' own start then
    shows the error)."""
    async with _probe_lock():  # the lanes of a run start their teams at once: one probe
        fresh = _fresh_measurement()
        return fresh if fresh is not None else await _probe(env)


def _fresh_measurement() -> float | None:
    if _measured is not None and time.monotonic() - _measured[1] < MEASUREMENT_TTL_S:
        return _measured[0]
    return None


def _probe_lock() -> trio.Lock:
    """One lock per trio run (a lock must not outlive the run that used it)."""
    global _lock
    token = trio.lowlevel.current_trio_token()
    if _lock is None or _lock[0] is not token:
        _lock = (token, trio.Lock())
    return _lock[1]


async def _probe(env: Mapping[str, str]) -> float:
    global _measured
    started = time.monotonic()
    with trio.move_on_after(PROBE_LIMIT_S):
        await trio.run_process([sys.executable, "-c", PROBE_CODE], env=dict(env),
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, check=False)
    probe_s = time.monotonic() - started
    _measured = (probe_s, time.monotonic())
    return probe_s


def forget_measurement() -> None:
    """A team failed to start: measure again before the next one (rule 3)."""
    global _measured
    _measured = None


def last_measurement_s() -> float | None:
    """The probe time in use (None before the first team), for messages."""
    return None if _measured is None else _measured[0]


class StartupClock:
    """Whether a starting node has had its time (rule 4). ``cpu_s`` reads the node's CPU
    seconds (None: gone); ``now`` is the monotonic clock (a parameter for tests)."""

    def __init__(self, limit_s: float, cpu_s: Callable[[], float | None], *,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = limit_s
        self._cpu_s = cpu_s
        self._now = now
        self.started = now()
        self.cpu_used_s: float | None = None
        self._mark: tuple[float, float] | None = None  # (when, cpu) at the window's start

    def waited_s(self) -> float:
        return self._now() - self.started

    def describe_cpu(self) -> str:
        used = self.cpu_used_s
        return "process gone" if used is None else f"{used:.2f} s of CPU used"

    def expired(self) -> bool:
        """True when the node has failed to start in time; call it now and then."""
        now = self._now()
        if now - self.started < self.limit_s:
            return False
        cpu = self._cpu_s()
        self.cpu_used_s = cpu
        if cpu is None or cpu >= STARTUP_CPU_BUDGET_S or now - self.started >= STARTUP_CAP_S:
            return True
        if self._mark is None:
            self._mark = (now, cpu)
            return False
        at, before = self._mark
        if now - at < PROGRESS_WINDOW_S:
            return False
        self._mark = (now, cpu)
        return cpu <= before  # no CPU in a whole window: blocked, not starved
