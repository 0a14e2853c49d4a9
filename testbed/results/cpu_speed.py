"""How fast this host runs the testbed's kind of work: recorded with every run session.

Loopback stall is a few milliseconds of the nodes' Python CPU time, so it scales with
the CPU the run got: the same revision and schedules measured PlanFence at 2.7
ms/action on one instance of the development VM and 5.1 on another (results/README.md,
"Reproducibility"). A manifest that says which CPU ran a session and how fast it ran a
fixed piece of Python lets a reader tell a slower machine from a changed protocol.

Rules:

1. ``cpu_model()`` is the kernel's name for the CPU (``model name`` of /proc/cpuinfo;
   ``platform.processor()`` elsewhere; "unknown" when neither says).
2. ``python_probe_ms()`` times a fixed, allocation-heavy pure-Python workload (dicts,
   strings, integers: what a node does between its system calls) a few times and keeps
   the fastest, which is the host's speed with the least of other work's interference;
   about 0.1 s in all on the development VM.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

PROBE_REPEATS = 5
_PROBE_ITEMS = 20_000


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (rule 1)."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _workload() -> int:
    table: dict[str, int] = {}
    for i in range(_PROBE_ITEMS):
        key = f"k{i % 512:03d}/{i}"
        table[key] = table.get(key, 0) + i * i
    return sum(len(k) for k in sorted(table)[: _PROBE_ITEMS // 4])


def python_probe_ms(repeats: int = PROBE_REPEATS) -> float:
    """Milliseconds of the fastest of ``repeats`` runs of the fixed workload (rule 2)."""
    if repeats < 1:
        raise ValueError(f"repeats: {repeats}; allowed: an integer >= 1")
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        _workload()
        best = min(best, time.perf_counter() - started)
    return round(best * 1000.0, 3)
