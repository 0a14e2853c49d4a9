"""Medians over templates, interquartile ranges, paired two-stage bootstrap, tie rule.

Conventions (paper appendix C.1, written here in our own terms):

* The unit of cost is one episode's ``stall_ms_per_action`` or ``kib_per_action``; an
  episode is one workflow template run under one configuration. Aborted episodes carry
  no cost (their costs are excluded, never imputed) but keep their scheduled actions in
  the availability denominators (see ``load.py``).
* A row that spans several strata (for example three trace offsets) reports the median
  of the per-stratum medians; its interquartile range pools the episodes.
* Paired comparisons match episodes with identical schedules: same configuration apart
  from the compared dimension (policy or connection), same family and template.
* Two-stage bootstrap: each draw resamples the families with replacement, then, inside
  every sampled family, resamples that family's template pairs with replacement (a pair
  stays together). The statistic is the difference of the two arms' medians over the
  pooled resampled pairs, and the relative change ``median_a / median_b - 1``. The
  interval is the 2.5-97.5 percentile range of the draws. ``scipy.stats.bootstrap``
  resamples one level only, so the two stages are written here with numpy, vectorised
  over draws (families of unequal size are padded and masked).
* Practical tie: two medians whose difference is under 10% of the larger one. On the
  relative change ``a / b - 1`` that is the band (-10%, +11.1%) (:func:`tie_band`).
* Resolution and verdict of a paired comparison: its resolution is the half-width of
  its 95% interval of the change; its verdict reads the interval against the tie band:
  ``lower`` / ``higher`` when the whole interval lies below / above the band, ``tie``
  when it lies inside, ``unresolved`` when it straddles an edge of the band (the
  campaign is too small to tell; more templates or repeats narrow the interval).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

TIE_FRACTION = 0.10
DEFAULT_DRAWS = 10_000
INTERVAL = (2.5, 97.5)

FloatArray = npt.NDArray[np.float64]


def practical_tie(x: float, y: float, fraction: float = TIE_FRACTION) -> bool:
    """True when |x - y| is below ``fraction`` of the larger magnitude (both zero: tie)."""
    larger = max(abs(x), abs(y))
    return bool(abs(x - y) < fraction * larger) or larger == 0.0


VERDICTS = ("lower", "higher", "tie", "unresolved")
VERDICT_TEXT = {"lower": "lower", "higher": "higher", "tie": "tie",
                "unresolved": "unresolved at this size"}


def tie_band(fraction: float = TIE_FRACTION) -> tuple[float, float]:
    """The practical-tie rule as a band of the relative change ``a / b - 1``."""
    return -fraction, fraction / (1.0 - fraction)


def interval_verdict(low: float, high: float, fraction: float = TIE_FRACTION) -> str:
    """``lower``, ``higher``, ``tie`` or ``unresolved`` for a change interval (module
    docstring); an interval that is not finite is unresolved."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return "unresolved"
    band_low, band_high = tie_band(fraction)
    if high <= band_low:
        return "lower"
    if low >= band_high:
        return "higher"
    if low > band_low and high < band_high:
        return "tie"
    return "unresolved"


def half_width(low: float, high: float) -> float:
    """The resolution of an interval: its half-width (NaN when it is not finite)."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return float("nan")
    return (high - low) / 2.0


def median_iqr(values: Sequence[float] | pd.Series | FloatArray) -> tuple[float, float, float]:
    """Median, first and third quartile of the finite values (NaN when there are none)."""
    array = np.asarray(values, dtype=float)
    array = array[np.isfinite(array)]
    if array.size == 0:
        return (float("nan"),) * 3
    q1, median, q3 = np.percentile(array, [25.0, 50.0, 75.0])
    return float(median), float(q1), float(q3)


def cost_episodes(episodes: pd.DataFrame) -> pd.DataFrame:
    """Episodes that carry costs: completed ones (aborted episodes are excluded)."""
    if "aborted" not in episodes:
        return episodes
    return episodes.loc[~episodes["aborted"].astype(bool)]


def row_median(episodes: pd.DataFrame, metric: str, strata: Sequence[str]) -> float:
    """Median over templates; with several strata, the median of per-stratum medians."""
    costs = cost_episodes(episodes)
    values = costs[metric].astype(float)
    if costs.empty:
        return float("nan")
    keys = [c for c in strata if c in costs.columns]
    if not keys or costs[keys].drop_duplicates().shape[0] == 1:
        return median_iqr(values)[0]
    per_stratum = costs.groupby(keys, dropna=False)[metric].median()
    return median_iqr(per_stratum.to_numpy(dtype=float))[0]


@dataclass(frozen=True)
class RowSummary:
    """Counts and costs of one table row (one policy in one configuration or group)."""

    episodes: int
    aborted: int
    scheduled: int
    available: int
    issued: int
    invalid: int
    valid: int
    stall_ms: float
    stall_q1_ms: float
    stall_q3_ms: float
    kib: float
    kib_q1: float
    kib_q3: float
    connections: float

    @property
    def safe(self) -> bool:
        """No invalid action and every scheduled action available."""
        return self.invalid == 0 and self.available == self.scheduled and self.scheduled > 0


def summarise(episodes: pd.DataFrame, strata: Sequence[str]) -> RowSummary:
    """Summary of the episodes of one row (``episodes`` from ``load.with_action_counts``)."""
    costs = cost_episodes(episodes)
    _, sq1, sq3 = median_iqr(costs["stall_ms_per_action"])
    _, kq1, kq3 = median_iqr(costs["kib_per_action"])
    conns = costs["connections"] if "connections" in costs else pd.Series(dtype=float)
    return RowSummary(
        episodes=len(episodes),
        aborted=int(episodes["aborted"].sum()) if "aborted" in episodes else 0,
        scheduled=int(episodes["scheduled"].sum()),
        available=int(episodes["available"].sum()),
        issued=int(episodes["available"].sum()),
        invalid=int(episodes["invalid_n"].sum()),
        valid=int(episodes["valid"].sum()),
        stall_ms=row_median(episodes, "stall_ms_per_action", strata),
        stall_q1_ms=sq1,
        stall_q3_ms=sq3,
        kib=row_median(episodes, "kib_per_action", strata),
        kib_q1=kq1,
        kib_q3=kq3,
        connections=median_iqr(conns)[0],
    )


# --- paired comparisons -------------------------------------------------------------------


def paired(
    episodes: pd.DataFrame,
    *,
    vary: str,
    a: object,
    b: object,
    metric: str,
    strata: Sequence[str],
) -> pd.DataFrame:
    """Pairs (family, template, a, b) of episodes with identical schedules.

    ``vary`` is the compared column (``policy`` or ``connection``); every other stratum
    column must match. Pairs with an aborted side are dropped.
    """
    costs = cost_episodes(episodes)
    keys = [c for c in (*strata, "family", "template", "schedule_digest")
            if c in costs.columns and c != vary]
    left = costs.loc[costs[vary] == a, [*keys, metric]].rename(columns={metric: "a"})
    right = costs.loc[costs[vary] == b, [*keys, metric]].rename(columns={metric: "b"})
    return left.merge(right, on=keys, how="inner").reset_index(drop=True)


@dataclass(frozen=True)
class Comparison:
    """Arm a against arm b on paired schedules (a is usually PlanFence or reuse)."""

    pairs: int
    families: int
    median_a: float
    median_b: float
    diff: float  # median_a - median_b
    diff_low: float
    diff_high: float
    change: float  # median_a / median_b - 1 (negative: a is lower)
    change_low: float
    change_high: float
    tie: bool

    @property
    def excludes_zero(self) -> bool:
        return bool(self.diff_low > 0 or self.diff_high < 0)

    @property
    def resolution(self) -> float:
        """Half-width of the 95% interval of the relative change (a fraction)."""
        return half_width(self.change_low, self.change_high)

    @property
    def verdict(self) -> str:
        """``lower``, ``higher``, ``tie`` or ``unresolved`` (a against b; module docstring)."""
        return interval_verdict(self.change_low, self.change_high)


def _ratio_minus_one(num: FloatArray, den: FloatArray) -> FloatArray:
    out = np.full(num.shape, np.nan)
    np.divide(num, den, out=out, where=den != 0)
    return out - 1.0


def two_stage_draws(
    families: npt.ArrayLike | pd.Series,
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    *,
    draws: int,
    rng: np.random.Generator,
) -> tuple[FloatArray, FloatArray]:
    """Bootstrap medians of both arms, shape (draws,), by two-stage resampling of pairs."""
    labels = pd.Series(np.asarray(families, dtype=object)).astype(str)
    codes, uniques = pd.factorize(labels, sort=True)
    order = np.argsort(codes, kind="stable")
    a_sorted = np.asarray(a, dtype=float)[order]
    b_sorted = np.asarray(b, dtype=float)[order]
    sizes = np.bincount(codes, minlength=len(uniques))
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    n_fam, width = len(sizes), int(sizes.max())
    chosen = rng.integers(0, n_fam, size=(draws, n_fam))  # stage 1: families
    n = sizes[chosen][..., None]
    offsets = np.floor(rng.random((draws, n_fam, width)) * n).astype(np.int64)  # stage 2
    present = np.arange(width)[None, None, :] < n
    index = np.where(present, starts[chosen][..., None] + offsets, 0)
    sample_a = np.where(present, a_sorted[index], np.nan).reshape(draws, -1)
    sample_b = np.where(present, b_sorted[index], np.nan).reshape(draws, -1)
    return np.nanmedian(sample_a, axis=1), np.nanmedian(sample_b, axis=1)


def compare(
    pairs: pd.DataFrame,
    *,
    draws: int = DEFAULT_DRAWS,
    seed: int = 0,
) -> Comparison | None:
    """Two-stage bootstrap comparison of the ``a`` and ``b`` columns of ``pairs``."""
    if pairs.empty:
        return None
    a = pairs["a"].to_numpy(dtype=float)
    b = pairs["b"].to_numpy(dtype=float)
    med_a, med_b = float(np.median(a)), float(np.median(b))
    boot_a, boot_b = two_stage_draws(
        pairs["family"], a, b, draws=draws, rng=np.random.default_rng(seed)
    )
    diff_lo, diff_hi = np.percentile(boot_a - boot_b, INTERVAL)
    changes = _ratio_minus_one(boot_a, boot_b)
    if np.isfinite(changes).any():
        ch_lo, ch_hi = np.percentile(changes[np.isfinite(changes)], INTERVAL)
    else:
        ch_lo = ch_hi = float("nan")
    change = med_a / med_b - 1.0 if med_b != 0 else float("nan")
    return Comparison(
        pairs=len(pairs),
        families=int(pairs["family"].nunique()),
        median_a=med_a,
        median_b=med_b,
        diff=med_a - med_b,
        diff_low=float(diff_lo),
        diff_high=float(diff_hi),
        change=change,
        change_low=float(ch_lo),
        change_high=float(ch_hi),
        tie=practical_tie(med_a, med_b),
    )


def family_floor(pairs: pd.DataFrame, *, draws: int = DEFAULT_DRAWS, seed: int = 0) -> float:
    """Half-width of the change interval when only families are resampled (stage 1 alone,
    every family's pairs kept whole): the part of the resolution that more templates or
    repeats cannot narrow while the number of families stays the same."""
    if pairs.empty or pairs["family"].nunique() < 2:
        return 0.0
    groups = [g for _, g in pairs.groupby("family", sort=True)]
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(groups), size=(draws, len(groups)))
    counts = np.stack([np.bincount(row, minlength=len(groups)) for row in picks])
    unique, inverse = np.unique(counts, axis=0, return_inverse=True)
    changes = np.empty(len(unique))
    for i, row in enumerate(unique):
        a = np.concatenate([np.repeat(g["a"].to_numpy(float), n) for g, n in zip(groups, row,
                                                                                  strict=True)])
        b = np.concatenate([np.repeat(g["b"].to_numpy(float), n) for g, n in zip(groups, row,
                                                                                  strict=True)])
        med_b = float(np.median(b))
        changes[i] = float(np.median(a)) / med_b - 1.0 if med_b else np.nan
    values = changes[np.asarray(inverse).reshape(-1)]
    values = values[np.isfinite(values)]
    if values.size == 0:
        return float("nan")
    low, high = np.percentile(values, INTERVAL)
    return float(high - low) / 2.0


# --- the paper's per-template ratios (appendix H) -------------------------------------------

PAPER_RATIO_DRAWS = 2_000


@dataclass(frozen=True)
class RatioSummary:
    """Median of paired per-template ratios a/b, with a one-stage paired bootstrap
    interval (the paper's statistic for Table H.1: 2,000 draws resampling templates)."""

    pairs: int
    median: float
    low: float
    high: float


def ratio_median(pairs: pd.DataFrame, *, draws: int = PAPER_RATIO_DRAWS,
                 seed: int = 0) -> RatioSummary | None:
    """Median over paired templates of ``a / b`` (pairs with b = 0 are dropped)."""
    if pairs.empty:
        return None
    a = pairs["a"].to_numpy(dtype=float)
    b = pairs["b"].to_numpy(dtype=float)
    keep = np.isfinite(a) & np.isfinite(b) & (b != 0)
    ratios = a[keep] / b[keep]
    if ratios.size == 0:
        return None
    rng = np.random.default_rng(seed)
    index = rng.integers(0, ratios.size, size=(draws, ratios.size))
    low, high = np.percentile(np.median(ratios[index], axis=1), INTERVAL)
    return RatioSummary(int(ratios.size), float(np.median(ratios)), float(low), float(high))
