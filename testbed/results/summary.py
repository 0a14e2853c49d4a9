"""The one-screen summary of a finished run: per cell, episodes, invalid/issued, medians."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

from testbed.campaign.model import fmt_number
from testbed.campaign.parse import recorded_campaign
from testbed.results.rundir import RunDir

_SUMMARY_ROWS = 40


def summary_frame(out_dir: Path) -> pd.DataFrame:
    """Per cell: episodes, aborted, invalid/issued, median stall and KiB per action."""
    episodes = pd.read_parquet(out_dir / "episodes.parquet")
    actions = pd.read_parquet(out_dir / "actions.parquet")
    done = episodes[~episodes["aborted"]]
    by = ["cell", "policy", "network", "rho", "keys", "agents", "deps", "connection"]
    if "disturbed" not in episodes:
        episodes = episodes.assign(disturbed=False)
    episodes = episodes.assign(disturbed=episodes["disturbed"].astype("boolean").fillna(False))
    frame = episodes.groupby(by, sort=False).agg(
        episodes=("episode", "nunique"), attempts=("episode", "size"),
        aborted=("aborted", "sum"), disturbed=("disturbed", "sum")).reset_index()
    medians = done.groupby("cell").agg(stall_ms=("stall_ms_per_action", "median"),
                                       kib=("kib_per_action", "median"))
    # A command workload's actions are the program's (ok or failed): count failed/actions.
    command = "ok" in actions and bool(actions["ok"].notna().any())
    released = actions if command else actions[actions["outcome"] == "released"]
    issued = released.groupby("cell").size().rename("issued")
    bad = ~released["ok"].astype(bool) if command else released["invalid"].astype(bool)
    invalid = bad.groupby(released["cell"]).sum().rename("invalid")
    frame = frame.join(medians, on="cell").join(issued, on="cell").join(invalid, on="cell")
    frame = frame.fillna({"issued": 0, "invalid": 0})
    frame["command"] = command
    frame = frame.join(episodes.groupby("cell").first().apply(_setting, axis=1)
                       .rename("setting"), on="cell")
    # Rows in the campaign file's order (shards come back in file-name order, which puts
    # rho 16 before rho 4); cells the manifest does not know go last, sorted.
    order = {cell_id: i for i, cell_id in enumerate(_manifest_cell_order(out_dir))}
    frame["_order"] = frame["cell"].map(order).fillna(len(order))
    frame = frame.sort_values(["_order", "policy", "network", "rho", "keys", "agents", "deps",
                               "connection"], kind="stable")
    return frame.drop(columns="_order").reset_index(drop=True)


def _manifest_cell_order(out_dir: Path) -> list[str]:
    try:
        config = RunDir(out_dir).read_manifest().get("config")
        if not isinstance(config, dict):
            return []
        return [c.id for c in recorded_campaign(config).cells()]
    except (OSError, ValueError):
        return []


#: Column (full header, short header): the short one on a narrow terminal, explained in
#: the legend under the table.
_HEADERS = {
    "policy": ("policy", "policy"), "network": ("network", "net"), "rho": ("rho", "rho"),
    "keys": ("keys", "keys"), "agents": ("agents", "N"), "deps": ("deps", "d"),
    "connection": ("conn", "conn"), "setting": ("setting", "setting"),
    "episodes": ("episodes", "ep"), "invalid": ("invalid/issued", "inv/iss"),
    "failed": ("failed/actions", "fail/act"), "stall_ms": ("stall ms/action", "stall"),
    "kib": ("KiB/action", "KiB"),
}
_MEANINGS = {
    "net": "network", "N": "agents", "d": "deps (inputs per action)", "ep": "episodes",
    "inv/iss": "invalid/issued actions", "fail/act": "failed/actions (the program's)",
    "stall": "median stall ms/action", "KiB": "median KiB/action",
}
#: Below this many columns the short headers are used.
_WIDE = 120
_SETTINGS = ("network", "rho", "keys", "agents", "deps", "connection", "setting")


def print_summary(out_dir: Path, console: Console) -> None:
    """One screen: median stall (ms/action) and traffic (KiB/action) per cell.

    To fit a terminal: settings every shown cell shares go on one line above the table,
    names wrap rather than being cut, and on a narrow terminal (< 120 columns) headers
    are abbreviated and explained in a legend line below.
    """
    frame = summary_frame(out_dir)
    shown = frame.head(_SUMMARY_ROWS)
    command = bool(frame["command"].any())
    values: dict[str, list[str]] = {
        "policy": [str(v) for v in shown["policy"]],
        "network": [str(v) for v in shown["network"]],
        "rho": [fmt_number(float(v)) for v in shown["rho"]],
        "keys": [str(v) for v in shown["keys"]],
        "agents": [str(v) for v in shown["agents"]],
        "deps": [str(v) for v in shown["deps"]],
        "connection": [str(v) for v in shown["connection"]],
        "setting": [str(v) for v in shown["setting"]],
        "episodes": [_episodes(row) for row in shown.to_dict("records")],
        "failed" if command else "invalid": [f"{int(i)}/{int(n)}" for i, n in
                                             zip(shown["invalid"], shown["issued"],
                                                 strict=True)],
        "stall_ms": [_num(v) for v in shown["stall_ms"]],
        "kib": [_num(v) for v in shown["kib"]],
    }
    if not any(values["setting"]):
        del values["setting"]
    shared = [c for c in _SETTINGS if c in values and len(shown) > 1
              and len(set(values[c])) == 1]
    short = console.width < _WIDE
    table = Table(title=f"{out_dir.name}: medians over templates and attempts (aborted ones "
                        "excluded; `testbed report` reads each episode's verdict attempts)")
    columns = [c for c in values if c not in shared]
    for column in columns:
        text = column in ("policy", "network", "setting", "episodes")
        table.add_column(_HEADERS[column][short], justify="left" if text else "right",
                         overflow="fold")  # wrap, never cut a name
    for i in range(len(shown)):
        table.add_row(*(values[c][i] for c in columns))
    if shared:
        console.print("every cell: " + ", ".join(f"{_HEADERS[c][0]} {values[c][0]}"
                                                 for c in shared), soft_wrap=False)
    console.print(table)
    used = [_HEADERS[c][1] for c in columns] if short else []
    legend = [f"{h}: {_MEANINGS[h]}" for h in used if h in _MEANINGS]
    if legend:
        console.print("; ".join(legend), highlight=False)
    if len(frame) > _SUMMARY_ROWS:
        console.print(f"... {len(frame) - _SUMMARY_ROWS} more cells in "
                      f"{out_dir / 'episodes.parquet'} (see `testbed report`)")


def _episodes(row: dict[Any, Any]) -> str:
    notes = [f"{row['attempts']} attempts"] if row["attempts"] != row["episodes"] else []
    notes += [f"{row['aborted']} aborted"] if row["aborted"] else []
    notes += [f"{row['disturbed']} disturbed"] if row["disturbed"] else []
    return f"{row['episodes']}" + (f" ({', '.join(notes)})" if notes else "")


def _setting(row: pd.Series) -> str:
    """A cell's batch and study settings in words ('' for a plain episode cell)."""
    parts = []
    if pd.notna(row.get("replan_delay_s")):
        parts.append(f"delay {fmt_number(float(row['replan_delay_s']))} s, "
                     f"{fmt_number(float(row['update_rate_per_s']))}/s {row['update_target']}")
    if isinstance(row.get("scenario"), str):
        parts.append(str(row["scenario"]))
    if row.get("executor_inputs") == "fresh":  # live: C.2's control arm
        parts.append("fresh before generation")
    if row.get("overlap") == "in_generation":  # live: appendix F's cohort
        parts.append("update in generation")
    if pd.notna(row.get("batch")) and int(row["batch"]) != 1:
        parts.append(f"batch {int(row['batch'])}")
    return "; ".join(parts)


def _num(value: Any) -> str:
    return "-" if value is None or pd.isna(value) else f"{float(value):.1f}"
