"""Choose the slice of a campaign that one table or figure describes, and name it.

A table varies a few dimensions (for example policy and rho) and holds the others at
one value each: the paper's default when the campaign has it (N=5, 8 keys, d=1, T=64,
new connection per RPC, compact tier, offset 0, rho=4), otherwise the value with the
most episodes. The chosen values are printed under every table (its provenance).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pandas as pd

from testbed.links.profiles import profile_names
from testbed.results.schema import STRATUM_COLUMNS as CELL_COLUMNS

PREFERRED: dict[str, object] = {
    "agents": 5,
    "keys": 8,
    "deps": 1,
    "units": 64,
    "connection": "fresh",
    "tier": "compact",
    "rho": 4.0,
    "trace_offset_s": 0.0,
    "network": "att",
    "batch": 1,
}


def _matches(series: pd.Series, value: object) -> pd.Series:
    if isinstance(value, int | float) and pd.api.types.is_numeric_dtype(series):
        return (series.astype(float) - float(value)).abs() < 1e-9
    return series.astype(str) == str(value)


def pinned_value(frame: pd.DataFrame, column: str) -> object:
    """The preferred value of ``column`` if present in ``frame``, else the most common one."""
    values = frame[column]
    preferred = PREFERRED.get(column)
    if preferred is not None and _matches(values, preferred).any():
        return values[_matches(values, preferred)].iloc[0]
    counts = values.value_counts(dropna=False)
    top = counts[counts == counts.max()].index
    return sorted(top, key=str)[0]


@dataclass(frozen=True)
class Slice:
    episodes: pd.DataFrame
    fixed: dict[str, object]


def slice_for(
    episodes: pd.DataFrame,
    *,
    free: Iterable[str],
    where: dict[str, object] | None = None,
) -> Slice:
    """Rows of ``episodes`` with ``where`` applied and every non-free cell column pinned."""
    frame = episodes
    fixed: dict[str, object] = {}
    for column, value in (where or {}).items():
        if column in frame:
            frame = frame[_matches(frame[column], value)]
            fixed[column] = value
    free_set = set(free) | {"policy"}
    if "network" in free_set:  # the backend follows the network (loopback runs with none)
        free_set.add("backend")
    for column in CELL_COLUMNS:
        if column in free_set or column in fixed or column not in frame or frame.empty:
            continue
        value = pinned_value(frame, column)
        frame = frame[_matches(frame[column], value)]
        fixed[column] = value
    return Slice(frame, fixed)


def networks(episodes: pd.DataFrame) -> list[str]:
    """Networks present, in the profile registry's order (unknown names last)."""
    present = {str(n) for n in episodes["network"].unique()}
    known = [n for n in profile_names() if n in present]
    return known + sorted(present - set(known))


def sorted_values(frame: pd.DataFrame, column: str) -> list[object]:
    return sorted(frame[column].dropna().unique().tolist())


def number(value: object) -> str:
    """Compact text for a cell value (4.0 -> 4, 0.25 -> 0.25)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


_LABELS = {
    "network": "profile",
    "backend": "backend",
    "trace_offset_s": "trace offset (s)",
    "connection": "connection",
    "agents": "N",
    "keys": "keys",
    "deps": "d",
    "rho": "rho",
    "tier": "tier",
    "units": "T",
    "batch": "batch",
}


def provenance(campaign: str, frame: pd.DataFrame, columns: Sequence[str] = CELL_COLUMNS) -> str:
    """One line naming the campaign and the configuration values the frame covers."""
    parts = [f"Campaign {campaign}"]
    for column in columns:
        if column not in frame or frame.empty:
            continue
        values = ", ".join(number(v) for v in sorted_values(frame, column))
        parts.append(f"{_LABELS.get(column, column)} {values}")
    episodes = len(frame)
    aborted = int(frame["aborted"].sum()) if "aborted" in frame else 0
    parts.append(f"{episodes} episodes ({aborted} aborted)")
    return "; ".join(parts) + "."
