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


def print_summary(out_dir: Path, console: Console) -> None:
    """One screen: median stall (ms/action) and traffic (KiB/action) per cell."""
    frame = summary_frame(out_dir)
    table = Table(title=f"{out_dir.name}: medians over templates and attempts (aborted ones "
                        "excluded; `testbed report` reads each episode's verdict attempts)")
    studies = bool(frame["setting"].astype(bool).any())
    for column in ("policy", "network", "rho", "keys", "agents", "deps", "conn",
                   *(("setting",) if studies else ()), "episodes",
                   "failed/actions" if bool(frame["command"].any()) else "invalid/issued",
                   "stall ms/action", "KiB/action"):
        table.add_column(column, justify="left" if column in ("policy", "network") else "right")
    for row in frame.head(_SUMMARY_ROWS).to_dict("records"):
        notes = [f"{row['attempts']} attempts"] if row["attempts"] != row["episodes"] else []
        notes += [f"{row['aborted']} aborted"] if row["aborted"] else []
        notes += [f"{row['disturbed']} disturbed"] if row["disturbed"] else []
        episodes = f"{row['episodes']}" + (f" ({', '.join(notes)})" if notes else "")
        table.add_row(str(row["policy"]), str(row["network"]), fmt_number(float(row["rho"])),
                      str(row["keys"]), str(row["agents"]), str(row["deps"]),
                      str(row["connection"]), *((str(row["setting"]),) if studies else ()),
                      episodes,
                      f"{int(row['invalid'])}/{int(row['issued'])}", _num(row["stall_ms"]),
                      _num(row["kib"]))
    console.print(table)
    if len(frame) > _SUMMARY_ROWS:
        console.print(f"... {len(frame) - _SUMMARY_ROWS} more cells in "
                      f"{out_dir / 'episodes.parquet'} (see `testbed report`)")


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
