"""``testbed bench sim``: wall time and memory of one simulated episode per team size.

For each team size N (default 5, 100, 1,000 and 10,000 agents) one episode of one cell
(default PlanFence on AT&T, rho 4, 8 keys, one declared key per action: sparse
dependencies) runs in this process, twice over:

1. timed: from building the episode (nodes, stores, links) to its result, wall and CPU
   seconds, and the virtual seconds it simulated;
2. measured: the episode built and set up (every key seeded) again, and the Python
   objects that holds (tracemalloc);
3. the process's peak resident size after both (it also holds SQLite's own
   allocations, which tracemalloc does not see, and everything the episode's run
   allocated).

Per member: the growth of each figure beyond the first size's, divided by the members
added (the traces' schedules and the imports are a fixed cost). Sizes run in the order
given (ascending, for the peak to mean anything), each after the last is freed.
"""

from __future__ import annotations

import gc
import os
import resource
import time
import tracemalloc
from collections.abc import Sequence
from typing import Any

from testbed.campaign.model import Campaign, Cell
from testbed.campaign.parse import parse_campaign
from testbed.sim.calibration import Calibration
from testbed.sim.episode import SimEpisode, run_sim_episode

SIZES = (5, 100, 1000, 10_000)


def _cell(agents: int, policy: str, network: str, connection: str, seed: int
          ) -> tuple[Campaign, Cell, bool]:
    campaign = parse_campaign({
        "name": "bench-sim", "seed": seed, "templates": 1, "options": {"backend": "sim"},
        "grid": {"policy": [policy], "network": [network], "agents": [agents],
                 "connection": [connection]}})
    ((key, cells),) = campaign.groups()
    return campaign, cells[0], key.central


def bench_one(agents: int, calibration: Calibration, *, policy: str = "planfence",
              network: str = "att", connection: str = "fresh", seed: int = 1
              ) -> dict[str, Any]:
    """One size's figures (module rules 1 and 2)."""
    campaign, cell, central = _cell(agents, policy, network, connection, seed)
    schedule = campaign.schedule(cell, campaign.templates[0])
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    result = run_sim_episode(campaign, cell, schedule, central=central,
                             calibration=calibration)
    wall_s, cpu_s = time.perf_counter() - wall, time.process_time() - cpu
    virtual_s = float(result.episode["wall_s"])
    stall_ms = float(result.episode["stall_ms_per_action"])
    del result
    gc.collect()
    tracemalloc.start()
    try:
        sim = SimEpisode(campaign, cell, schedule, central=central, calibration=calibration)
        sim.loop.run(sim.setup(schedule, cell.connection))
        traced, _ = tracemalloc.get_traced_memory()
        members = len(sim.members)
        sim.close()
        del sim
    finally:
        tracemalloc.stop()
        gc.collect()
    return {
        "agents": agents, "members": members, "policy": policy, "network": network,
        "connection": connection, "actions": schedule.counts.actions,
        "updates": schedule.counts.updates, "wall_s": round(wall_s, 3),
        "cpu_s": round(cpu_s, 3), "virtual_s": virtual_s,
        "stall_ms_per_action": round(stall_ms, 1),
        "episodes_per_s": round(1 / wall_s, 3) if wall_s > 0 else None,
        "python_bytes": traced,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def bench_sim(calibration: Calibration, *, sizes: Sequence[int] = SIZES,
              policy: str = "planfence", network: str = "att", connection: str = "fresh",
              seed: int = 1) -> dict[str, Any]:
    """Every size in order (module docstring)."""
    rows = [bench_one(n, calibration, policy=policy, network=network,
                      connection=connection, seed=seed) for n in sizes]
    for row in rows[1:]:  # what one more member holds, the fixed part (traces) taken out
        extra = row["members"] - rows[0]["members"]
        if extra > 0:
            row["python_bytes_per_member"] = (row["python_bytes"] - rows[0]["python_bytes"]) // extra
            row["peak_rss_bytes_per_member"] = (row["peak_rss_bytes"]
                                                - rows[0]["peak_rss_bytes"]) // extra
    return {"bench": "sim", "calibration": calibration.id, "host_cpus": os.cpu_count(),
            "load_1min": round(os.getloadavg()[0], 2), "rows": rows}
