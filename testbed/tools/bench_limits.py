"""``testbed bench limits``: what an honest campaign needs of each node limit.

Runs a preset's grid (default ``primary``: every policy; 5 agents, 8 keys, 64 units,
fresh connections; ``artifact`` has the largest records) on one network, ``templates``
templates per cell, with real node processes, and reads the nodes' high-water marks
after every episode (``counters``: ``peak_connections``, ``peak_peer_connections``,
``peak_frame_objects``, ``peak_install_records``, ``peak_install_bytes``,
``peak_pre_auth_bytes``, ``peak_answer_bytes``, ``peak_peer_answer_bytes``,
``peak_node_held_bytes``). The table
compares the largest value seen with the default of ``nodes.limits.Limits``
(docs/architecture.md, "Limits").
"""

from __future__ import annotations

import io
import tempfile
import tomllib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from nodes.limits import Limits
from protocols import wire
from testbed.campaign.model import Cell, GroupKey
from testbed.campaign.parse import PRESETS_PACKAGE, parse_campaign
from testbed.campaign.workload import Schedule
from testbed.errors import UserError
from testbed.run.contract import DelegatingGroup, EpisodeResult
from testbed.run.episode import EpisodeRunner, TeamGroup
from testbed.run.loop import run_campaign

PEAKS = {  # counter -> (limit it is bounded by, default)
    "peak_connections": ("max_connections", Limits().max_connections),
    "peak_peer_connections": ("max_connections_per_peer", Limits().max_connections_per_peer),
    "peak_frame_objects": ("MAX_OBJECTS (protocols.wire)", wire.MAX_OBJECTS),
    "peak_install_records": ("install_records_per_peer", Limits().install_records_per_peer),
    "peak_install_bytes": ("install_bytes_per_peer", Limits().install_bytes_per_peer),
    "peak_pre_auth_bytes": ("pre_auth_bytes_per_source", Limits().pre_auth_bytes_per_source),
    "peak_answer_bytes": ("answer_bytes_per_connection",
                          Limits().answer_bytes_per_connection),
    "peak_peer_answer_bytes": ("answer_bytes_per_peer", Limits().answer_bytes_per_peer),
    "peak_node_held_bytes": ("held_bytes_per_node", Limits().held_bytes_per_node),
}


class _Peaks:
    def __init__(self) -> None:
        self.peak = dict.fromkeys(PEAKS, 0)
        self.where = dict.fromkeys(PEAKS, "")
        self.episodes = 0


class _Group(DelegatingGroup[TeamGroup]):
    def __init__(self, group: TeamGroup, peaks: _Peaks) -> None:
        super().__init__(group)
        self.peaks = peaks

    async def run_episode(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        result = await self.group.run_episode(cell, schedule)
        self.peaks.episodes += 1
        for counters in (await self.group.team.counters()).values():
            for name in PEAKS:
                if int(counters.get(name, 0)) > self.peaks.peak[name]:
                    self.peaks.peak[name] = int(counters[name])
                    self.peaks.where[name] = cell.policy
        return result


class _Runner:
    def __init__(self, inner: EpisodeRunner, peaks: _Peaks) -> None:
        self.inner = inner
        self.peaks = peaks

    @asynccontextmanager
    async def open_group(self, key: GroupKey, cells: Sequence[Cell]) -> AsyncIterator[_Group]:
        async with self.inner.open_group(key, cells) as group:
            yield _Group(group, self.peaks)


async def bench_limits(console: Console, *, network: str = "loopback",
                       templates: int = 1, policies: Sequence[str] = (),
                       preset: str = "primary") -> dict[str, Any]:
    path = resources.files(PRESETS_PACKAGE) / "presets" / f"{preset}.toml"
    if not path.is_file():
        raise UserError(f"--preset: {preset!r} is not a preset")
    raw = tomllib.loads(path.read_text())
    raw["name"] = f"limits-{preset}-{network}"
    raw["templates"] = templates
    raw["grid"]["network"] = [network]
    if policies:
        raw["grid"]["policy"] = list(policies)
    campaign = parse_campaign(raw, source="bench limits")
    peaks = _Peaks()
    with tempfile.TemporaryDirectory(prefix="pf-limits-") as tmp:
        await run_campaign(campaign, Path(tmp) / "out", resume=False,
                           runner=_Runner(EpisodeRunner(campaign), peaks),
                           console=Console(file=io.StringIO()))
    rows = {name: {"limit": limit, "default": default, "peak": peaks.peak[name],
                   "policy": peaks.where[name],
                   "headroom": round(default / peaks.peak[name], 1) if peaks.peak[name] else None}
            for name, (limit, default) in PEAKS.items()}
    result = {"preset": preset, "network": network, "templates": templates,
              "episodes": peaks.episodes,
              "policies": list(campaign.config()["grid"][0]["policy"]), "peaks": rows}
    table = Table(title=f"node limits vs {preset} on {network} ({peaks.episodes} episodes)")
    for h in ("counter", "limit", "default", "honest peak", "where", "headroom"):
        table.add_column(h)
    for name, row in rows.items():
        table.add_row(name, str(row["limit"]), str(row["default"]), str(row["peak"]),
                      str(row["policy"]), f"{row['headroom']}x" if row["headroom"] else "-")
    console.print(table)
    return result
