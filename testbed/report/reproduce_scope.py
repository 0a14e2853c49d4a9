"""The claim scope of ``testbed reproduce``: a run given as frames, the statistics an
expression computes noted with their intervals (docs/reproduce.md, "Verdicts";
``testbed.report.reproduce_claims`` applies the rules).

Rules this module obeys:

1. :class:`RecordingScope` is :class:`testbed.report.claims.Scope` over a given run: it
   computes exactly what the claim machinery computes and, beside it, notes every
   ``change``, ``ratio`` and ``median`` (so ``stall`` and ``kib``) with its 95%
   interval and the number of templates behind it, and every selection an expression
   makes (``E``, ``A``, the pairs of a change).
2. A change's interval is the report's two-stage one; a ratio's the paper's one-stage
   one (``stats.ratio_median``); a median's comes from resampling templates
   (:func:`median_interval`), strata (trace offsets) kept as ``stats.row_median`` keeps
   them.
3. With ``stubs`` the statistics return the given values instead (numbers of a claim
   resampled with its statistics held).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from testbed.report.claims import STRATA, Scope
from testbed.report.load import Run
from testbed.report.stats import INTERVAL, cost_episodes, ratio_median

MEDIAN_DRAWS = 1_000
FRAME_NAMES = frozenset({"e", "a", "episodes"})

Key = tuple[Any, ...]


@dataclass(frozen=True)
class Stat:
    """A statistic an expression computed: a change or ratio as a fraction (ratio - 1),
    or a median as measured, with its 95% interval over ``n`` templates."""

    kind: str  # change | ratio | median
    label: str
    value: float
    low: float
    high: float
    n: int

    def text(self) -> str:
        if self.kind == "median":
            return f"{self.value:.4g} [{self.low:.4g}, {self.high:.4g}]"
        if self.kind == "ratio":
            return f"{1 + self.value:.3f} [{1 + self.low:.3f}, {1 + self.high:.3f}]"
        return f"{100 * self.value:+.1f}% [{100 * self.low:+.1f}%, {100 * self.high:+.1f}%]"


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple, set, frozenset, np.ndarray, pd.Series)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def _describe(filters: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in filters.items())


def median_interval(episodes: pd.DataFrame, metric: str, strata: Sequence[str], *,
                    draws: int = MEDIAN_DRAWS, seed: int = 0) -> tuple[float, float, int]:
    """95% interval of a row median (``stats.row_median``: the median of per-stratum
    medians) by resampling templates; (low, high, templates). NaN below two templates."""
    costs = cost_episodes(episodes)
    costs = costs.loc[np.isfinite(costs[metric].astype(float))]
    codes, templates = pd.factorize(costs["template"])
    n = len(templates)
    if n < 2:
        return float("nan"), float("nan"), n
    keys = [c for c in strata if c in costs.columns]
    multi = bool(keys) and costs[keys].drop_duplicates().shape[0] > 1
    stratum = (costs.groupby(keys, dropna=False).ngroup().to_numpy() if multi
               else np.zeros(len(costs), dtype=int))
    values = costs[metric].to_numpy(dtype=float)
    picks = np.random.default_rng(seed).integers(0, n, size=(draws, n))
    if not multi and (np.bincount(codes, minlength=n) == 1).all():
        per_template = np.empty(n)
        per_template[codes] = values
        medians = np.median(per_template[picks], axis=1)
    else:
        cells = [[values[(codes == t) & (stratum == s)] for t in range(n)]
                 for s in range(int(stratum.max()) + 1)]
        medians = np.empty(draws)
        for i, row in enumerate(picks):
            per = [np.concatenate([by[t] for t in row]) for by in cells]
            medians[i] = np.median([np.median(p) for p in per if p.size])
    low, high = np.percentile(medians, INTERVAL)
    return float(low), float(high), n


class RecordingScope(Scope):
    """The claim scope over a given run that notes what the expression computes (rule
    2) and what it reads; with ``stubs`` its statistics return those values instead
    (rule 5: numbers resampled with the statistics held)."""

    def __init__(self, root: Path, run: Run, *, stubs: Mapping[Key, Any] | None = None) -> None:
        self.root = root
        self.run = run
        self.stubs = stubs
        self.stats: dict[Key, Stat] = {}
        self.returned: dict[Key, Any] = {}
        self.reads: list[tuple[str, dict[str, Any]]] = []
        self.quiet = 0

    @contextmanager
    def hushed(self) -> Iterator[None]:
        self.quiet += 1
        try:
            yield
        finally:
            self.quiet -= 1

    def E(self, **filters: Any) -> pd.DataFrame:
        if not self.quiet:
            self.reads.append(("E", filters))
        return super().E(**filters)

    def A(self, **filters: Any) -> pd.DataFrame:
        if not self.quiet:
            self.reads.append(("A", filters))
        return super().A(**filters)

    def _paired_reads(self, a: Any, b: Any, kw: Mapping[str, Any]) -> None:
        filters = {k: v for k, v in kw.items() if k not in ("metric", "vary")}
        self.reads.append(("E", {**filters, str(kw.get("vary", "policy")): [a, b]}))

    def change(self, a: Any, b: Any, **kw: Any) -> list[float]:
        key = ("change", a, b, _freeze(kw))
        if self.stubs is not None:
            return list(self.stubs[key])
        self._paired_reads(a, b, kw)
        with self.hushed():
            value = super().change(a, b, **kw)
            n = len(self.pairs(a, b, **kw))
        label = f"change {a} vs {b}" + (f" ({_describe(kw)})" if kw else "")
        self.stats[key] = Stat("change", label, value[0] / 100, value[1] / 100,
                               value[2] / 100, n)
        self.returned[key] = value
        return value

    def ratio(self, a: Any, b: Any, **kw: Any) -> float:
        key = ("ratio", a, b, _freeze(kw))
        if self.stubs is not None:
            return float(self.stubs[key])
        self._paired_reads(a, b, kw)
        with self.hushed():
            summary = ratio_median(self.pairs(a, b, **kw))
        assert summary is not None, f"no pairs for {a} vs {b} {kw}"
        label = f"ratio {a} / {b}" + (f" ({_describe(kw)})" if kw else "")
        self.stats[key] = Stat("ratio", label, summary.median - 1, summary.low - 1,
                               summary.high - 1, summary.pairs)
        self.returned[key] = summary.median
        return summary.median

    def median(self, metric: str, **filters: Any) -> float:
        key = ("median", metric, _freeze(filters))
        if self.stubs is not None:
            return float(self.stubs[key])
        value = super().median(metric, **filters)
        with self.hushed():
            low, high, n = median_interval(self.E(**filters), metric, STRATA)
        self.stats[key] = Stat("median", f"median {metric} ({_describe(filters)})", value,
                               low, high, n)
        self.returned[key] = value
        return value



# --- what an expression reads -----------------------------------------------------------


def frame_names(expr: str) -> set[str]:
    """The whole-run frames (``e``, ``a``, ``episodes``) an expression reads, not counting
    lambda parameters or comprehension variables of the same name."""
    found: set[str] = set()

    def visit(node: ast.AST, bound: frozenset[str]) -> None:
        if isinstance(node, ast.Lambda):
            args = node.args
            names = {x.arg for x in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
            visit(node.body, bound | names)
            return
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner = set(bound)
            for gen in node.generators:
                visit(gen.iter, frozenset(inner))
                inner |= {n.id for n in ast.walk(gen.target) if isinstance(n, ast.Name)}
                for cond in gen.ifs:
                    visit(cond, frozenset(inner))
            parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            for part in parts:
                visit(part, frozenset(inner))
            return
        if isinstance(node, ast.Name) and node.id in FRAME_NAMES and node.id not in bound:
            found.add(node.id)
        for child in ast.iter_child_nodes(node):
            visit(child, bound)

    visit(ast.parse(expr.strip(), mode="eval"), frozenset())
    return found
