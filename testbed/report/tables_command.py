"""Tables and a figure for command workloads: your own program's metrics beside the links'.

Three tables, per network and policy (the program's variants) and, where the campaign
varies them, per setting of the other cell columns (rho, agents, ...):

- ``table_command``: episodes (aborted), actions the program reported, the share that
  were ok, stall per action (median and interquartile range over episodes of the
  episode's mean, and the 95th percentile over every action), KiB per action that the
  links carried (both directions' bytes over the uplinks);
- ``table_command_links``: what the links did in those episodes: bytes per host and
  direction (medians over episodes, from the link counters), queueing delay p50/p95,
  drops, and the emulator's lateness;
- ``table_command_metrics``: every numeric field the program reported besides the
  protocol's (``metrics`` of action rows, and ``episode`` events): median, p95, count.

``fig_command_stall`` draws the distribution (CDF) of every action's stall per network.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from testbed.report import naming, slicing
from testbed.report.figures import save
from testbed.report.load import Run
from testbed.report.stats import median_iqr
from testbed.report.table_common import Options, layout
from testbed.report.tabular import Cell, Table, fmt
from testbed.results.schema import STRATUM_COLUMNS

COMMAND_KIND = "command"
DIRECTIONS = ("up", "down")


def is_command_run(run: Run) -> bool:
    return bool(run.manifest.get("config", {}).get("kind") == COMMAND_KIND)


def varying(run: Run) -> list[str]:
    """Cell columns besides network and policy whose values differ in this run (rho,
    agents, ...): each of their combinations is a row of its own."""
    ep = run.episodes
    return [c for c in STRATUM_COLUMNS if c not in ("network", "policy", "backend")
            and c in ep and ep[c].nunique(dropna=True) > 1]


def _setting(part: pd.DataFrame, columns: list[str]) -> str:
    return ", ".join(f"{c} {slicing.number(part[c].iloc[0])}" for c in columns)


def _groups(run: Run) -> Iterable[tuple[str, str, pd.DataFrame, pd.DataFrame]]:
    """(network, policy and setting, episodes, actions) in report order."""
    ep, acts = run.episodes, run.actions
    columns = varying(run)
    for network in slicing.networks(ep):
        for policy in naming.ordered(ep.loc[ep["network"] == network, "policy"]):
            mine = ep[(ep["network"] == network) & (ep["policy"] == policy)]
            settings = (mine.groupby(columns, sort=True, dropna=False) if columns
                        else [((), mine)])
            for _, part in settings:
                label = policy + (f" ({_setting(part, columns)})" if columns else "")
                keys = set(part.loc[~part["aborted"], "episode"])
                yield network, label, part, acts[acts["episode"].isin(keys)]


def _q(values: pd.Series, q: float) -> float:
    clean = values.dropna().astype(float)
    return float(clean.quantile(q)) if len(clean) else math.nan


def _json(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return None


def _main_table(run: Run) -> Table:
    rows, records = [], []
    for network, policy, part, acts in _groups(run):
        done = part[~part["aborted"]]
        ok = acts["ok"].astype("boolean") if "ok" in acts else pd.Series(dtype="boolean")
        med, q1, q3 = median_iqr(done["stall_ms_per_action"].dropna().astype(float))
        p95 = _q(acts["stall_ms"], 0.95) if "stall_ms" in acts else math.nan
        kib = float(done["kib_per_action"].dropna().median()) if done["kib_per_action"] \
            .notna().any() else math.nan
        share = float(ok.mean()) if len(ok.dropna()) else math.nan
        rows.append([Cell(network), Cell(policy), Cell(f"{len(part)} ({int(part['aborted'].sum())})"),
                     Cell(str(len(acts))), Cell(fmt(100 * share, 1)),
                     Cell(f"{fmt(med)} [{fmt(q1)}, {fmt(q3)}]"), Cell(fmt(p95)),
                     Cell(fmt(kib, 2))])
        records.append({"network": network, "policy": policy, "episodes": len(part),
                        "aborted_episodes": int(part["aborted"].sum()), "actions": len(acts),
                        "ok_share": share, "stall_ms_median": med, "stall_ms_q1": q1,
                        "stall_ms_q3": q3, "stall_ms_p95_actions": p95, "kib_median": kib})
    return layout(run, run.episodes, records, name="table_command",
                  title="Your program: actions, ok share and stall per network",
                  header=["network", "policy", "episodes (aborted)", "actions", "ok %",
                          "stall ms/action median [IQR]", "stall p95 (actions)",
                          "KiB/action (links)"], rows=rows,
                  legend="Per network and policy (the program's variants). Stall: the "
                  "stall_ms the program reported per action; median and IQR over episodes "
                  "of the episode's mean, p95 over every action. KiB/action: bytes the "
                  "uplinks carried (every host) over the actions reported. Aborted "
                  "episodes are counted and excluded.")


def _host_bytes(done: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Median over episodes of each host's counters (link_host_bytes)."""
    per: dict[str, dict[str, list[float]]] = {}
    for value in done.get("link_host_bytes", pd.Series(dtype=object)):
        for host, counters in (_json(value) or {}).items():
            for key, number in counters.items():
                per.setdefault(host, {}).setdefault(key, []).append(float(number))
    return {h: {k: float(np.median(v)) for k, v in c.items()} for h, c in per.items()}


def _links_table(run: Run) -> Table:
    rows, records = [], []
    for network, policy, part, _ in _groups(run):
        done = part[~part["aborted"]]
        for host, c in _host_bytes(done).items():
            cells = [Cell(network), Cell(policy), Cell(host)]
            record: dict[str, object] = {"network": network, "policy": policy, "host": host}
            for side in DIRECTIONS:
                cells += [Cell(fmt(c.get(f"{side}_bytes", math.nan) / 1024, 1)),
                          Cell(fmt(c.get(f"{side}_packets", math.nan), 0)),
                          Cell(fmt(c.get(f"{side}_drops", math.nan), 0))]
                record.update({f"{side}_{k}": c.get(f"{side}_{k}") for k in
                               ("bytes", "packets", "drops")})
            rows.append(cells)
            records.append(record)
        link = {k: _q(done[k], 0.5) if k in done else math.nan for k in (
            "link_up_qdelay_p50_ms", "link_up_qdelay_p95_ms", "link_down_qdelay_p50_ms",
            "link_down_qdelay_p95_ms", "emulator_late_p99_ms")}
        rows.append([Cell(network), Cell(policy), Cell("(links)"),
                     Cell(f"qdelay {fmt(link['link_up_qdelay_p50_ms'])}/"
                          f"{fmt(link['link_up_qdelay_p95_ms'])} ms"), Cell(""), Cell(""),
                     Cell(f"qdelay {fmt(link['link_down_qdelay_p50_ms'])}/"
                          f"{fmt(link['link_down_qdelay_p95_ms'])} ms"), Cell(""),
                     Cell(f"late p99 {fmt(link['emulator_late_p99_ms'], 2)} ms")])
        records.append({"network": network, "policy": policy, "host": "(links)", **link})
    header = ["network", "policy", "host", "up KiB", "up packets", "up drops", "down KiB",
              "down packets", "down drops"]
    return layout(run, run.episodes, records, name="table_command_links",
                  title="What the links carried for your program (medians over episodes)",
                  header=header, rows=rows,
                  legend="Per host and direction, from the link counters between the trace "
                  "restart and the end of the episode (the uplink is host to network). "
                  "(links): queueing delay p50/p95 over every host of each direction and "
                  "the emulator's release lateness at p99 (its own health), medians over "
                  "episodes.")


def _numeric_fields(values: Iterable[Any]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for value in values:
        for key, number in (_json(value) or {}).items():
            if isinstance(number, int | float) and not isinstance(number, bool):
                out.setdefault(key, []).append(float(number))
    return out


def _metrics_table(run: Run) -> Table | None:
    rows, records = [], []
    for network, policy, part, acts in _groups(run):
        done = part[~part["aborted"]]
        fields = {f"action.{k}": v for k, v in
                  _numeric_fields(acts.get("metrics", pd.Series(dtype=object))).items()}
        for value in done.get("metrics", pd.Series(dtype=object)):
            for label, items in (_json(value) or {}).items():
                for key, number in _numeric_fields([json.dumps(items)]).items():
                    fields.setdefault(f"episode.{label}.{key}", []).extend(number)
        for name, values in sorted(fields.items()):
            array = np.asarray(values)
            med, p95 = float(np.median(array)), float(np.quantile(array, 0.95))
            rows.append([Cell(network), Cell(policy), Cell(name), Cell(fmt(med, 2)),
                         Cell(fmt(p95, 2)), Cell(str(len(array)))])
            records.append({"network": network, "policy": policy, "metric": name,
                            "median": med, "p95": p95, "count": len(array)})
    if not rows:
        return None
    return layout(run, run.episodes, records, name="table_command_metrics",
                  title="Your program's own metrics", header=["network", "policy", "metric",
                                                              "median", "p95", "n"],
                  rows=rows, legend="Numeric fields the program reported beyond the "
                  "protocol's: action.<field> over every action, episode.<program>.<field> "
                  "over episodes (aborted episodes excluded).")


def command_tables(run: Run, options: Options) -> list[Table]:
    """The tables of a command workload (module docstring); none for other kinds."""
    if not is_command_run(run):
        return []
    tables = [_main_table(run), _links_table(run)]
    metrics = _metrics_table(run)
    return tables + ([metrics] if metrics is not None else [])


def command_figures(run: Run, directory: Path) -> tuple[list[Path], list[str]]:
    """``fig_command_stall``: the CDF of every action's stall per network and policy."""
    acts = run.actions
    if "stall_ms" not in acts or acts["stall_ms"].isna().all():
        return [], ["command: no stall_ms reported, no stall figure"]
    figure = Figure(figsize=(7, 4), layout="constrained")
    ax = figure.subplots()
    for network, label, _, mine in _groups(run):
        values = np.sort(mine["stall_ms"].dropna().astype(float).to_numpy())
        if values.size:
            ax.step(values, np.arange(1, values.size + 1) / values.size, where="post",
                    label=f"{network} / {label} (n={values.size})")
    ax.set_xlabel("stall per action (ms, as the program reported it)")
    ax.set_ylabel("share of actions")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return save(figure, directory, "fig_command_stall"), []
