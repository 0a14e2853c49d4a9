"""Claims on a rerun: each claim about the reproduced run, evaluated on the rerun's data,
with a verdict (``testbed reproduce``; docs/reproduce.md, "Verdicts").

Rules this module obeys:

1. The claims are those of a claims file (``testbed.report.claims``) whose ``run`` is the
   reproduced run's name. Skipped, with why: claims that span runs (``run = ""`` naming
   this run, or calling ``runs``, ``rerun_pairs``, ``all_episodes``, ``cell_medians``),
   read a benchmark (``read_json``) or describe how the run was made or the host it ran
   on (``sessions``, disturbance, CPU steal, run-queue wait, wall time); with a cell
   filter, claims that read cells the rerun did not run or the whole run's frames.
2. Every claim is evaluated by the claim machinery (:func:`testbed.report.claims.evaluate`)
   three times: on the committed run (what the README states), on the committed run cut
   to the rerun's episodes ("at this size": same cells, same templates) and on the rerun.
   A :class:`RecordingScope` notes each statistic the expression computes (``change``,
   ``ratio``, ``median`` and so ``stall`` and ``kib``) with its 95% interval.
3. A **paired change or ratio** whose committed verdict (the full run's interval against
   the tie band, ``stats.interval_verdict``) is lower, higher or tie reproduces when the
   rerun's interval lies inside that verdict's region, is not reproduced when it lies
   wholly outside it, and is unresolved at this size when it straddles an edge. One
   whose committed verdict is itself unresolved is checked as a plain statistic.
4. A **plain statistic** (a cell median; the point of a change whose committed verdict
   was unresolved) reproduces when the rerun's value lies inside the committed interval
   at this size widened on each side by the rerun's half-width; else it is not
   reproduced. With fewer than two templates there is no interval: unresolved.
5. **Other numbers** the expression computes from the frames (counts, sums, action-level
   means) are equal within the written precision, or else compared by a paired bootstrap
   over templates (the same templates drawn for both runs, the statistics held at their
   values): the relative difference (rerun - committed) / larger magnitude (for a
   number written as a signed percentage, a change: the difference in points / 100)
   must lie within the practical tie (10%); its 95% interval inside: reproduced,
   outside: not reproduced, across the edge: unresolved (200 draws, fewer for an
   expression slow to evaluate: at least 50, then at most 20 s per claim). An expression's premise (a claim returning
   ``[]`` when it fails) that holds at this size but not on the rerun: not reproduced.
6. A claim is not reproduced if any check is, else unresolved if any is, else
   reproduced. Templates needed: a half-width h at n templates is taken to shrink as
   1/sqrt(n) around the same centre; the check resolves once h is below the distance
   h* from the centre to the nearest edge of its region: n* = ceil(n (h / h*)^2)
   (the family floor of a two-stage interval, ``stats.family_floor``, is ignored).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from testbed.report.claims import Claim, evaluate, parse_number
from testbed.report.load import Run
from testbed.report.reproduce_scope import Key, RecordingScope, Stat, frame_names
from testbed.report.stats import (
    INTERVAL,
    TIE_FRACTION,
    half_width,
    interval_verdict,
    tie_band,
)

REPRODUCED, NOT_REPRODUCED, UNRESOLVED, SKIPPED = (
    "reproduced", "not reproduced", "unresolved at this size", "skipped")
NUMBER_DRAWS = 200
#: A claim's resampling stops after this many seconds once it has MIN_DRAWS draws.
NUMBER_BUDGET_S, MIN_DRAWS = 20.0, 50
_LOW, _HIGH = tie_band()
REGIONS = {"lower": (-math.inf, _LOW), "higher": (_HIGH, math.inf), "tie": (_LOW, _HIGH)}
OTHER_RUNS = re.compile(r"\b(?:runs|rerun_pairs|all_episodes|cell_medians)\(")
HOST_STATE = re.compile(r"\bsessions\(|disturb|steal|runq|wall_s|python_probe")


@dataclass(frozen=True)
class Check:
    label: str
    rule: str  # change | statistic | number | premise
    committed: str
    new: str
    verdict: str
    needed: int | None = None


@dataclass(frozen=True)
class ClaimResult:
    claim: Claim
    verdict: str
    reason: str = ""
    committed: tuple[float, ...] = ()
    at_size: tuple[float, ...] = ()
    new: tuple[float, ...] = ()
    checks: tuple[Check, ...] = ()
    needed: int | None = None


# --- which claims (rule 1) ----------------------------------------------------------------


def skip_reason(claim: Claim, run_name: str) -> str | None:
    """Why a claim about (or naming) this run is not checked on a rerun (rule 1); None
    if it is checked. Claims that neither name nor mention the run are not listed."""
    if not claim.run:
        return "spans several runs" if re.search(rf"['\"]{re.escape(run_name)}['\"]",
                                                 claim.expr) else None
    if claim.run != run_name:
        return None
    if OTHER_RUNS.search(claim.expr):
        return "reads other runs too (cross-run)"
    if "read_json(" in claim.expr:
        return "reads a benchmark's output, not the run"
    if HOST_STATE.search(claim.expr):
        return "describes how the run was made or its host (sessions, disturbance, wall time)"
    return None


def cut(run: Run, episodes: set[str]) -> Run:
    """The run restricted to the given episode keys."""
    return replace(run, episodes=run.episodes.loc[run.episodes["episode"].isin(episodes)],
                   actions=run.actions.loc[run.actions["episode"].isin(episodes)])


# --- verdict rules (rules 3-6) ------------------------------------------------------------


def needed(low: float, high: float, n: int, region: tuple[float, float]) -> int | None:
    """Templates at which the interval would resolve against ``region`` (rule 6)."""
    if not (math.isfinite(low) and math.isfinite(high)) or n < 1:
        return None
    centre, h = (low + high) / 2, (high - low) / 2
    r_lo, r_hi = region
    if r_lo < centre < r_hi:
        target = min(centre - r_lo, r_hi - centre)
    else:
        target = r_lo - centre if centre <= r_lo else centre - r_hi
    if not target > 0:
        return None
    return max(n + 1, math.ceil(n * (h / target) ** 2))


def region_check(committed: Stat, new: Stat, verdict: str) -> Check:
    """Rule 3: the rerun's interval against the committed verdict's region."""
    r_lo, r_hi = REGIONS[verdict]
    shown = f"{committed.text()} ({verdict}; the whole run)"
    if new.n < 2 or not (math.isfinite(new.low) and math.isfinite(new.high)):
        return Check(committed.label, "change", shown, new.text(), UNRESOLVED, 2)
    if interval_verdict(new.low, new.high) == verdict:
        outcome = REPRODUCED
    elif new.low >= r_hi or new.high <= r_lo:
        outcome = NOT_REPRODUCED
    else:
        return Check(committed.label, "change", shown, new.text(), UNRESOLVED,
                     needed(new.low, new.high, new.n, (r_lo, r_hi)))
    return Check(committed.label, "change", shown, new.text(), outcome)


def plain_check(at_size: Stat, new: Stat, *, rule: str = "statistic") -> Check:
    """Rule 4: the rerun's value inside the committed interval widened by its own
    half-width."""
    shown = f"{at_size.text()} (at this size)"
    if min(at_size.n, new.n) < 2:
        return Check(new.label, rule, shown, new.text(), UNRESOLVED, 2)
    if not math.isfinite(new.value):
        return Check(new.label, rule, shown, "no value", NOT_REPRODUCED)
    h = half_width(new.low, new.high)
    slack = 1e-9 * max(1.0, abs(new.value))
    inside = at_size.low - h - slack <= new.value <= at_size.high + h + slack
    return Check(new.label, rule, shown, new.text(), REPRODUCED if inside else NOT_REPRODUCED)


def stat_checks(full: Mapping[Key, Stat], at_size: Mapping[Key, Stat],
                new: Mapping[Key, Stat]) -> list[Check]:
    checks = []
    for key, stat in new.items():
        if key not in full or key not in at_size:
            continue
        if stat.kind in ("change", "ratio"):
            verdict = interval_verdict(full[key].low, full[key].high)
            if verdict in REGIONS:
                checks.append(region_check(full[key], stat, verdict))
                continue
        checks.append(plain_check(at_size[key], stat))
    return checks


def _precision(claim: Claim, count: int) -> list[tuple[float, bool]]:
    """Per number: half a unit of its last written digit (or the claim's ``tol``), and
    whether it is written as a signed percentage (a change: compared in points)."""
    written = claim.written
    if len(written) != count:
        return [(0.0, False)] * count
    return [(claim.tol if claim.tol is not None else parse_number(w)[1],
             w.startswith(("+", "-")) and w.endswith("%")) for w in written]


def _relative(new: float, old: float, precision: tuple[float, bool]) -> float:
    """(new - old) / the larger magnitude, or in points / 100 for a signed percentage;
    0 within the written precision (rule 5)."""
    tol, points = precision
    if not (math.isfinite(new) and math.isfinite(old)):
        return float("nan")
    if abs(new - old) <= tol + 1e-9:
        return 0.0
    if points:
        return (new - old) / 100
    return (new - old) / max(abs(new), abs(old))


Rows = dict[str, tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]]


def _resampler(run: Run) -> Rows:
    """Each template's row positions in the run's episodes and actions."""
    episodes = run.episodes["template"].astype(str).to_numpy()
    actions = run.actions["template"].astype(str).to_numpy()
    return {t: (np.flatnonzero(episodes == t), np.flatnonzero(actions == t))
            for t in dict.fromkeys(episodes)}


def _resampled(run: Run, chosen: Sequence[str], rows: Rows) -> Run:
    """The run with the chosen templates (repeats kept, one take per frame)."""
    return replace(run, episodes=run.episodes.iloc[np.concatenate([rows[t][0] for t in chosen])],
                   actions=run.actions.iloc[np.concatenate([rows[t][1] for t in chosen])])


def _unseparated(claim: Claim, committed: Sequence[float], rerun: Sequence[float],
                 tol: Sequence[tuple[float, bool]]) -> list[Check]:
    """Numbers of an expression whose statistics cannot be held (a statistic it asks
    for depends on the rerun's frames): compared directly, never failed on that alone
    (within the practical tie: reproduced; else unresolved, no estimate)."""
    checks = []
    for i, (old, now) in enumerate(zip(committed, rerun, strict=True)):
        point = _relative(now, old, tol[i])
        if point != 0.0:
            tie = math.isfinite(point) and abs(point) < TIE_FRACTION
            checks.append(Check(f"number {i + 1} of the text (compared directly)", "number",
                                f"{old:.4g} (at this size)", f"{now:.4g} ({100 * point:+.0f}%)",
                                REPRODUCED if tie else UNRESOLVED))
    return checks


def number_checks(claim: Claim, root: Path, at_size: Run, new: Run,
                  stubs: Mapping[Key, Any], committed: Sequence[float],
                  rerun: Sequence[float]) -> list[Check]:
    """Rule 5: the numbers that differ once the statistics are held at their committed
    values, by a paired template bootstrap."""
    tol = _precision(claim, len(committed))
    try:
        mixed = evaluate(claim, root, RecordingScope(root, new, stubs=stubs))
    except Exception:  # a statistic the rerun asks for that the committed run did not
        mixed = []
    if len(mixed) != len(committed):
        return _unseparated(claim, committed, rerun, tol)
    differing = [i for i, (m, c) in enumerate(zip(mixed, committed, strict=True))
                 if _relative(m, c, tol[i]) != 0.0]
    if not differing:
        return []
    parts_old, parts_new = _resampler(at_size), _resampler(new)
    templates = sorted(set(parts_old) & set(parts_new))
    rng = np.random.default_rng(0)
    rows: list[list[float]] = []
    started, attempted = time.monotonic(), 0
    while len(templates) > 1 and attempted < NUMBER_DRAWS and not (
            attempted >= MIN_DRAWS and time.monotonic() - started > NUMBER_BUDGET_S):
        attempted += 1
        chosen = [templates[i] for i in rng.integers(0, len(templates), len(templates))]
        try:
            old = evaluate(claim, root, RecordingScope(
                root, _resampled(at_size, chosen, parts_old), stubs=stubs))
            now = evaluate(claim, root, RecordingScope(
                root, _resampled(new, chosen, parts_new), stubs=stubs))
        except Exception:  # a resample the expression cannot take
            continue
        if len(old) == len(now) == len(committed):
            rows.append([_relative(now[i], old[i], tol[i]) for i in differing])
    draws = np.array(rows, dtype=float).reshape(-1, len(differing))
    checks = []
    for j, i in enumerate(differing):
        label = f"number {i + 1} of the text" + (
            f" (written {claim.written[i]})" if len(claim.written) == len(committed) else "")
        point = _relative(mixed[i], committed[i], tol[i])
        shown = f"{mixed[i]:.4g} ({100 * point:+.0f}%)"
        finite = draws[:, j][np.isfinite(draws[:, j])] if len(draws) else np.array([])
        if finite.size < max(2, attempted // 2):
            checks.append(Check(label, "number", f"{committed[i]:.4g} (at this size)", shown,
                                UNRESOLVED))
            continue
        low, high = (float(x) for x in np.percentile(finite, INTERVAL))
        shown += f" [{100 * low:+.0f}%, {100 * high:+.0f}%]"
        band = (-TIE_FRACTION, TIE_FRACTION)
        if band[0] < low and high < band[1]:
            outcome, need = REPRODUCED, None
        elif high <= band[0] or low >= band[1]:
            outcome, need = NOT_REPRODUCED, None
        else:
            outcome, need = UNRESOLVED, needed(low, high, len(templates), band)
        checks.append(Check(label, "number", f"{committed[i]:.4g} (at this size)", shown,
                            outcome, need))
    return checks


def combine(checks: Sequence[Check]) -> tuple[str, int | None]:
    """Rule 6: the claim's verdict and the templates its unresolved checks need."""
    verdicts = {c.verdict for c in checks}
    if NOT_REPRODUCED in verdicts:
        return NOT_REPRODUCED, None
    if UNRESOLVED in verdicts:
        counts = [c.needed for c in checks if c.verdict == UNRESOLVED]
        return UNRESOLVED, None if any(n is None for n in counts) else max(
            n for n in counts if n is not None)
    return REPRODUCED, None


# --- one claim, all three runs (rule 2) ---------------------------------------------------


def _premise_failed(values: Sequence[float], claim: Claim) -> bool:
    return len(values) == 0 or (len(claim.written) > 0 and len(values) != len(claim.written))


def check_claim(claim: Claim, *, root: Path, committed: Run, at_size: Run, new: Run,
                cells: set[str] | None) -> ClaimResult:
    """The verdict of one claim on the rerun (rules 2-6); ``cells``: the cells the rerun
    ran when a filter cut them (None: all of the run's)."""
    full = RecordingScope(root, committed)
    try:
        committed_values = evaluate(claim, root, full)
    except Exception as exc:  # a broken claim is reported, not raised
        return ClaimResult(claim, SKIPPED, f"fails on the committed run ({_error(exc)})")
    if cells is not None:
        if frame_names(claim.expr):
            return ClaimResult(claim, SKIPPED, "reads the whole run; rerun every cell to "
                                               "check it", tuple(committed_values))
        outside = _cells_read(full) - cells
        if outside:
            return ClaimResult(claim, SKIPPED, f"reads cells not rerun ({sorted(outside)[0]}"
                               + (f" and {len(outside) - 1} more" if len(outside) > 1 else "")
                               + ")", tuple(committed_values))
    sized = RecordingScope(root, at_size)
    try:
        sized_values = evaluate(claim, root, sized)
    except Exception as exc:  # e.g. no pairs: cells or templates not rerun
        return ClaimResult(claim, SKIPPED, "does not evaluate on the committed run at this "
                           f"size ({_error(exc)})", tuple(committed_values))
    if _premise_failed(sized_values, claim) or not all(math.isfinite(v) for v in sized_values):
        return ClaimResult(claim, SKIPPED, "gives no value on the committed run at this size",
                           tuple(committed_values), tuple(sized_values))
    rerun = RecordingScope(root, new)
    base = ClaimResult(claim, NOT_REPRODUCED, "", tuple(committed_values),
                       tuple(sized_values))
    try:
        new_values = evaluate(claim, root, rerun)
    except Exception as exc:  # the rerun lacks what the claim reads
        return replace(base, reason=f"the expression fails on the rerun ({_error(exc)})")
    if _premise_failed(new_values, claim) or len(new_values) != len(sized_values):
        premise = Check("the claim's premise", "premise", "holds", "fails", NOT_REPRODUCED)
        return replace(base, reason="a condition the claim states does not hold on the rerun",
                       checks=(premise,))
    checks = [*stat_checks(full.stats, sized.stats, rerun.stats),
              *number_checks(claim, root, at_size, new, sized.returned, sized_values,
                             new_values)]
    verdict, count = combine(checks)
    return replace(base, verdict=verdict, new=tuple(new_values), checks=tuple(checks),
                   needed=count, reason=_reason(checks, verdict))


def _cells_read(scope: RecordingScope) -> set[str]:
    seen: set[str] = set()
    with scope.hushed():
        for kind, filters in scope.reads:
            try:
                frame = scope.E(**filters) if kind == "E" else scope.A(**filters)
            except (KeyError, AssertionError):
                continue
            seen |= set(frame["cell"].astype(str))
    return seen


def _error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _reason(checks: Sequence[Check], verdict: str) -> str:
    if not checks:
        return ("every number equals the committed run's at this size (the same cells "
                "and templates) within its written precision")
    deciding = [c for c in checks if c.verdict == verdict]
    return "; ".join(f"{c.label}: {c.new}" for c in deciding[:2]) + (
        f" (+{len(deciding) - 2} more)" if len(deciding) > 2 else "")


def check_claims(claims: Sequence[Claim], *, run_name: str, root: Path, committed: Run,
                 at_size: Run, new: Run, cells: set[str] | None) -> list[ClaimResult]:
    """Every claim that names this run (rule 1), with its verdict (or why it is skipped)."""
    out = []
    for claim in claims:
        reason = skip_reason(claim, run_name)
        if reason is not None:
            out.append(ClaimResult(claim, SKIPPED, reason))
        elif claim.run == run_name:
            out.append(check_claim(claim, root=root, committed=committed, at_size=at_size,
                                   new=new, cells=cells))
    return out
