"""The study tables (F.1, G.1, D.8, the artifact tier, explainable costs) and the paper's
H.1 statistic, on small hand-made result frames whose every count is known."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from testbed.report.load import Run, with_action_counts
from testbed.report.stats import ratio_median
from testbed.report.table_common import Options
from testbed.report.tables import build_tables
from testbed.report.tables_costs import artifact_tables, batch_tables, cost_tables
from testbed.report.tables_trials import handoff_tables, replanning_tables

OPTIONS = Options(draws=200, seed=0)
CELL: dict[str, Any] = {"campaign": "t", "network": "att", "backend": "userspace",
                        "trace_offset_s": 0.0, "connection": "fresh", "agents": 5, "keys": 8,
                        "deps": 1, "rho": 4.0, "tier": "compact", "units": 64, "batch": 1}


def make_run(episodes: list[dict[str, Any]], actions: list[dict[str, Any]],
             kind: str = "episodes") -> Run:
    ep = pd.DataFrame([{**CELL, "aborted": False, "abort_reason": None, **e}
                       for e in episodes])
    ac = pd.DataFrame([{**CELL, **a} for a in actions])
    ep["cell"] = ep["policy"] + ep["episode"].str.split("/").str[0]
    ac["cell"] = ac["episode"].map(dict(zip(ep["episode"], ep["cell"], strict=True)))
    manifest = {"campaign": "t", "config": {"kind": kind} if kind != "episodes" else {}}
    return Run(Path("."), manifest, ac, with_action_counts(ep, ac))


def trial(policy: str, n: int, outcome: str, *, reason: str = "", replans: int = 1,
          invalid: bool = False, aborted: bool = False, **study: Any
          ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    key = f"{policy}-{'-'.join(map(str, study.values()))}/t{n:02d}"
    episode = {"episode": key, "policy": policy, "family": "reservation",
               "template": f"reservation-{n:02d}", "scheduled_actions": 1,
               "attempted_actions": 0 if aborted else 1, "aborted": aborted,
               "abort_reason": "initialization: RpcTimeout" if aborted else None,
               "stall_ms_per_action": 1.0, "kib_per_action": 1.0, **study}
    if aborted:
        return episode, None
    released = outcome in ("complete", "gap", "stale", "invalid")
    action = {"episode": key, "policy": policy, "action": "act000",
              "outcome": "released" if released else "blocked", "invalid": invalid,
              "trial_outcome": outcome, "replans": replans, "block_reason": reason,
              "gap_ms": 5.0 if outcome == "gap" else None, **study}
    return episode, action


def collect(rows: list[tuple[dict[str, Any], dict[str, Any] | None]]
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return [e for e, _ in rows], [a for _, a in rows if a is not None]


def test_f1_counts_each_outcome_per_row_and_policy() -> None:
    rows = []
    study = {"replan_delay_s": 2.0, "update_rate_per_s": 1.0, "update_target": "relevant"}
    outcomes = ["complete"] * 3 + ["block"] * 4 + ["gap", "stale"]
    for i, outcome in enumerate(outcomes):
        reason = "stale after replan: k000 changed again" if outcome == "block" else ""
        rows.append(trial("planfence", i, outcome, reason=reason, **study))
    rows.append(trial("planfence", 20, "", aborted=True, **study))
    control = {"replan_delay_s": 2.0, "update_rate_per_s": 2.0, "update_target": "unrelated"}
    rows += [trial("centralized_lineage", i, "complete", **control) for i in range(2)]
    run = make_run(*collect(rows), kind="replanning")
    (table,) = replanning_tables(run, OPTIONS)
    data = table.data.set_index(["update_target", "replan_delay_s", "update_rate_per_s"])
    row = data.loc[("relevant", 2.0, 1.0)]
    assert (row["planfence_trials"], row["planfence_complete"], row["planfence_block"],
            row["planfence_infra"], row["planfence_gap"], row["planfence_stale"]) == \
        (10, 3, 4, 1, 1, 1)
    assert data.loc[("unrelated", 2.0, 2.0)]["centralized_lineage_complete"] == 2
    assert any("stale after replan 4" in f for f in table.findings)
    assert any("initialization 1" in f for f in table.findings)
    assert [t.name for t in build_tables(run, draws=10, seed=0)] == ["table_f1_att"]


def test_g1_detects_and_counts_invalid_issues_per_scenario() -> None:
    rows = []
    for i in range(5):
        rows.append(trial("session_read_set", i, "invalid", replans=0, invalid=True,
                          scenario="handoff"))
        rows.append(trial("inherited_version_set", i, "complete", scenario="handoff"))
        rows.append(trial("planfence", i, "complete", replans=0, scenario="unchanged"))
    rows.append(trial("planfence", 9, "", aborted=True, scenario="handoff"))
    run = make_run(*collect(rows), kind="handoff")
    (table,) = handoff_tables(run, OPTIONS)
    data = table.data.set_index(["scenario", "policy"])
    assert tuple(data.loc[("handoff", "session_read_set"),
                          ["detected", "issued", "invalid", "valid_completion"]]) == (0, 5, 5, 0)
    assert tuple(data.loc[("handoff", "inherited_version_set"),
                          ["detected", "invalid", "valid_completion"]]) == (5, 0, 5)
    assert data.loc[("handoff", "planfence"), "infra"] == 1
    unchanged = [r for r in table.rows if r[0].text == "PlanFence" and r[1].text == "–"]
    assert unchanged  # the control has no detection column


def _episode(policy: str, n: int, stall: float, **extra: Any) -> dict[str, Any]:
    return {"episode": f"{policy}-{extra.get('batch', 1)}-{extra.get('connection', 'f')}"
                       f"-{extra.get('tier', 'c')}-{extra.get('rho', 4)}/t{n}",
            "policy": policy, "family": ["reservation", "fulfillment", "deployment"][n % 3],
            "template": f"x-{n:02d}", "scheduled_actions": 1, "attempted_actions": 1,
            "stall_ms_per_action": stall, "kib_per_action": 8.0, **extra}


def _action(episode: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"episode": episode["episode"], "policy": episode["policy"], "action": "act000",
            "outcome": "released", "invalid": False, "replans": 1,
            "stall_ms": episode["stall_ms_per_action"], **{k: v for k, v in episode.items()
                                                           if k in CELL}, **extra}


def test_d8_reports_each_batch_and_the_spread_between_fresh_batches() -> None:
    episodes = []
    for batch, connection, pf, bk in ((1, "fresh", 250, 330), (1, "reuse", 220, 260),
                                      (2, "fresh", 260, 340), (3, "fresh", 240, 320)):
        for n in range(3):
            episodes.append(_episode("planfence", n, pf + n, batch=batch,
                                     connection=connection))
            episodes.append(_episode("batched_all_key", n, bk + n, batch=batch,
                                     connection=connection))
    run = make_run(episodes, [_action(e) for e in episodes])
    (table,) = batch_tables(run, OPTIONS)
    data = table.data.set_index(["batch", "connection"])
    assert data.loc[(2, "fresh"), "planfence_stall_ms_median"] == 261
    assert data.loc[(1, "reuse"), "planfence_reduction_vs_batched"] == pytest.approx(
        1 - 221 / 261)
    spread = next(f for f in table.findings if f.startswith("PlanFence:"))
    assert "241.0-261.0" in spread
    assert "spread 8.0%" in spread  # (261 - 241) / 251


def test_e1_shows_rounds_connections_and_the_stall_of_actions_opening_one() -> None:
    episodes, actions = [], []
    for n in range(4):
        for policy, conns in (("planfence", (1, 0)), ("batched_all_key", (4, 0))):
            e = _episode(policy, n, 300.0, connection="reuse", planning_bytes=4096,
                         query_bytes=512, fetch_bytes=2048, revalidation_bytes=512,
                         commit_bytes=0, barrier_bytes=0, kib_per_action_payload=6.0)
            e["attempted_actions"] = 2
            episodes.append(e)
            for i, c in enumerate(conns):
                actions.append(_action(e, action=f"act{i:03d}", rounds=3, connections=c,
                                       stall_ms=600.0 if c else 300.0, query_ms=100.0,
                                       fetch_ms=100.0, revalidation_ms=100.0))
    run = make_run(episodes, actions)
    (table,) = cost_tables(run, OPTIONS)
    data = table.data.set_index("policy")
    assert data.loc["planfence", "rounds_per_action"] == 3
    assert data.loc["planfence", "share_opening"] == 0.5
    assert data.loc["batched_all_key", "connections_per_action"] == 2
    assert data.loc["planfence", "stall_ms_opening"] == 600
    assert data.loc["planfence", "planning_kib_per_action"] == 2.0
    assert "(a tie)" in table.findings[0]


def test_artifact_table_counts_fetched_artifacts_per_changed_action() -> None:
    episodes, actions = [], []
    for n in range(3):
        for tier, fetched in (("compact", 3000), ("artifact", 300 * 1024)):
            e = _episode("planfence", n, 100.0, tier=tier, planning_bytes=600 * 1024)
            episodes.append(e)
            actions.append(_action(e, fetch_bytes=fetched))
    run = make_run(episodes, actions)
    (table,) = artifact_tables(run, OPTIONS)
    record = table.data.iloc[0]
    assert record["artifact_fetches_per_changed_action"] == 1
    assert record["artifact_planning_crossings_per_action"] == pytest.approx(600 / 288)
    assert any("1x in 3 actions" in f for f in table.findings)


def test_ratio_median_is_the_median_of_per_template_ratios() -> None:
    pairs = pd.DataFrame({"a": [1.0, 2.0, 9.0], "b": [2.0, 2.0, 3.0]})
    result = ratio_median(pairs, draws=500)
    assert result is not None
    assert result.median == 1.0  # ratios 0.5, 1, 3: not 2.0 / 2.0 of the medians' ratio
    assert result.low <= 1.0 <= result.high
    assert ratio_median(pairs.iloc[:0]) is None
