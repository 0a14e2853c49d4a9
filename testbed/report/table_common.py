"""What every table layout shares: options, strata, summaries, provenance, comparisons."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from testbed.report import slicing
from testbed.report.load import Run
from testbed.report.stats import (
    TIE_FRACTION,
    VERDICT_TEXT,
    Comparison,
    RowSummary,
    compare,
    paired,
)
from testbed.report.tabular import BEST, SECOND, Table, pct
from testbed.results.schema import STRATUM_COLUMNS as CELL_COLUMNS

STALL, KIB = "stall_ms_per_action", "kib_per_action"


@dataclass(frozen=True)
class Options:
    draws: int
    seed: int


def strata() -> list[str]:
    return list(CELL_COLUMNS)


def summary_row(summary: RowSummary) -> dict[str, object]:
    return {
        "episodes": summary.episodes,
        "aborted_episodes": summary.aborted,
        "scheduled": summary.scheduled,
        "available": summary.available,
        "issued": summary.issued,
        "invalid": summary.invalid,
        "valid": summary.valid,
        "stall_ms_median": summary.stall_ms,
        "stall_ms_q1": summary.stall_q1_ms,
        "stall_ms_q3": summary.stall_q3_ms,
        "kib_median": summary.kib,
        "kib_q1": summary.kib_q1,
        "kib_q3": summary.kib_q3,
        "connections_median": summary.connections,
    }


def with_provenance(run: Run, data: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    data.insert(0, "campaign", run.campaign)
    for column in ("backend", "network"):
        if column in frame and column not in data:
            data.insert(1, column, ", ".join(map(str, slicing.sorted_values(frame, column))))
    return data


def layout(run: Run, frame: pd.DataFrame, records: list[dict[str, object]],
            **fields: Any) -> Table:
    """A table in one of the paper's layouts: its machine-readable data (one record per
    row, with provenance columns) and its provenance line come from the same slice."""
    return Table(data=with_provenance(run, pd.DataFrame(records), frame),
                 provenance=slicing.provenance(run.campaign, frame), **fields)


def rank_marks(values: dict[str, float], eligible: set[str]) -> dict[str, str]:
    """Best and second-best (lowest) values among the eligible keys."""
    ranked = sorted(
        (v, k) for k, v in values.items() if k in eligible and pd.notna(v)
    )
    marks: dict[str, str] = {}
    for (_, key), mark in zip(ranked, (BEST, SECOND), strict=False):
        marks[key] = mark
    return marks


def policy_rows(frame: pd.DataFrame, policy: str) -> pd.DataFrame:
    return frame[frame["policy"] == policy]


def comparison_text(result: Comparison | None) -> str:
    """Change [95% interval], its resolution beside the tie band, and the verdict."""
    if result is None:
        return "–"
    text = f"{pct(result.change)} [{pct(result.change_low)}, {pct(result.change_high)}]"
    resolution = ("±–" if pd.isna(result.resolution)
                  else f"±{100 * result.resolution:.1f}%")
    return (f"{text} {resolution} (tie band {100 * TIE_FRACTION:.0f}%): "
            f"{VERDICT_TEXT[result.verdict]}")


def compare_pair(
    frame: pd.DataFrame, vary: str, a: object, b: object, metric: str, options: Options
) -> Comparison | None:
    pairs = paired(frame, vary=vary, a=a, b=b, metric=metric, strata=strata())
    return compare(pairs, draws=options.draws, seed=options.seed)


def comparison_columns(prefix: str, result: Comparison | None) -> dict[str, object]:
    if result is None:
        return {f"{prefix}_pairs": 0}
    return {
        f"{prefix}_pairs": result.pairs,
        f"{prefix}_diff": result.diff,
        f"{prefix}_diff_low": result.diff_low,
        f"{prefix}_diff_high": result.diff_high,
        f"{prefix}_change": result.change,
        f"{prefix}_change_low": result.change_low,
        f"{prefix}_change_high": result.change_high,
        f"{prefix}_tie": result.tie,
        f"{prefix}_resolution": result.resolution,
        f"{prefix}_verdict": result.verdict,
    }


# --- Table 2 and D.1: one row per policy at the headline setting ---------------------------
