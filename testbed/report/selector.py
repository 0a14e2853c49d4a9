"""Table D.10: a learned selector of the coordination policy against the rule
"metadata sync if rho <= 1, else PlanFence", in distribution and under shift.

Rules (the data: ``testbed.report.selector_data``):

1. Selectors: the transparent rule, fixed PlanFence, a perfect oracle (the target
   itself, an upper bound) and scikit-learn models trained on the training examples
   only: a depth-3 decision tree and a two-layer MLP (standardised inputs, seeded, an
   ensemble of three seeds voting). A model whose output is not a candidate falls back
   to PlanFence (the paper's fallback).
2. Metrics per part: safe near-optimal selection (%: the chosen candidate is eligible
   and within 10% of the lowest eligible stall), the 95th percentile of stall regret
   (ms/action above the fastest eligible candidate; an ineligible choice counts with
   its own stall), and the 95th percentile of batch-one inference time (ms/query).
3. All-shift dominance: a learned selector dominates the rule if in every
   out-of-distribution block that has examples it is at least as good on both
   selection and regret and better on one, once its inference time is added to its
   regret.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.tree import DecisionTreeClassifier

from testbed.report.selector_data import (
    BLOCKS,
    CANDIDATES,
    FEATURES,
    Split,
    near_optimal,
)

FALLBACK = "planfence"
Choose = Callable[[pd.DataFrame], list[str]]


def rate_rule(examples: pd.DataFrame) -> list[str]:
    """The transparent reference: metadata sync if rho <= 1, else PlanFence."""
    return ["metadata_sync" if float(r) <= 1 else "planfence" for r in examples["rho"]]


def fixed_planfence(examples: pd.DataFrame) -> list[str]:
    return [FALLBACK] * len(examples)


def oracle(examples: pd.DataFrame) -> list[str]:
    return [str(t) for t in examples["target"]]


class LearnedSelector:
    """A scikit-learn classifier (or a seed ensemble of them) over FEATURES."""

    def __init__(self, make: Callable[[int], object], seeds: tuple[int, ...] = (0,)) -> None:
        self._make = make
        self.seeds = seeds
        self.models: list[object] = []
        self.constant: str | None = None

    def fit(self, train: pd.DataFrame) -> LearnedSelector:
        labels = train["target"].astype(str).to_numpy()
        if len(set(labels)) < 2:  # one class: nothing to separate (sklearn refuses)
            self.constant = str(labels[0]) if len(labels) else FALLBACK
            return self
        x = train[list(FEATURES)].to_numpy(dtype=float)
        for seed in self.seeds:
            model = self._make(seed)
            model.fit(x, labels)  # type: ignore[attr-defined]
            self.models.append(model)
        return self

    def __call__(self, examples: pd.DataFrame) -> list[str]:
        if self.constant is not None or examples.empty:
            return [self.constant or FALLBACK] * len(examples)
        x = examples[list(FEATURES)].to_numpy(dtype=float)
        votes = [model.predict(x) for model in self.models]  # type: ignore[attr-defined]
        out = []
        for i in range(len(examples)):
            column = [str(v[i]) for v in votes]
            best = max(sorted(set(column)), key=column.count)
            out.append(best if best in CANDIDATES else FALLBACK)
        return out


def decision_tree(train: pd.DataFrame) -> LearnedSelector:
    return LearnedSelector(lambda seed: DecisionTreeClassifier(max_depth=3,
                                                               random_state=seed)).fit(train)


def two_layer_mlp(train: pd.DataFrame) -> LearnedSelector:
    return LearnedSelector(lambda seed: make_pipeline(
        StandardScaler(), MLPClassifier(hidden_layer_sizes=(32, 32), max_iter=2000,
                                        random_state=seed)), seeds=(0, 1, 2)).fit(train)


@dataclass(frozen=True)
class Score:
    examples: int
    safe_pct: float  # nan without examples
    regret_p95_ms: float

    def as_dict(self) -> dict[str, float]:
        return {"examples": self.examples, "safe_pct": self.safe_pct,
                "regret_p95_ms": self.regret_p95_ms}


def score(examples: pd.DataFrame, choices: list[str]) -> Score:
    """Rule 2's selection and regret metrics of ``choices`` on ``examples``."""
    if examples.empty:
        return Score(0, float("nan"), float("nan"))
    safe, regret = [], []
    for (_, row), choice in zip(examples.iterrows(), choices, strict=True):
        near = near_optimal(row)
        safe.append(choice in near)
        eligible = [p for p in CANDIDATES if bool(row[f"eligible_{p}"])]
        best = min(float(row[f"stall_{p}"]) for p in eligible)
        regret.append(max(0.0, float(row[f"stall_{choice}"]) - best))
    return Score(len(examples), 100.0 * float(np.mean(safe)),
                 float(np.percentile(regret, 95)))


def inference_p95_ms(choose: Choose, examples: pd.DataFrame, repeats: int = 200) -> float:
    """Batch-one inference time, 95th percentile (ms/query)."""
    if examples.empty:
        return float("nan")
    samples = []
    for i in range(repeats):
        one = examples.iloc[[i % len(examples)]]
        started = time.perf_counter()
        choose(one)
        samples.append((time.perf_counter() - started) * 1000)
    return float(np.percentile(samples, 95))


def evaluate(split: Split) -> dict[str, dict[str, object]]:
    """Every selector of rule 1 scored on every part of the split (rules 2, 3)."""
    selectors: dict[str, tuple[Choose, bool]] = {
        "rate_rule": (rate_rule, False), "fixed_planfence": (fixed_planfence, False),
        "oracle": (oracle, False), "decision_tree": (decision_tree(split.train), True),
        "two_layer_mlp": (two_layer_mlp(split.train), True)}
    parts = {"in_distribution": split.in_distribution, **split.blocks}
    pooled = pd.concat([b for b in split.blocks.values()]) if split.blocks else \
        split.in_distribution.iloc[:0]
    results: dict[str, dict[str, object]] = {}
    for name, (choose, learned) in selectors.items():
        scores = {part: score(frame, choose(frame)) for part, frame in parts.items()}
        scores["ood"] = score(pooled, choose(pooled))
        infer = inference_p95_ms(choose, split.in_distribution) if learned else float("nan")
        results[name] = {"scores": scores, "inference_p95_ms": infer, "learned": learned}
    rule = results["rate_rule"]["scores"]
    assert isinstance(rule, dict)
    for result in results.values():
        if result["learned"]:
            mine = result["scores"]
            assert isinstance(mine, dict)
            result["dominates"] = dominates(mine, rule, float(result["inference_p95_ms"]))  # type: ignore[arg-type]
    return results


def dominates(mine: Mapping[str, Score], rule: Mapping[str, Score], inference_ms: float
              ) -> bool | None:
    """Rule 3; None when no out-of-distribution block has examples."""
    verdicts = []
    for block in BLOCKS:
        a, b = mine.get(block), rule.get(block)
        if a is None or b is None or a.examples == 0:
            continue
        regret = a.regret_p95_ms + inference_ms
        no_worse = a.safe_pct >= b.safe_pct and regret <= b.regret_p95_ms
        better = a.safe_pct > b.safe_pct or regret < b.regret_p95_ms
        verdicts.append(no_worse and better)
    return all(verdicts) if verdicts else None
