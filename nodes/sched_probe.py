"""A node's own scheduling delay: how long the kernel kept this process from running.

Rules this module obeys:

1. Two measures, both off the action path:

   * **run-queue wait**: the second field of ``/proc/self/task/<tid>/schedstat`` (ns the
     thread was runnable but waiting for a CPU), summed over the process's threads but
     the probe's own sampling thread, with the first field (CPU time) beside it. Read
     twice per episode (at ``reset`` and when the controller asks), never while an
     action runs.
   * **timer oversleep**: a daemon thread sleeps :data:`PERIOD_MS` with ``time.sleep``
     (holding no GIL while asleep) and records how late it woke, into a fixed histogram
     (:data:`BIN_MS` bins up to :data:`MAX_MS`, then one overflow bin). A wake costs a
     few microseconds of the GIL every period. The lateness includes waiting for the GIL
     while the node's own main thread runs Python (at most ``sys.getswitchinterval()``,
     5 ms), so it is read with thresholds above that (docs/campaigns.md, "Disturbance").

2. :meth:`SchedProbe.reset` starts a window; :meth:`SchedProbe.report` returns the
   window's totals and the oversleep quantiles. The sampling thread wakes only inside a
   window: ``report`` pauses it until the next ``reset`` (the controller reads a window
   once, at its end), and before the first ``reset`` it waits without waking. A wake
   costs about 80 us of CPU on this VM, so 80 nodes of 16 lanes sampling all the time
   took 0.3-0.4 of its two CPUs, most of it between episodes and while teams started
   (docs/benchmarks.md). Everything is plain integers guarded by one lock; nothing here
   allocates per sample.
3. ``PLANFENCE_SCHED_PERIOD_MS`` in the environment overrides the period (0 turns the
   oversleep thread off; the run-queue totals remain): the knob the overhead
   measurement in docs/benchmarks.md uses, not a campaign setting.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

PERIOD_MS = 20.0
BIN_MS = 0.1
MAX_MS = 200.0
_BINS = int(MAX_MS / BIN_MS) + 1  # the last bin holds everything above MAX_MS
ENV_PERIOD = "PLANFENCE_SCHED_PERIOD_MS"


def task_schedstats(pid: int | str = "self") -> dict[int, tuple[int, int]]:
    """(CPU ns, run-queue wait ns) of each thread of a process, by thread id (empty when
    the kernel has no schedstat, e.g. without CONFIG_SCHED_INFO)."""
    stats: dict[int, tuple[int, int]] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return stats
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text().split()
        except OSError:
            continue  # a thread that ended meanwhile
        if len(fields) >= 2:
            stats[int(task.name)] = (int(fields[0]), int(fields[1]))
    return stats


def read_schedstat(pid: int | str = "self", *,
                   exclude: frozenset[int] = frozenset()) -> tuple[int, int]:
    """(CPU ns, run-queue wait ns) summed over the threads of a process but EXCLUDE
    (the probe's own sampling thread: its wake-ups every period wait for a CPU on a
    busy host too, and that wait is the probe's, not the node's)."""
    stats = [v for tid, v in task_schedstats(pid).items() if tid not in exclude]
    return sum(c for c, _ in stats), sum(w for _, w in stats)


def period_from_env(default_ms: float = PERIOD_MS) -> float:
    raw = os.environ.get(ENV_PERIOD)
    if raw is None:
        return default_ms
    try:
        value = float(raw)
    except ValueError:
        return default_ms
    return max(0.0, value)


class SchedProbe:
    """Run-queue totals and timer oversleep of this process over a window (rules 1-2)."""

    def __init__(self, period_ms: float | None = None) -> None:
        self.period_ms = period_from_env() if period_ms is None else period_ms
        self._lock = threading.Lock()
        self._bins = [0] * _BINS
        self._samples = 0
        self._max_ns = 0
        self._base = read_schedstat()
        self._stop = threading.Event()
        self._armed = threading.Event()  # set inside a window (reset .. report)
        self._thread: threading.Thread | None = None
        self._own: frozenset[int] = frozenset()  # the sampling thread's id, once started

    def start(self) -> None:
        if self._thread is not None or self.period_ms <= 0:
            return
        self._thread = threading.Thread(target=self._sample, name="sched-probe", daemon=True)
        self._thread.start()
        if self._thread.native_id is not None:
            self._own = frozenset({self._thread.native_id})

    @property
    def sampler_tid(self) -> int | None:
        """The sampling thread's kernel thread id (None before start or when off)."""
        return next(iter(self._own), None)

    @property
    def samples(self) -> int:
        """Oversleep samples taken in the current window."""
        with self._lock:
            return self._samples

    @property
    def sampling(self) -> bool:
        """Whether the sampling thread is inside a window (between reset and report)."""
        return self._armed.is_set()

    def stop(self) -> None:
        self._stop.set()
        self._armed.set()  # wake a paused thread so that it sees the stop
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None

    def reset(self) -> None:
        with self._lock:
            self._bins = [0] * _BINS
            self._samples = 0
            self._max_ns = 0
            self._base = read_schedstat(exclude=self._own)
        self._armed.set()

    def _sample(self) -> None:
        period_s = self.period_ms / 1000.0
        bin_ns = int(BIN_MS * 1e6)
        while True:
            self._armed.wait()  # paused outside a window: no wakes at all
            if self._stop.is_set():
                return
            started = time.monotonic_ns()
            time.sleep(period_s)
            late_ns = max(0, time.monotonic_ns() - started - int(period_s * 1e9))
            index = min(late_ns // bin_ns, _BINS - 1)
            with self._lock:
                self._bins[index] += 1
                self._samples += 1
                if late_ns > self._max_ns:
                    self._max_ns = late_ns

    def _quantile_ms(self, q: float) -> float | None:
        if self._samples == 0:
            return None
        rank = q * self._samples
        seen = 0
        for index, count in enumerate(self._bins):
            seen += count
            if seen >= rank:
                return (index + 1) * BIN_MS  # the bin's upper edge
        return MAX_MS

    def report(self) -> dict[str, Any]:
        """The window: ``runq_wait_ms``, ``cpu_ms``, oversleep ``samples``,
        ``oversleep_p50_ms`` / ``p99`` (bin upper edges) and ``oversleep_max_ms``. Pauses
        the oversleep sampling until the next :meth:`reset` (rule 2); the run-queue
        totals keep counting from the window's start."""
        self._armed.clear()
        cpu, wait = read_schedstat(exclude=self._own)
        with self._lock:
            base_cpu, base_wait = self._base
            return {
                "runq_wait_ms": max(0, wait - base_wait) / 1e6,
                "cpu_ms": max(0, cpu - base_cpu) / 1e6,
                "samples": self._samples,
                "period_ms": self.period_ms,
                "oversleep_p50_ms": self._quantile_ms(0.50),
                "oversleep_p99_ms": self._quantile_ms(0.99),
                "oversleep_max_ms": self._max_ns / 1e6 if self._samples else None,
            }
