"""`testbed bench lanes`: how many AT&T episodes one host runs at once, at what fidelity.

The same set of AT&T episodes (two policies, reused connections, one unit per template)
runs with 1, 2, 4, 8 and 16 local lanes and on a dask LocalCluster of 1, 2 and 4
workers (one lane each). For each run: episodes per hour, machine CPU per episode (busy
CPU seconds of the whole host from /proc/stat, so run it on a quiet host; the
hypervisor's steal is apart, as a share of the host's CPU time), the
emulator's release lateness (episode p99s: median and max), and the paired stall ratio
against the one-lane run (median over the same episode keys, with the range). The
result ends with the projected wall time of the ``rates`` preset at 30 templates on one
host and on 8.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import trio
from rich.console import Console

from testbed.campaign.parse import load_campaign, parse_campaign
from testbed.results.provenance import SOURCE_ROOT
from testbed.run.episode import EpisodeRunner
from testbed.run.loop import run_campaign

LANES = (1, 2, 4, 8, 16)
WORKERS = (1, 2, 4)
POLICIES = ("planfence", "batched_all_key")
LATE_COLUMN = "emulator_late_p99_ms"


def bench_campaign(templates: int) -> dict[str, Any]:
    return {"name": "bench-lanes", "seed": 17, "templates": templates,
            "options": {"episode_timeout_s": 300},
            "grid": {"policy": list(POLICIES), "network": ["att"], "rho": [4], "keys": [8],
                     "agents": [5], "units": [24], "connection": ["reuse"]}}


def _cpu_s() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole host since boot. Busy is user + nice +
    system + irq + softirq: what ran here. Steal (time the hypervisor gave another
    guest) is apart: it is no work of ours, and counting it as busy once doubled the
    CPU per episode this benchmark reported (docs/benchmarks.md)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    ticks = [int(x) for x in fields] + [0] * (8 - len(fields))
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    tick_s = 1 / os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) * tick_s, steal * tick_s


async def _run(raw: dict[str, Any], out: Path, *, jobs: int = 1,
               cluster: str | None = None, shared: bool = True) -> dict[str, Any]:
    campaign = parse_campaign(raw, source="bench lanes")
    console = Console(file=io.StringIO(), width=160)
    cpu0, t0 = _cpu_s(), time.monotonic()
    if cluster is None:
        await run_campaign(campaign, out, resume=False, console=console, jobs=jobs,
                           runner=EpisodeRunner(campaign, shared_emulator=shared))
    else:
        from testbed.run.dask_engine import open_dask_engine

        async with open_dask_engine(cluster) as engine:
            await engine.survey(campaign)
            cpu0, t0 = _cpu_s(), time.monotonic()  # the cluster's start-up excluded
            await run_campaign(campaign, out, resume=False, console=console, engine=engine)
    wall_s, cpu1 = time.monotonic() - t0, _cpu_s()
    cpu_s, steal_s = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    episodes = pd.read_parquet(out / "episodes.parquet")
    done = episodes[~episodes["aborted"]]
    late = done[LATE_COLUMN].dropna() if LATE_COLUMN in done else pd.Series(dtype=float)
    return {"episodes": len(episodes), "aborted": int(episodes["aborted"].sum()),
            "wall_s": round(wall_s, 1),
            "episodes_per_hour": round(len(episodes) / wall_s * 3600, 1),
            "cpu_s_per_episode": round(cpu_s / max(len(episodes), 1), 2),
            "steal_pct": round(100 * steal_s / max(wall_s * (os.cpu_count() or 1), 1e-9), 1),
            "emulator_late_p99_ms_median": None if late.empty else round(late.median(), 3),
            "emulator_late_p99_ms_max": None if late.empty else round(late.max(), 3),
            "_stall": done.set_index("episode")["stall_ms_per_action"]}


def _paired(stall: pd.Series, reference: pd.Series) -> dict[str, Any]:
    both = pd.concat([stall, reference], axis=1, join="inner").dropna()
    if both.empty:
        return {"paired_stall_ratio_median": None}
    ratio = both.iloc[:, 0] / both.iloc[:, 1]
    return {"paired_stall_ratio_median": round(float(ratio.median()), 4),
            "paired_stall_ratio_min": round(float(ratio.min()), 4),
            "paired_stall_ratio_max": round(float(ratio.max()), 4), "paired": len(both)}


def _projection(speedup: float, lanes: int) -> dict[str, Any]:
    """Wall time of ``rates`` at 30 templates: its reference run's episode wall times
    (results/rates, 3 templates) scaled to 30 templates; loopback episodes run alone,
    emulated ones at the measured lane speedup, on one host and on 8."""
    rates = load_campaign("rates").with_templates(30)
    out: dict[str, Any] = {"rates_30_templates_episodes": len(rates.episodes()),
                           "lanes": lanes, "speedup_vs_one_lane": round(speedup, 2)}
    reference = SOURCE_ROOT / "results" / "rates" / "episodes.parquet"
    if not reference.is_file() or not speedup:
        return {**out, "one_host_hours": None, "eight_hosts_hours": None,
                "basis": "no reference run of rates in this checkout"}
    episodes = pd.read_parquet(reference)
    scale = 30 / episodes["template"].nunique()
    loopback = float(episodes.loc[episodes["network"] == "loopback", "wall_s"].sum()) * scale
    emulated = float(episodes.loc[episodes["network"] != "loopback", "wall_s"].sum()) * scale
    one_lane_h = (loopback + emulated) / 3600
    return {**out, "one_lane_hours": round(one_lane_h, 1),
            "one_host_hours": round((loopback + emulated / speedup) / 3600, 1),
            "eight_hosts_hours": round((loopback + emulated / speedup / 8) / 3600, 2),
            "basis": f"results/rates episode wall times x {scale:g}; loopback alone, the "
                     "emulated episodes at the measured speedup (units are independent, "
                     "so hosts add up)"}


async def bench_lanes(json_path: Path | None, console: Any, *,
                      lanes: Sequence[int] = LANES, workers: Sequence[int] = WORKERS,
                      templates: int | None = None, emulator: str = "shared",
                      ) -> dict[str, Any]:
    """``emulator``: ``shared`` (one emulator process for every lane, what `testbed run
    --jobs N` does) or ``per-lane`` (one per topology, as before lanes shared one)."""
    raw = bench_campaign(templates or max([*lanes, *workers]))
    result: dict[str, Any] = {"campaign": raw, "emulator": emulator, "local": {},
                              "cluster": {}}
    reference: pd.Series | None = None
    with tempfile.TemporaryDirectory(prefix="tb-bench-lanes-") as tmp:
        for count in sorted(set(lanes)):
            row = await _run(raw, Path(tmp) / f"lanes-{count}", jobs=count,
                             shared=emulator == "shared")
            stall = row.pop("_stall")
            if reference is None:
                reference = stall
            row.update(_paired(stall, reference))
            result["local"][str(count)] = row
            console.print(f"lanes {count:2d}: {row}")
        for count in sorted(set(workers)):
            row = await _run(raw, Path(tmp) / f"workers-{count}", cluster=f"local:{count}")
            stall = row.pop("_stall")
            assert reference is not None
            row.update(_paired(stall, reference))
            result["cluster"][str(count)] = row
            console.print(f"workers {count}: {row}")
    local = {int(k): r for k, r in result["local"].items() if r["aborted"] == 0}
    best = max(local, key=lambda k: local[k]["episodes_per_hour"], default=1)
    base = local.get(1, {}).get("episodes_per_hour")
    speedup = local[best]["episodes_per_hour"] / base if base and best in local else 0.0
    result["projection"] = _projection(speedup, best)
    result["command"] = ".venv/bin/testbed bench lanes --json FILE (as root)"
    if json_path is not None:
        await trio.Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
    console.print(result["projection"])
    return result
