"""How large a campaign must be to resolve a comparison: expected resolution and growth.

Rules this module obeys (pure arithmetic; docs/reports.md, "Resolution"):

1. The resolution of a paired comparison is the half-width of the 95% interval of its
   relative change (``testbed/report/stats.py``). A measured resolution ``h0`` at
   ``n0`` templates and ``r0`` repeats predicts the resolution at ``n`` templates and
   ``r`` repeats by the usual square-root law, with the per-template spread split into
   what repeats average away and what they cannot:

   * ``s0`` = SD over templates of the paired log ratio ``log(a / b)`` (measured with
     ``r0`` repeats); ``e`` = SD of one attempt's log cost around its episode's (the
     rerun noise, measured from repeated attempts of the same schedule);
   * between-template part ``b^2 = max(0, s0^2 - 2 e^2 / r0)``; with ``r`` repeats the
     spread is ``s(r)^2 = b^2 + 2 e^2 / r``;
   * ``h(n, r) = h0 * (s(r) / s0) * sqrt(n0 / n)``. Without ``e`` repeats are assumed
     not to help (``s(r) = s0``): the estimate errs on the wide side.

   The factor ``h0 / s0`` is measured, not assumed, so the median's efficiency and the
   two-stage bootstrap's family stage are carried over from the measured run.
2. Growth (``--until-resolved``): while the worst watched resolution is above the
   target, first templates grow, to what rule 1 says is needed but at most doubling
   per round and at least one more per family, in whole rounds of the three families,
   up to ``max_templates``; then repeats grow by one per round up to ``max_repeats``.
   It stops when resolved or when both caps are reached, and says which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FAMILY_COUNT = 3


def expected_resolution(h0: float, n0: int, r0: int, s0: float, e: float | None,
                        n: int, r: int) -> float:
    """Rule 1's prediction of the half-width at ``n`` templates and ``r`` repeats."""
    if n < 1 or r < 1 or n0 < 1 or r0 < 1 or not math.isfinite(h0):
        return float("nan")
    scale = 1.0
    if e is not None and math.isfinite(e) and s0 > 0:
        between = max(0.0, s0 * s0 - 2.0 * e * e / r0)
        scale = math.sqrt(between + 2.0 * e * e / r) / s0
    return h0 * scale * math.sqrt(n0 / n)


def templates_needed(h0: float, n0: int, target: float) -> int:
    """Templates rule 1 expects to reach ``target`` at the same repeats."""
    if not (math.isfinite(h0) and target > 0):
        return n0
    return max(n0, math.ceil(n0 * (h0 / target) ** 2))


@dataclass(frozen=True)
class Size:
    templates: int
    repeats: int


@dataclass(frozen=True)
class Step:
    """What ``--until-resolved`` does next: a new size, or stop with the reason."""

    size: Size | None
    reason: str

    @property
    def resolved(self) -> bool:
        return self.size is None and self.reason.startswith("resolved")


def _whole_rounds(templates: int, cap: int) -> int:
    return min(cap, FAMILY_COUNT * math.ceil(templates / FAMILY_COUNT))


def next_size(current: Size, worst: float, target: float, *, max_templates: int,
              max_repeats: int) -> Step:
    """Rule 2. ``worst``: the largest resolution among the watched comparisons (NaN when
    one could not be computed: it counts as unresolved)."""
    if math.isfinite(worst) and worst <= target:
        return Step(None, f"resolved: every comparison within ±{100 * target:.1f}% "
                          f"(worst ±{100 * worst:.1f}%)")
    if current.templates < max_templates:
        needed = templates_needed(worst, current.templates, target) if math.isfinite(worst) \
            else 2 * current.templates
        grown = max(current.templates + FAMILY_COUNT, min(needed, 2 * current.templates))
        size = Size(_whole_rounds(grown, max_templates), current.repeats)
        return Step(size, f"templates {current.templates} -> {size.templates}")
    if current.repeats < max_repeats:
        return Step(Size(current.templates, current.repeats + 1),
                    f"repeats {current.repeats} -> {current.repeats + 1}")
    shown = "not computable" if not math.isfinite(worst) else f"±{100 * worst:.1f}%"
    return Step(None, f"cap reached ({current.templates} templates, {current.repeats} "
                      f"repeats): worst resolution {shown} > ±{100 * target:.1f}%")
