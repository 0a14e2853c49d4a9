"""The per-episode spread of earlier runs: measured from run directories, stored as data,
and read back by ``testbed check`` to size a campaign before it runs.

Rules this module obeys:

1. A *comparison* is policy ``a`` against policy ``b`` in one configuration: every
   stratum column equal but the policy (``paired`` in ``stats.py``), paired by template,
   stall per action, the two-stage bootstrap of the reports (:func:`comparisons`).
2. A spread row (:class:`SpreadRow`) is measured per (network, connection, rho, a, b)
   from one run: its paired templates ``n0``, repeats ``r0``, the resolution ``h0`` the
   report printed, the resolution curve fitted over nested prefixes of its templates
   (:func:`resolution_curve`; ``testbed/report/sizing.py`` rule 1) and ``s0``, the SD
   over templates of ``log(a / b)``. Across all the
   runs given, attempts of the same cell with the same schedule (repeats, reruns, and
   the same episodes in other runs) give the rerun noise ``e`` (pooled SD of one
   attempt's log stall around its group's mean; disturbed attempts left out) per
   (network, connection, rho). ``testbed/report/sizing.py`` turns a row into the
   expected resolution at any size.
3. The table is JSON (``spread.json`` beside this module, shipped with the package):
   ``testbed spread DIR... --write`` merges new measurements into it, a row replacing
   the row of the same key only; rows say which runs they came from.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from testbed.campaign.workload import round_robin_templates
from testbed.report import SPREAD_TABLE as SPREAD_TABLE  # the shipped table, re-exported
from testbed.report.load import Run, load_run
from testbed.report.sizing import Curve, fit_curve, repeat_scale
from testbed.report.stats import DEFAULT_DRAWS, Comparison, compare, cost_episodes, paired
from testbed.results.schema import STRATUM_COLUMNS

METRIC = "stall_ms_per_action"
MIN_PAIRS = 9
MAX_RESOLUTION = 1.0


@dataclass(frozen=True)
class SpreadRow:
    """One measured comparison's spread (rule 2)."""

    network: str
    connection: str
    rho: float
    a: str
    b: str
    templates: int
    repeats: int
    resolution: float
    floor: float
    term: float
    pair_log_sd: float
    rerun_log_sd: float | None
    rerun_groups: int
    source: str

    @property
    def key(self) -> str:
        return f"{self.network}/{self.connection}/rho={self.rho:g}/{self.a}:{self.b}"

    @property
    def curve(self) -> Curve:
        return Curve(self.floor, self.term)

    def scale(self, repeats: int) -> float:
        return repeat_scale(self.pair_log_sd, self.rerun_log_sd, self.repeats, repeats)

    def expected(self, templates: int, repeats: int) -> float:
        return self.curve.at(templates, self.scale(repeats))

    def describe(self) -> str:
        noise = ("rerun noise not measured" if self.rerun_log_sd is None else
                 f"rerun SD {100 * self.rerun_log_sd:.1f}% ({self.rerun_groups} groups)")
        return (f"{self.key}: ±{100 * self.resolution:.1f}% at {self.templates} templates x "
                f"{self.repeats} repeats (fitted floor ±{100 * self.floor:.1f}%, "
                f"±{100 * self.term:.0f}%/sqrt(templates) above it), template SD of log ratio "
                f"{100 * self.pair_log_sd:.1f}%, {noise} [{self.source}]")


def config_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in STRATUM_COLUMNS if c in frame.columns and c != "policy"]


def comparisons(run: Run, a: str, b: str, *, draws: int = DEFAULT_DRAWS, seed: int = 0
                ) -> list[tuple[dict[str, Any], Comparison, pd.DataFrame]]:
    """Rule 1 in every configuration of ``run`` that has both policies: (the
    configuration's columns, the comparison, its pairs)."""
    episodes = cost_episodes(run.episodes)
    columns = config_columns(episodes)
    out = []
    for values, part in episodes.groupby(columns, dropna=False, sort=True):
        if not {a, b} <= set(part["policy"]):
            continue
        pairs = paired(part, vary="policy", a=a, b=b, metric=METRIC,
                       strata=list(STRATUM_COLUMNS))
        result = compare(pairs, draws=draws, seed=seed)
        if result is not None:
            config = dict(zip(columns, values if isinstance(values, tuple) else (values,),
                              strict=True))
            out.append((config, result, pairs))
    return out


TEMPLATE_ORDER = {t: i for i, t in enumerate(round_robin_templates(30))}


def resolution_curve(pairs: pd.DataFrame, *, draws: int = 2_000, seed: int = 0
                     ) -> tuple[Curve | None, list[tuple[int, float]]]:
    """Resolutions over nested prefixes of the pairs' templates (campaign round-robin
    order, every third size from 6) and the curve fitted to them (sizing rule 1)."""
    order = sorted(pairs["template"].unique(), key=lambda t: TEMPLATE_ORDER.get(t, 99))
    sizes = sorted({*range(6, len(order), 3), len(order)})
    points = []
    for n in sizes:
        part = pairs[pairs["template"].isin(order[:n])]
        result = compare(part, draws=draws, seed=seed)
        if result is not None and np.isfinite(result.resolution):
            points.append((n, result.resolution))
    return fit_curve(points), points


def _log_sd(values: Iterable[float]) -> float:
    array = np.asarray(list(values), dtype=float)
    array = array[np.isfinite(array)]
    return float(np.std(array, ddof=1)) if array.size >= 2 else float("nan")


def rerun_noise(runs: Sequence[Run]) -> dict[tuple[str, str, float], tuple[float, int]]:
    """(network, connection, rho) -> (pooled SD of log stall within same-schedule
    groups, groups) from every attempt of every run (rule 2)."""
    frames = []
    for run in runs:
        attempts = run.attempts if run.attempts is not None else run.episodes
        part = cost_episodes(attempts)
        if "disturbed" in part:
            part = part[~part["disturbed"].astype(bool)]
        frames.append(part[["cell", "network", "connection", "rho", "schedule_digest",
                            METRIC]])
    if not frames:
        return {}
    data = pd.concat(frames, ignore_index=True)
    data = data[data[METRIC] > 0].assign(log=lambda f: np.log(f[METRIC].astype(float)))
    out: dict[tuple[str, str, float], tuple[float, int]] = {}
    for (network, connection, rho), part in data.groupby(["network", "connection", "rho"]):
        groups = part.groupby(["cell", "schedule_digest"])["log"]
        sizes = groups.transform("size")
        deviations = (part["log"] - groups.transform("mean"))[sizes >= 2]
        freedom = int((groups.size()[groups.size() >= 2] - 1).sum())
        if freedom >= 2:
            out[(str(network), str(connection), float(str(rho)))] = (
                math.sqrt(float((deviations ** 2).sum()) / freedom),
                int((groups.size() >= 2).sum()))
    return out


def measure_spread(paths: Sequence[Path], *, a: str = "planfence",
                   draws: int = DEFAULT_DRAWS) -> list[SpreadRow]:
    """Rule 2 over the runs in ``paths``: one row per (network, connection, rho, a, b),
    the run with the most paired templates winning."""
    runs = [load_run(Path(p)) for p in paths]
    noise = rerun_noise(runs)
    best: dict[str, SpreadRow] = {}
    for path, run in zip(paths, runs, strict=True):
        policies = sorted(set(run.episodes["policy"]) - {a})
        for b in policies:
            for config, result, pairs in comparisons(run, a, b, draws=draws):
                if result.pairs < MIN_PAIRS:
                    continue
                network, connection = str(config["network"]), str(config["connection"])
                rho = float(config["rho"])
                e, groups = noise.get((network, connection, rho), (None, 0))
                repeats = (int(run.episodes["repeats"].median())
                           if "repeats" in run.episodes and run.episodes["repeats"].notna().any()
                           else 1)
                if not (np.isfinite(result.resolution) and result.resolution <= MAX_RESOLUTION):
                    continue  # the other arm's stall is near zero: no sizing basis
                curve, _ = resolution_curve(pairs)
                if curve is None:
                    continue
                row = SpreadRow(network, connection, rho, a, b, result.pairs, repeats,
                                result.resolution, curve.floor, curve.term,
                                _log_sd(np.log(pairs["a"] / pairs["b"])), e, groups,
                                Path(path).name)
                if row.key not in best or row.templates > best[row.key].templates:
                    best[row.key] = row
    return sorted(best.values(), key=lambda r: r.key)


def read_spread_table(path: Path = SPREAD_TABLE) -> dict[str, SpreadRow]:
    """The stored table (rule 3); empty when there is none."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    rows = [SpreadRow(**row) for row in data.get("rows", [])]
    return {row.key: row for row in rows}


def write_spread_table(path: Path, table: dict[str, SpreadRow]) -> None:
    rows = [asdict(table[key]) for key in sorted(table)]
    path.write_text(json.dumps({"about": "per-episode spread of earlier runs "
                                         "(testbed/report/spread.py; `testbed spread`)",
                                "rows": rows}, indent=1) + "\n")


def lookup(table: dict[str, SpreadRow], network: str, connection: str, rho: float, a: str,
           b: str) -> tuple[SpreadRow | None, str]:
    """The row for a comparison, else the nearest measured one, with what differs."""
    exact = table.get(SpreadRow(network, connection, rho, a, b, 0, 1, 0, 0, 0, 0, None, 0,
                                "").key)
    if exact is not None:
        return exact, ""
    candidates = [r for r in table.values() if r.network == network and r.a == a]
    tiers: list[tuple[Callable[[SpreadRow], bool], str]] = [
        (lambda r: r.b == b and r.connection == connection, f"measured at rho != {rho:g}"),
        (lambda r: r.b == b, "measured with another connection setting"),
        (lambda r: r.connection == connection and r.rho == rho,
         "measured against another policy")]
    for match, note in tiers:
        found = [r for r in candidates if match(r)]
        if found:
            return max(found, key=lambda r: r.templates), note
    return None, "no earlier run on this network in the spread table"
