"""``testbed bench episode``: PlanFence's stall per action and the runner's overhead.

Runs real campaigns (real node processes and sockets) into a scratch directory:
PlanFence on loopback with 5 agents, 8 keys, rho = 4, once with a new connection per
RPC and once with reused connections; reports the median over templates of the
per-episode stall per action, and the share of each episode's wall time spent in
per-episode setup (store reset, seeding, trace restart). As root it also runs the
same PlanFence cell over the AT&T profile, where setup is a smaller share (``loopback_only``
skips it: no emulator, seconds instead of minutes).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import trio
from rich.console import Console

from testbed.campaign.parse import parse_campaign
from testbed.run.episode import EpisodeRunner
from testbed.run.loop import run_campaign

TEMPLATES = 6


def _campaign(name: str, network: str, connections: list[str]) -> dict[str, Any]:
    return {"name": name, "seed": 7, "templates": TEMPLATES,
            "grid": {"policy": ["planfence"], "network": [network], "trace_offset_s": [0],
                     "rho": [4], "keys": [8], "agents": [5], "deps": [1],
                     "connection": connections, "tier": ["compact"], "units": [64]}}


async def _run(raw: dict[str, Any], scratch: Path, console: Console) -> tuple[pd.DataFrame,
                                                                          list[float]]:
    campaign = parse_campaign(raw, source="bench")
    runner = EpisodeRunner(campaign)
    out = scratch / campaign.name
    await run_campaign(campaign, out, resume=False, runner=runner, console=console)
    episodes = pd.read_parquet(out / "episodes.parquet")
    shares = [setup / wall for group in runner.groups for setup, wall in group.setup_times
              if wall > 0]
    return episodes, shares


async def bench_episode(json_path: Path | None, console: Console, *,
                        loopback_only: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {"templates": TEMPLATES, "policy": "planfence", "agents": 5,
                              "keys": 8, "rho": 4}
    with tempfile.TemporaryDirectory(prefix="tb-bench-episode-") as tmp:
        scratch = Path(tmp)
        episodes, shares = await _run(_campaign("bench-loopback", "loopback",
                                                ["fresh", "reuse"]), scratch, console)
        ok = episodes[~episodes["aborted"]]
        for connection in ("fresh", "reuse"):
            stall = ok[ok["connection"] == connection]["stall_ms_per_action"]
            kib = ok[ok["connection"] == connection]["kib_per_action"]
            result[f"loopback_{connection}_stall_p50_ms"] = float(stall.median())
            result[f"loopback_{connection}_kib_per_action"] = float(kib.median())
        result["loopback_setup_share_p50"] = statistics.median(shares) if shares else None
        result["loopback_episode_wall_s_p50"] = float(ok["wall_s"].median())
        if os.geteuid() == 0 and not loopback_only:
            episodes, shares = await _run(_campaign("bench-att", "att", ["fresh"]), scratch,
                                          console)
            ok = episodes[~episodes["aborted"]]
            result["att_fresh_stall_p50_ms"] = float(ok["stall_ms_per_action"].median())
            result["att_setup_share_p50"] = statistics.median(shares) if shares else None
            result["att_episode_wall_s_p50"] = float(ok["wall_s"].median())
    console.print(result)
    if json_path is not None:
        await trio.Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
    return result
