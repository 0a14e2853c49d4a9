"""The data of the learned-selector study (paper appendix D.10): examples, features,
targets and the split under shift. Pure functions over result frames.

Rules:

1. The candidates are the policies that keep the deterministic derivation check:
   centralized lineage, metadata sync (K = 1) and PlanFence.
2. An example is one workload configuration (a stratum: network, trace offset, rate,
   keys, agents, deps, units, connection, tier, batch) over ``example_templates``
   templates taken round-robin across families (so 3 covers each family once, 6 twice),
   where every candidate ran every one of those templates. A candidate's cost in an
   example is its mean stall per action and mean KiB per action over them.
3. A candidate is *eligible* in an example if none of its episodes aborted, none of its
   actions was invalid and every scheduled action completed. Among eligible candidates
   within ``NEAR_OPTIMAL`` (10%) of the lowest eligible stall, the target is the one
   with the least traffic (the paper's safe near-optimal choice). An example with no
   eligible candidate is dropped (there is nothing safe to learn).
4. Features are what a selector may know before an action: the workload dimensions
   and the network's static trace calibration (mean capacity each way, longest outage,
   propagation delay), never the network's name, the template, outcomes or trace
   events.
5. The split: out-of-distribution blocks hold out a network, the interpolated rates
   and the endpoint key counts, each alone and all three together (disjoint blocks);
   what none of them holds out is in distribution and is split into training and
   in-distribution test examples with a seeded shuffle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import pandas as pd

from testbed.links.netinfo import link_info
from testbed.links.profiles import get_profile

CANDIDATES = ("centralized_lineage", "metadata_sync", "planfence")
NEAR_OPTIMAL = 0.10
STRATUM = ("campaign", "network", "trace_offset_s", "rho", "keys", "agents", "deps",
           "units", "connection", "tier", "batch")
FEATURES = ("log2_rho", "log2_keys", "agents", "deps", "log2_units", "reused",
            "up_kbit_log10", "down_kbit_log10", "outage_s", "delay_ms")
UNLIMITED_KBIT = 10_000_000.0  # loopback: a capacity no trace reaches
INTERPOLATED_RHOS = (0.5, 2.0, 8.0)
ENDPOINT_KEYS = (8, 128)
BLOCKS = ("trace", "rates", "keys", "compound")


@cache
def trace_calibration(network: str) -> dict[str, float]:
    """Static calibration of a network's first agent link (rule 4)."""
    link = get_profile(network).link_of("a0", 0)
    if link is None:
        return {"up_kbit": UNLIMITED_KBIT, "down_kbit": UNLIMITED_KBIT, "outage_s": 0.0,
                "delay_ms": 0.0}
    info = link_info(link)
    return {"up_kbit": info.up.mean_kbit or UNLIMITED_KBIT,
            "down_kbit": info.down.mean_kbit or UNLIMITED_KBIT,
            "outage_s": float(max(info.up.longest_outage_s or 0.0,
                                  info.down.longest_outage_s or 0.0)),
            "delay_ms": float(info.delay_min_ms)}


def features(row: Any) -> dict[str, float]:
    """The selector's inputs for one configuration (rule 4)."""
    cal = trace_calibration(str(row["network"]))
    return {"log2_rho": math.log2(float(row["rho"])), "log2_keys": math.log2(float(row["keys"])),
            "agents": float(row["agents"]), "deps": float(row["deps"]),
            "log2_units": math.log2(float(row["units"])),
            "reused": float(str(row["connection"]) != "fresh"),
            "up_kbit_log10": math.log10(cal["up_kbit"]),
            "down_kbit_log10": math.log10(cal["down_kbit"]),
            "outage_s": cal["outage_s"], "delay_ms": cal["delay_ms"]}


def _template_order(templates: Sequence[str]) -> list[str]:
    """Round-robin across families: family-01 of each family, then -02, ..."""
    return sorted(templates, key=lambda t: (t.rsplit("-", 1)[-1], t))


def episode_outcomes(episodes: pd.DataFrame, actions: pd.DataFrame) -> pd.DataFrame:
    """Episodes of the candidates with their eligibility inputs (rule 3)."""
    eps = episodes[episodes["policy"].isin(CANDIDATES)].copy()
    acts = actions[actions["episode"].isin(eps["episode"])]
    per = acts.groupby("episode").agg(invalid=("invalid", "sum"),
                                      complete=("complete", "sum"))
    eps = eps.join(per, on="episode")
    eps[["invalid", "complete"]] = eps[["invalid", "complete"]].fillna(0)
    eps["safe"] = (~eps["aborted"].astype(bool)) & (eps["invalid"] == 0) \
        & (eps["complete"] >= eps["scheduled_actions"])
    return eps


def build_examples(outcomes: pd.DataFrame, *, example_templates: int = 3) -> pd.DataFrame:
    """One row per example: features, per-candidate stall/KiB/eligible, target (rules 2-4)."""
    rows: list[dict[str, object]] = []
    columns = [c for c in STRATUM if c in outcomes.columns]
    for key, part in outcomes.groupby(columns, sort=True, dropna=False):
        stratum = dict(zip(columns, key if isinstance(key, tuple) else (key,), strict=True))
        complete = [str(t) for t, g in part.groupby("template")
                    if set(g["policy"]) >= set(CANDIDATES)]
        order = _template_order(complete)
        for start in range(0, len(order) - example_templates + 1, example_templates):
            chosen = order[start:start + example_templates]
            mine = part[part["template"].isin(chosen)]
            row: dict[str, object] = {**stratum, "templates": ",".join(chosen),
                                      **features(stratum)}
            for policy in CANDIDATES:
                eps = mine[mine["policy"] == policy]
                row[f"stall_{policy}"] = float(eps["stall_ms_per_action"].mean())
                row[f"kib_{policy}"] = float(eps["kib_per_action"].mean())
                row[f"eligible_{policy}"] = bool(eps["safe"].all())
            target = safe_target(row)
            if target is not None:
                rows.append({**row, "target": target})
    return pd.DataFrame(rows)


def near_optimal(row: Any) -> list[str]:
    """The eligible candidates within NEAR_OPTIMAL of the lowest eligible stall."""
    eligible = [p for p in CANDIDATES if bool(row[f"eligible_{p}"])
                and not math.isnan(float(row[f"stall_{p}"]))]
    if not eligible:
        return []
    best = min(float(row[f"stall_{p}"]) for p in eligible)
    return [p for p in eligible
            if float(row[f"stall_{p}"]) <= best * (1 + NEAR_OPTIMAL)]


def safe_target(row: Any) -> str | None:
    """Rule 3's target, or None if no candidate is eligible."""
    near = near_optimal(row)
    if not near:
        return None
    return min(near, key=lambda p: (float(row[f"kib_{p}"]), p))


@dataclass(frozen=True)
class Split:
    train: pd.DataFrame
    in_distribution: pd.DataFrame
    blocks: dict[str, pd.DataFrame]  # out-of-distribution blocks by name (rule 5)


def split_examples(examples: pd.DataFrame, *, held_out_network: str = "verizon",
                   interpolated: Sequence[float] = INTERPOLATED_RHOS,
                   endpoint_keys: Sequence[int] = ENDPOINT_KEYS, test_share: float = 0.3,
                   seed: int = 20260101) -> Split:
    """Rule 5's split. Every example lands in at most one part."""
    net = examples["network"].astype(str) == held_out_network
    rate = examples["rho"].astype(float).isin([float(r) for r in interpolated])
    keys = examples["keys"].astype(int).isin([int(k) for k in endpoint_keys])
    masks = {"trace": net & ~rate & ~keys, "rates": ~net & rate & ~keys,
             "keys": ~net & ~rate & keys, "compound": net & rate & keys}
    pool = examples[~net & ~rate & ~keys]
    order = np.random.default_rng(seed).permutation(len(pool))
    n_test = round(len(pool) * test_share)
    return Split(train=pool.iloc[order[n_test:]], in_distribution=pool.iloc[order[:n_test]],
                 blocks={name: examples[mask] for name, mask in masks.items()})
