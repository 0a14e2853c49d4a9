"""The budgeted-validation frontier (testbed/report/budget.py) on synthetic results:
rows, counts and medians recomputed with plain pandas, the two ends compared with the
reference policies, the figure, and nothing for a campaign without the budget policy."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from testbed.report.budget import budget_figure, budget_tables, frontier_points
from testbed.report.build import build_report
from testbed.report.load import load_run
from testbed.report.table_common import Options
from tests.testbed.report.report_fixtures import make_campaign

OPTIONS = Options(draws=200, seed=0)
BUDGETS = ["planfence_budget/b=0", "planfence_budget/b=1", "planfence_budget/b=2",
           "planfence_budget/b=1/ranking=value", "planfence_budget",
           "planfence_budget/ranking=value"]
POLICIES = ["owner_head_freshness", "planfence", *BUDGETS]


def write_run(tmp_path: Path, policies: list[str]) -> Path:
    synthetic = make_campaign("budget-t", [{"policy": policies, "rho": [1.0, 4.0],
                                            "deps": [4], "connection": ["reuse"]}])
    actions = synthetic.actions
    # Risk falls with b: b = 0 issues what owner-head freshness issues (every action
    # invalid in the fixture), b = 1 every second action, b = 2 every fourth.
    number = actions["action"].str[1:].astype(int)
    share = {"planfence_budget/b=0": 1, "planfence_budget/b=1": 2, "planfence_budget/b=2": 4,
             "planfence_budget/b=1/ranking=value": 2}
    for policy, every in share.items():
        rows = actions["policy"] == policy
        actions.loc[rows, "invalid"] = (number[rows] % every) == 0
    return synthetic.write(tmp_path / "run")


def test_the_table_lists_the_frontier_with_its_counts_and_medians(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path, POLICIES))
    (table,) = budget_tables(run, OPTIONS)
    assert table.name == "table_budget_att"
    data = table.data
    for rho in (1.0, 4.0):
        part = data[data["rho"] == rho]
        assert list(part["policy"]) == [
            "owner_head_freshness", "planfence_budget/b=0", "planfence_budget/b=1",
            "planfence_budget/b=2", "planfence_budget", "planfence_budget/b=1/ranking=value",
            "planfence_budget/ranking=value", "planfence"]
        assert list(part["b"]) == ["0", "0", "1", "2", "all", "1", "all", "all"]
        episodes = run.episodes[run.episodes["rho"] == rho]
        actions = run.actions[run.actions["rho"] == rho]
        for _, row in part.iterrows():
            mine = actions[actions["policy"] == row["policy"]]
            released = mine["outcome"] == "released"
            assert row["issued"] == released.sum()
            assert row["invalid"] == (mine["invalid"] & released).sum()
            assert row["invalid_share"] == row["invalid"] / row["issued"]
            costs = episodes[episodes["policy"] == row["policy"]]
            costs = costs[~costs["aborted"]]
            assert row["stall_ms_median"] == costs["stall_ms_per_action"].median()
            assert row["kib_median"] == costs["kib_per_action"].median()
    shares = data.set_index(["rho", "policy"])["invalid_share"]
    assert shares[(4.0, "planfence_budget/b=0")] == 1.0
    assert shares[(4.0, "planfence_budget/b=1")] > shares[(4.0, "planfence_budget/b=2")] > 0
    assert shares[(4.0, "planfence_budget")] == 0.0
    assert len(table.findings) == 4  # both ends at both rates
    assert all("which matches" in f for f in table.findings)


def test_a_differing_end_is_said_so(tmp_path: Path) -> None:
    path = write_run(tmp_path, POLICIES)
    actions = pd.read_parquet(path / "actions.parquet")
    first = actions.index[(actions["policy"] == "planfence_budget/b=0")][0]
    actions.loc[first, "invalid"] = False
    actions.to_parquet(path / "actions.parquet", index=False)
    (table,) = budget_tables(load_run(path), OPTIONS)
    assert sum("differs from Owner-head freshness" in f for f in table.findings) == 1


@pytest.mark.slow
def test_the_figure_draws_one_panel_pair_per_rho(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path, POLICIES))
    assert sorted(frontier_points(run.episodes)) == [1.0, 4.0]
    paths = budget_figure(run, tmp_path / "figures")
    assert sorted(p.name for p in paths) == ["fig_budget_frontier_att.png",
                                             "fig_budget_frontier_att.svg"]
    report = build_report(run.path, draws=50)
    assert "table_budget_att" in report["tables"]
    assert any(p.name == "fig_budget_frontier_att.png" for p in report["figures"])
    assert "Budgeted validation: share of issued actions" in report["report_md"].read_text()


def test_nothing_without_the_budget_policy(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path, ["owner_head_freshness", "planfence"]))
    assert budget_tables(run, OPTIONS) == []
    assert budget_figure(run, tmp_path / "figures") == []
