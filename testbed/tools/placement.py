"""CPU placement of a benchmark's two ends: both on one CPU, or each on its own.

A loopback round trip between two processes costs very different amounts depending on
where the scheduler puts them: on one CPU the sender hands over to the woken receiver
without an idle wake-up (0.013-0.022 ms for the raw echo here), on two CPUs every
message wakes an idle core (0.086 ms). Left to the scheduler the placement changes with
the host's load, so a ratio of two round trips measured at different moments compares
two placements. ``testbed bench rpc`` therefore pins both ends of the raw echo and of
the RPC pair to the same placement (``os.sched_setaffinity`` on every thread of each
process) and reports each ratio within one placement.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

PLACEMENTS = ("same_cpu", "cross_cpu")


def plan(placement: str, cpus: set[int] | None = None) -> tuple[int, int] | None:
    """(client CPU, server CPU) for ``placement`` among the CPUs this process may use;
    None when the host cannot give it (one CPU: no cross-CPU placement)."""
    allowed = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if placement == "same_cpu":
        return allowed[-1], allowed[-1]
    if placement == "cross_cpu":
        return (allowed[-2], allowed[-1]) if len(allowed) >= 2 else None
    raise ValueError(f"placement: {placement!r} not one of {', '.join(PLACEMENTS)}")


def _tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [pid]


def pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of PID to CPUS (a thread started later inherits its creator's)."""
    for tid in _tasks(pid):
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(tid, cpus)


def affinity(pid: int) -> list[int]:
    """The CPUs every thread of PID may run on (their union), read back from the kernel."""
    seen: set[int] = set()
    for tid in _tasks(pid):
        with contextlib.suppress(ProcessLookupError):
            seen |= os.sched_getaffinity(tid)
    return sorted(seen)


@contextlib.contextmanager
def pinned(pid: int, cpus: set[int]) -> Iterator[None]:
    """PID's threads on CPUS for the body, then back where each thread was."""
    before = {}
    for tid in _tasks(pid):
        with contextlib.suppress(ProcessLookupError):
            before[tid] = os.sched_getaffinity(tid)
    pin(pid, cpus)
    try:
        yield
    finally:
        for tid, mask in before.items():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, mask)
        for tid in set(_tasks(pid)) - set(before):  # started inside: the widest mask
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, set().union(*before.values()) or cpus)


def cpus_allowed_list(pid: int) -> str:
    """``Cpus_allowed_list`` of PID's main thread as /proc says it (for tests)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return ""
