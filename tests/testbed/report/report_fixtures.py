"""Synthetic, schema-exact campaign results for the report tests.

The numbers come from a seeded model with a per-policy cost level, a per-template
effect shared by every policy (so schedules pair as in a real campaign) and noise.
They are not meant to resemble measurements; the tests recompute every table value
from these frames with plain pandas and compare.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

FAMILIES = ("reservation", "fulfillment", "deployment")
ACTIONS_AT_T64 = {0.25: 28, 1.0: 21, 4.0: 11, 16.0: 4}
UPDATES_AT_T64 = {0.25: 7, 1.0: 21, 4.0: 42, 16.0: 56}
GRID_DEFAULTS: dict[str, Any] = {
    "policy": ["planfence"],
    "network": ["att"],
    "trace_offset_s": [0.0],
    "connection": ["fresh"],
    "agents": [5],
    "keys": [8],
    "deps": [1],
    "rho": [4.0],
    "tier": ["compact"],
    "units": [64],
}
ABORTED_STALL_MS = 1.0e6  # written into aborted episodes so a test sees any leak into medians

_STALL_BASE_MS = {
    "local_replica": 0.0,
    "owner_head_freshness": 150.0,
    "centralized_lineage": 480.0,
    "per_key_all_key": 280.0,
    "batched_all_key": 255.0,
    "all_replica": 340.0,
    "majority_replica": 1000.0,
    "planfence": 225.0,
    "planfence_grouped": 220.0,
    "adaptive": 230.0,
}
_KIB_BASE = {
    "local_replica": 3.8,
    "owner_head_freshness": 7.1,
    "centralized_lineage": 15.6,
    "per_key_all_key": 19.2,
    "batched_all_key": 16.4,
    "all_replica": 56.0,
    "majority_replica": 220.0,
    "planfence": 8.1,
    "planfence_grouped": 8.0,
    "adaptive": 9.0,
}
_NETWORK_FACTOR = {"loopback": 0.3, "fixed": 0.6, "att": 1.0, "tmobile": 0.8}  # others: 1


@dataclass(frozen=True)
class SyntheticRun:
    manifest: dict[str, Any]
    actions: pd.DataFrame
    episodes: pd.DataFrame
    aborted: list[tuple[str, str]] = field(default_factory=list)

    def write(self, path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        (path / "manifest.json").write_text(json.dumps(self.manifest, indent=2))
        self.actions.to_parquet(path / "actions.parquet", index=False)
        self.episodes.to_parquet(path / "episodes.parquet", index=False)
        return path


def _k(policy: str) -> int | None:
    if policy == "metadata_sync":
        return 1
    head, _, tail = policy.partition("/")
    return int(tail) if head == "metadata_sync" and tail.isdigit() else None


def _actions_for(rho: float, units: int) -> int:
    base = ACTIONS_AT_T64.get(float(rho), max(1, round(44 / max(rho, 0.25))))
    return max(1, round(base * units / 64))


def _levels(cell: Mapping[str, Any]) -> tuple[float, float]:
    """Median stall (ms/action) and traffic (KiB/action) of a cell before template effects."""
    policy, rho, keys = cell["policy"], float(cell["rho"]), int(cell["keys"])
    deps, agents = int(cell["deps"]), int(cell["agents"])
    k = _k(policy)
    if k is not None:
        stall = 100.0 * rho**0.8 * (agents / 5) / k**0.7
        kib = 5.0 + 4.5 * rho / k**0.3 * (agents / 5)
    else:
        stall = _STALL_BASE_MS.get(policy, 300.0)
        kib = _KIB_BASE.get(policy, 12.0)
        if policy == "centralized_lineage":
            stall *= (rho / 4) ** 0.35
        if policy in ("batched_all_key", "per_key_all_key"):
            stall += 1.5 * (keys - 8)
            kib += 0.54 * (keys - 8)
        if policy.startswith("planfence"):
            stall *= 1 + 0.12 * (deps - 1)
            kib += 3.6 * (deps - 1)
    stall *= _NETWORK_FACTOR.get(cell["network"], 1.0) * (1 + 0.02 * float(cell["trace_offset_s"]))
    if cell["connection"] == "reuse":
        stall *= 0.85
    return stall, kib


def make_campaign(
    name: str,
    grids: Iterable[Mapping[str, Sequence[Any]]],
    *,
    templates_per_family: int = 3,
    seed: int = 0,
    aborts: Iterable[tuple[str, str]] = (),
    backend: str = "userspace",
) -> SyntheticRun:
    """Results of a campaign over the union of ``grids`` (each a partial [grid] table).

    ``aborts`` lists (policy, template) pairs whose episodes abort half-way.
    """
    grids = [dict(g) for g in grids]
    rng = np.random.default_rng(seed)
    abort_set = set(aborts)
    templates = [(f, f"{f}-{i:02d}") for f in FAMILIES for i in range(templates_per_family)]
    effect = {t: float(rng.lognormal(0.0, 0.15)) for _, t in templates}
    cells: list[dict[str, Any]] = []
    for grid in grids:
        full = {**GRID_DEFAULTS, **grid}
        names = list(full)
        for values in itertools.product(*(full[n] for n in names)):
            cell = dict(zip(names, values, strict=True))
            if cell not in cells:
                cells.append(cell)
    action_rows: list[dict[str, Any]] = []
    episode_rows: list[dict[str, Any]] = []
    episode_id = 0
    for index, cell in enumerate(cells):
        cell_id = f"c{index:04d}"
        stall_level, kib_level = _levels(cell)
        k = _k(cell["policy"])
        n_actions = _actions_for(cell["rho"], cell["units"])
        for family, template in templates:
            aborted = (cell["policy"], template) in abort_set
            recorded = n_actions // 2 if aborted else n_actions
            digest = f"{cell['agents']}-{cell['keys']}-{cell['deps']}-{cell['rho']}-" \
                f"{cell['units']}-{template}"
            # as the runner does: loopback needs no link backend
            cell_backend = "none" if cell["network"] == "loopback" else backend
            common = {"campaign": name, "cell": cell_id, "backend": cell_backend, **cell,
                      "episode": f"e{episode_id:05d}", "family": family, "template": template,
                      "schedule_digest": digest}
            stall = stall_level * effect[template] * float(rng.lognormal(0.0, 0.05))
            kib = kib_level * float(rng.lognormal(0.0, 0.01))
            for a in range(recorded):
                blocked = not aborted and cell["policy"] == "per_key_all_key" and a == 0 and \
                    template.endswith("-00")
                if cell["policy"] in ("local_replica", "owner_head_freshness"):
                    invalid = True
                elif k is not None and k > 1:
                    invalid = bool(rng.random() < 1 - 1 / k)
                else:
                    invalid = False
                action_rows.append({
                    **{c: common[c] for c in common if c != "units"},
                    "action": f"a{a:03d}", "outcome": "blocked" if blocked else "released",
                    "invalid": invalid and not blocked, "complete": not blocked and not invalid,
                    "replans": int(rng.integers(0, 2)),
                    "stall_ms": stall * float(rng.lognormal(0.0, 0.1)),
                    "bytes": int(kib * 1024), "connections": int(rng.integers(1, 6)),
                    "units": cell["units"], "block_reason": "timeout" if blocked else "",
                })
            conns = int(rng.integers(200, 400)) if cell["connection"] == "fresh" else \
                int(rng.integers(10, 30))
            episode_rows.append({
                **common,
                "attempted_actions": recorded,
                "updates": UPDATES_AT_T64.get(float(cell["rho"]), 10),
                "aborted": aborted,
                "abort_reason": "owner update timed out" if aborted else "",
                "stall_ms_per_action": ABORTED_STALL_MS if aborted else stall,
                "kib_per_action": ABORTED_STALL_MS if aborted else kib,
                "connections": conns,
                "link_bytes": int(kib * 1024 * recorded * 1.1),
                "wall_s": 30.0 + float(rng.random()),
                "stall_action_ms": stall * 0.8 * recorded,
                "stall_barrier_ms": stall * 0.2 * recorded,
                "stall_commit_ms": 0.0,
                "scheduled_actions": n_actions,
            })
            episode_id += 1
    manifest = {"campaign": name, "config": {"name": name, "seed": seed,
                                              "grids": grids},
                "backend": backend, "git_revision": "0000000"}
    actions = pd.DataFrame(action_rows)
    episodes = pd.DataFrame(episode_rows)
    return SyntheticRun(manifest, actions, episodes, sorted(abort_set))
