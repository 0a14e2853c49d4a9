"""The learned selector of table D.10 on small synthetic data.

The synthetic world has the paper's shape: metadata sync's stall grows with the update
rate, PlanFence's is flat, centralized lineage pays a round trip per update on slow
links; a hidden per-example disturbance (not among the features) makes some labels
unlearnable, so a learned selector must lose to the perfect oracle and, having learned
the rate boundary, beat a constant choice in distribution.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from testbed.report.selector import (
    decision_tree,
    dominates,
    evaluate,
    fixed_planfence,
    oracle,
    rate_rule,
    score,
    two_layer_mlp,
)
from testbed.report.selector_data import (
    CANDIDATES,
    FEATURES,
    build_examples,
    episode_outcomes,
    features,
    safe_target,
    split_examples,
)

NETWORKS = ("att", "tmobile", "verizon", "loopback")
RHOS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
KEYS = (8, 16, 32, 64, 128)


def _world(n: int, seed: int = 7) -> pd.DataFrame:
    """Examples as build_examples makes them, costs from a known model plus noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        cfg = {"network": str(rng.choice(NETWORKS)), "rho": float(rng.choice(RHOS)),
               "keys": int(rng.choice(KEYS)), "agents": 5, "deps": 1, "units": 64,
               "connection": "fresh"}
        feats = features(cfg)
        delay = 1.0 + feats["delay_ms"] / 20
        hidden = rng.normal(0, 0.35)  # what no feature shows
        stall = {"metadata_sync": 60 * cfg["rho"] * delay * np.exp(hidden),
                 "planfence": 150 * delay * np.exp(rng.normal(0, 0.05)),
                 "centralized_lineage": 260 * delay + 20 * cfg["rho"]}
        row = {**cfg, **feats}
        for p in CANDIDATES:
            row[f"stall_{p}"] = float(stall[p])
            row[f"kib_{p}"] = {"metadata_sync": 2.0 * cfg["rho"], "planfence": 4.0,
                               "centralized_lineage": 3.0}[p]
            row[f"eligible_{p}"] = True
        row["target"] = safe_target(row)
        rows.append(row)
    return pd.DataFrame(rows)


def test_learned_selector_loses_to_the_oracle_and_beats_a_constant_in_distribution() -> None:
    train, test = _world(400, seed=1), _world(200, seed=2)
    assert set(train["target"]) >= {"metadata_sync", "planfence"}
    best = score(test, oracle(test))
    constant = score(test, fixed_planfence(test))
    assert best.safe_pct == 100.0
    assert best.regret_p95_ms == 0.0
    for make in (decision_tree, two_layer_mlp):
        learned = make(train)
        mine = score(test, learned(test))
        assert mine.safe_pct < best.safe_pct, make.__name__
        assert mine.safe_pct > constant.safe_pct + 10, make.__name__
        assert mine.regret_p95_ms < constant.regret_p95_ms, make.__name__
    # the rule is a reference, never an oracle in this world either
    assert score(test, rate_rule(test)).safe_pct < 100.0


def test_the_target_is_the_cheapest_eligible_near_optimal_candidate() -> None:
    row = {"stall_metadata_sync": 100.0, "stall_planfence": 108.0,
           "stall_centralized_lineage": 90.0, "kib_metadata_sync": 9.0,
           "kib_planfence": 3.0, "kib_centralized_lineage": 5.0,
           "eligible_metadata_sync": True, "eligible_planfence": True,
           "eligible_centralized_lineage": False}
    # lineage is fastest but ineligible; planfence is within 10% of 100 and cheapest
    assert safe_target(row) == "planfence"
    row["eligible_centralized_lineage"] = True  # now 90 is the best: 108 > 99
    assert safe_target(row) == "centralized_lineage"
    assert safe_target({**row, **{f"eligible_{p}": False for p in CANDIDATES}}) is None


def test_split_holds_out_network_rates_and_keys_in_disjoint_blocks() -> None:
    examples = _world(600, seed=3)
    split = split_examples(examples, held_out_network="verizon")
    seen = pd.concat([split.train, split.in_distribution])
    assert "verizon" not in set(seen["network"])
    assert not set(seen["rho"]) & {0.5, 2.0, 8.0}
    assert not set(seen["keys"]) & {8, 128}
    assert (split.blocks["trace"]["network"] == "verizon").all()
    assert set(split.blocks["rates"]["rho"]) <= {0.5, 2.0, 8.0}
    assert set(split.blocks["keys"]["keys"]) <= {8, 128}
    compound = split.blocks["compound"]
    assert (compound["network"] == "verizon").all()
    assert set(compound["rho"]) <= {0.5, 2.0, 8.0}
    indices = [set(f.index) for f in (split.train, split.in_distribution,
                                      *split.blocks.values())]
    assert sum(map(len, indices)) == len(set().union(*indices))  # disjoint
    results = evaluate(split)
    assert results["oracle"]["scores"]["ood"].safe_pct == 100.0  # type: ignore[index]
    assert results["decision_tree"]["dominates"] in (True, False)
    assert dominates({}, {}, 0.0) is None


def test_features_never_name_the_network() -> None:
    a = features({"network": "att", "rho": 4, "keys": 8, "agents": 5, "deps": 1,
                  "units": 64, "connection": "fresh"})
    assert set(a) == set(FEATURES)
    assert all(isinstance(v, float) for v in a.values())
    assert a["up_kbit_log10"] < features({**{"network": "loopback", "rho": 4, "keys": 8,
                                            "agents": 5, "deps": 1, "units": 64,
                                            "connection": "fresh"}})["up_kbit_log10"]


def _frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    episodes, actions = [], []
    templates = [f"{f}-{i:02d}" for f in ("reservation", "fulfillment", "deployment")
                 for i in (1, 2)]
    for policy in CANDIDATES:
        for template in templates:
            episode = f"{policy}/{template}"
            episodes.append({"campaign": "c", "network": "att", "trace_offset_s": 0.0,
                             "rho": 4.0, "keys": 8, "agents": 5, "deps": 1, "units": 64,
                             "connection": "fresh", "tier": "compact", "batch": 1,
                             "policy": policy, "template": template, "episode": episode,
                             "aborted": False, "scheduled_actions": 2,
                             "stall_ms_per_action": {"planfence": 100.0,
                                                     "metadata_sync": 300.0,
                                                     "centralized_lineage": 95.0}[policy],
                             "kib_per_action": 1.0})
            bad = policy == "centralized_lineage" and template == "deployment-02"
            actions += [{"episode": episode, "invalid": bad and i == 0,
                         "complete": not (bad and i == 0)} for i in range(2)]
    return pd.DataFrame(episodes), pd.DataFrame(actions)


def test_examples_group_templates_round_robin_and_judge_eligibility() -> None:
    episodes, actions = _frames()
    examples = build_examples(episode_outcomes(episodes, actions), example_templates=3)
    assert len(examples) == 2
    first, second = examples.iloc[0], examples.iloc[1]
    assert first["templates"] == "deployment-01,fulfillment-01,reservation-01"
    # lineage is fastest but one of its actions was invalid in the second example
    assert first["target"] == "centralized_lineage"
    assert not second["eligible_centralized_lineage"]
    assert second["target"] == "planfence"


@pytest.mark.parametrize("n", [1, 2])
def test_a_one_class_training_set_predicts_that_class(n: int) -> None:
    world = _world(50, seed=5)
    one = world[world["target"] == world["target"].iloc[0]].head(n)
    chosen = decision_tree(one)(world.head(3))
    assert chosen == [str(one["target"].iloc[0])] * 3
