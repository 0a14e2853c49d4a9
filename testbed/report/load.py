"""Read a run directory into frames the report can aggregate, without changing it.

Per-episode action counts (issued, invalid, available, valid) are derived from
actions.parquet and joined onto episodes.parquet, so every later step filters one
frame. The scheduled-action denominator of an aborted episode is its
``scheduled_actions`` column when the runner wrote one, otherwise the attempted count
of a completed episode with the same schedule (same workload parameters and template):
aborted slots stay in availability denominators and nothing is imputed for them.

Counts are derived per attempt; then every episode's attempts become its one verdict
row (``testbed/report/attempts.py``: repeats, reruns of disturbed attempts and
``exclude_disturbed``), and ``Run.attempts`` keeps every attempt for the report's
disturbance lines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.report.attempts import collapse, with_attempt_columns
from testbed.results.rundir import RunDirError
from testbed.results.schema import SCHEDULE_COLUMNS
from testbed.results.schema import STRATUM_COLUMNS as CELL_COLUMNS
from testbed.results.verdict import VERDICT_VERSION, rejudge


@dataclass(frozen=True)
class Run:
    """A campaign's results as read from its run directory."""

    path: Path
    manifest: dict[str, Any]
    actions: pd.DataFrame
    episodes: pd.DataFrame  # with derived columns scheduled, issued, invalid_n, available, valid
    #: Every attempt as recorded (with counts and ``verdict``); None: not split out.
    attempts: pd.DataFrame | None = None
    #: With ``exclude_disturbed``: (disturbed attempts, episodes) left out of the tables.
    excluded: tuple[int, int] | None = None

    @property
    def campaign(self) -> str:
        name = self.manifest.get("campaign")
        if name is None and "campaign" in self.episodes:
            values = self.episodes["campaign"].dropna().unique()
            name = values[0] if len(values) else None
        return str(name) if name is not None else self.path.name

    def cell_columns(self) -> list[str]:
        return [c for c in CELL_COLUMNS if c in self.episodes.columns]


_REQUIRED_EPISODE = ("policy", "network", "episode", "stall_ms_per_action", "kib_per_action")
_REQUIRED_ACTION = ("policy", "episode", "outcome", "invalid")


def load_run(path: Path, *, exclude_disturbed: bool = False) -> Run:
    """Read manifest.json, actions.parquet and episodes.parquet from ``path``; one row
    per episode (its verdict attempts), disturbed attempts left out if asked."""
    for name in ("manifest.json", "actions.parquet", "episodes.parquet"):
        if not (path / name).is_file():
            raise RunDirError(f"{path}: missing {name}")
    manifest = json.loads((path / "manifest.json").read_text())
    if not isinstance(manifest, dict):
        raise RunDirError(f"{path / 'manifest.json'}: expected a JSON object")
    actions = pd.read_parquet(path / "actions.parquet")
    episodes = pd.read_parquet(path / "episodes.parquet")
    _require(episodes, _REQUIRED_EPISODE, path / "episodes.parquet")
    _require(actions, _REQUIRED_ACTION, path / "actions.parquet")
    if (manifest.get("disturbance_verdict") or {}).get("version") != VERDICT_VERSION:
        episodes = rejudge(episodes)  # a run made under an earlier verdict: this one's
    episodes = with_attempt_columns(episodes)
    actions = with_attempt_columns(actions, episodes=False)
    view = collapse(with_action_counts(episodes, actions), actions,
                    exclude_disturbed=exclude_disturbed)
    excluded = (view.excluded_attempts, view.excluded_episodes) if exclude_disturbed else None
    return Run(path, manifest, view.actions, view.episodes, view.attempts, excluded)


def _require(frame: pd.DataFrame, columns: tuple[str, ...], where: Path) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise RunDirError(f"{where}: missing column(s) {', '.join(missing)}")


def join_keys(episodes: pd.DataFrame, actions: pd.DataFrame) -> list[str]:
    """Columns that identify one episode in both frames."""
    keys = [c for c in ("campaign", "cell", "episode", "attempt")
            if c in episodes and c in actions]
    if "cell" not in keys:
        keys += [c for c in ("policy", *CELL_COLUMNS) if c in episodes and c in actions]
    return keys


def with_action_counts(episodes: pd.DataFrame, actions: pd.DataFrame) -> pd.DataFrame:
    """Copy of ``episodes`` with per-episode action counts and the scheduled denominator."""
    keys = join_keys(episodes, actions)
    released = actions["outcome"].astype(str).eq("released")
    invalid = actions["invalid"].astype(bool) & released
    counts = (
        pd.DataFrame(
            {
                **{k: actions[k] for k in keys},
                "recorded": 1,
                "available": released.astype(int),
                "invalid_n": invalid.astype(int),
                "valid": (released & ~invalid).astype(int),
            }
        )
        .groupby(keys, dropna=False, as_index=False)
        .sum()
    )
    out = episodes.drop(
        columns=[c for c in ("recorded", "available", "invalid_n", "valid") if c in episodes]
    ).merge(counts, on=keys, how="left")
    for column in ("recorded", "available", "invalid_n", "valid"):
        out[column] = out[column].fillna(0).astype(int)
    out["aborted"] = (
        out["aborted"].astype("boolean").fillna(False).astype(bool) if "aborted" in out else False
    )
    out["scheduled"] = _scheduled(out)
    return out


def _scheduled(episodes: pd.DataFrame) -> pd.Series:
    attempted = (
        episodes["attempted_actions"] if "attempted_actions" in episodes else episodes["recorded"]
    )
    attempted = attempted.fillna(episodes["recorded"]).astype(int)
    if "scheduled_actions" in episodes and episodes["scheduled_actions"].notna().all():
        return episodes["scheduled_actions"].astype(int)
    key = [c for c in SCHEDULE_COLUMNS if c in episodes]
    done = episodes.loc[~episodes["aborted"], key].assign(_n=attempted[~episodes["aborted"]])
    if not key or done.empty:
        return attempted
    reference = done.groupby(key, dropna=False)["_n"].max().rename("_ref").reset_index()
    ref = episodes[key].merge(reference, on=key, how="left")["_ref"].to_numpy()
    scheduled = attempted.copy()
    mask = episodes["aborted"].to_numpy() & pd.notna(ref)
    scheduled[mask] = pd.Series(ref[mask]).astype(int).to_numpy()
    if "scheduled_actions" in episodes:
        given = episodes["scheduled_actions"]
        scheduled = given.fillna(scheduled).astype(int)
    return scheduled.astype(int)
