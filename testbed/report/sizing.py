"""How large a campaign must be to resolve a comparison: expected resolution and growth.

Rules this module obeys (pure arithmetic; docs/reports.md, "Resolution"):

1. The resolution ``h`` of a paired comparison is the half-width of the 95% interval of
   its relative change (``testbed/report/stats.py``). Its square is modelled as
   ``h(n)^2 = A + B / n`` over ``n`` templates: ``A`` is what the family stage of the
   bootstrap leaves however many templates there are (three families), ``B / n`` what
   more templates average away. Both are *fitted* to the resolutions a run shows over
   nested prefixes of its own templates (:func:`fit_curve`, least squares, A, B >= 0),
   because the median over templates does not always follow the square-root law: on
   the AT&T rho = 4 comparison the resolution stays near ±30% from 6 to 30 templates.
2. Repeats average away only the rerun noise inside ``B``: with ``s0`` the SD over
   templates of the paired log ratio measured at ``r0`` repeats and ``e`` the SD of one
   attempt around its episode (rerun noise), ``B(r) = B * (b^2 + 2 e^2 / r) / s0^2``
   with ``b^2 = max(0, s0^2 - 2 e^2 / r0)``. Without ``e`` repeats are assumed not to
   help (the estimate errs on the wide side).
3. Growth (``--until-resolved``): while the worst watched resolution is above the
   target, stop at once if the target is below the fitted floor ``sqrt(A)`` (neither
   templates nor repeats can reach it); else grow templates to what rule 1 says is
   needed, at most doubling per round and at least one more per family, in whole rounds
   of the three families, up to ``max_templates``; then repeats by one per round up to
   ``max_repeats``. Stop when resolved or when both caps are reached, and say which.
4. A resolution measured on fewer than ``MIN_TEMPLATES`` templates (two per family) is
   not trusted: with one template per family the bootstrap's inner stage has nothing to
   resample and the interval only says which families a draw picked (on loopback, 3
   templates gave ±12.8% in one run and ±37.2% in another, 24 gave ±10.4%). Below it,
   growth goes on to ``MIN_TEMPLATES`` whatever the resolution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FAMILY_COUNT = 3
#: Rule 4: the smallest campaign whose resolution can count as resolved.
MIN_TEMPLATES = 2 * FAMILY_COUNT


@dataclass(frozen=True)
class Curve:
    """``h(n)^2 = floor^2 + term^2 / n`` (rule 1), from resolutions at several sizes."""

    floor: float
    term: float

    def at(self, templates: int, scale: float = 1.0) -> float:
        if templates < 1:
            return float("nan")
        return math.sqrt(self.floor ** 2 + (self.term * scale) ** 2 / templates)

    def templates_for(self, target: float, scale: float = 1.0) -> int | None:
        """Templates needed for ``target``; None when it is below the floor."""
        room = target ** 2 - self.floor ** 2
        if room <= 0:
            return None
        return max(1, math.ceil((self.term * scale) ** 2 / room))


def fit_curve(points: list[tuple[int, float]]) -> Curve | None:
    """Least-squares fit of rule 1 to (templates, resolution) points, A and B >= 0."""
    data = [(n, h) for n, h in points if n > 0 and math.isfinite(h)]
    if not data:
        return None
    if len({n for n, _ in data}) < 2:
        n, h = data[-1]
        return Curve(0.0, h * math.sqrt(n))  # one size: all of it counted as template noise
    xs = [1.0 / n for n, _ in data]
    ys = [h * h for _, h in data]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    if slope <= 0:
        return Curve(math.sqrt(max(0.0, mean_y)), 0.0)
    intercept = mean_y - slope * mean_x
    if intercept < 0:
        slope = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
        intercept = 0.0
    return Curve(math.sqrt(intercept), math.sqrt(slope))


def repeat_scale(s0: float, e: float | None, r0: int, r: int) -> float:
    """Rule 2: the factor on the template term at ``r`` repeats (1 without ``e``)."""
    if e is None or not math.isfinite(e) or s0 <= 0 or r < 1 or r0 < 1:
        return 1.0
    between = max(0.0, s0 * s0 - 2.0 * e * e / r0)
    return math.sqrt(between + 2.0 * e * e / r) / s0


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
              max_repeats: int, curve: Curve | None = None) -> Step:
    """Rule 3. ``worst``: the largest resolution among the watched comparisons (NaN when
    one could not be computed: it counts as unresolved); ``curve``: that comparison's
    fitted curve, if any."""
    if math.isfinite(worst) and worst <= target:
        if current.templates >= MIN_TEMPLATES:
            return Step(None, f"resolved: every comparison within ±{100 * target:.1f}% "
                              f"(worst ±{100 * worst:.1f}%)")
        if current.templates < max_templates:  # rule 4
            size = Size(_whole_rounds(MIN_TEMPLATES, max_templates), current.repeats)
            return Step(size, f"templates {current.templates} -> {size.templates} (±"
                              f"{100 * worst:.1f}% from fewer than {MIN_TEMPLATES} templates "
                              "is not trusted)")
        return Step(None, f"cap reached ({current.templates} templates): ±{100 * worst:.1f}% "
                          f"from fewer than {MIN_TEMPLATES} templates is not trusted")
    if curve is not None and curve.floor >= target:
        return Step(None, f"not reachable: the families alone leave ±{100 * curve.floor:.1f}%"
                          f" (fitted floor; more templates or repeats cannot narrow it), "
                          f"worst now ±{100 * worst:.1f}% > ±{100 * target:.1f}%")
    if current.templates < max_templates:
        needed = curve.templates_for(target) if curve is not None else None
        if needed is None:
            needed = 2 * current.templates
        grown = max(current.templates + FAMILY_COUNT, min(needed, 2 * current.templates))
        size = Size(_whole_rounds(grown, max_templates), current.repeats)
        return Step(size, f"templates {current.templates} -> {size.templates}")
    if current.repeats < max_repeats:
        return Step(Size(current.templates, current.repeats + 1),
                    f"repeats {current.repeats} -> {current.repeats + 1}")
    shown = "not computable" if not math.isfinite(worst) else f"±{100 * worst:.1f}%"
    return Step(None, f"cap reached ({current.templates} templates, {current.repeats} "
                      f"repeats): worst resolution {shown} > ±{100 * target:.1f}%")
