"""The live tables (testbed/report/tables_live.py) on hand-made result frames whose every
count is known: Table 1(b), C.2, C.4's endpoint, the costs and appendix F's live cohort;
scheduled tasks stay in every denominator, and a stand-in run says so in every legend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from testbed.report.load import Run, with_action_counts
from testbed.report.table_common import Options
from testbed.report.tables import build_tables
from testbed.report.tables_live import STAND_IN_NOTE, live_tables
from testbed.results.summary import _setting

OPTIONS = Options(draws=50, seed=0)
CELL: dict[str, Any] = {"campaign": "l", "network": "loopback", "backend": "none",
                        "trace_offset_s": 0.0, "connection": "fresh", "agents": 5, "keys": 8,
                        "deps": 1, "rho": 4.0, "tier": "compact", "units": 64, "batch": 1}
QUIET = {"auditor_actions": 0, "redundant_auditor_actions": 0, "auditor_incorrect": 0,
         "model_failures": 0, "corrections": 0, "overlap_confirmed": None, "replans": 0,
         "plan_from_initial": False, "executor_held_revision": True, "role_calls": 4,
         "completions": 4, "prompt_tokens": 300, "completion_tokens": 20, "task_s": 1.0,
         "role_call_ms_p50": 10.0, "replan_call_ms": None, "block_reason": ""}


def task(n: int, policy: str, primary: str, *, inputs: str = "local", overlap: str = "none",
         aborted: bool = False, **live: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    key = f"{policy}-{inputs}-{overlap}/t{n:02d}"
    study = {"executor_inputs": inputs, "overlap": overlap}
    episode = {**CELL, "episode": key, "policy": policy, "family": "reservation",
               "template": f"reservation-{n:02d}", "scheduled_actions": 1,
               "attempted_actions": 0 if aborted else 1, "aborted": aborted,
               "abort_reason": "initialization: RpcTimeout" if aborted else None,
               "stall_ms_per_action": 1.0, "kib_per_action": 4.0, "model_bytes": 2048,
               **study}
    if aborted:
        return episode, None
    row = {**QUIET, **live}
    row["task_success"] = row.get("task_success", primary == "correct"
                                  and row["auditor_incorrect"] == 0
                                  and row["model_failures"] == 0)
    action = {**CELL, "episode": key, "policy": policy, "action": "act000",
              "outcome": "released" if primary in ("correct", "obsolete", "incorrect")
              else "blocked", "invalid": primary == "obsolete", "primary_outcome": primary,
              **study, **row}
    return episode, action


def make_run(rows: list[tuple[dict[str, Any], dict[str, Any] | None]], *,
             stand_in: bool = True, kind: str = "live") -> Run:
    ep = pd.DataFrame([e for e, _ in rows])
    ac = pd.DataFrame([a for _, a in rows if a is not None])
    ep["cell"] = ep["episode"].str.split("/").str[0]
    ac["cell"] = ac["episode"].str.split("/").str[0]
    manifest = {"campaign": "l", "config": {"kind": kind},
                "model": {"stand_in": stand_in, "model": "m"}}
    return Run(Path("."), manifest, ac, with_action_counts(ep, ac))


def c2_rows() -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    return [
        task(1, "owner_head_freshness", "obsolete", plan_from_initial=True),
        task(2, "owner_head_freshness", "obsolete", plan_from_initial=True,
             auditor_actions=1, auditor_incorrect=0),
        task(3, "owner_head_freshness", "", aborted=True),
        task(4, "owner_head_freshness", "correct", inputs="fresh", plan_from_initial=True,
             auditor_actions=1, auditor_incorrect=1),
        task(5, "owner_head_freshness", "correct", inputs="fresh", plan_from_initial=True),
        task(6, "owner_head_freshness", "obsolete", inputs="fresh", plan_from_initial=True,
             executor_held_revision=False),
        task(7, "planfence", "correct", replans=1, replan_call_ms=40.0, auditor_actions=1,
             redundant_auditor_actions=1),
        task(8, "planfence", "correct", replans=1, replan_call_ms=60.0),
        task(9, "planfence", "model_failure", replans=0, model_failures=1, corrections=1,
             role_calls=3),
        task(10, "planfence", "blocked", replans=1, role_calls=3,
             block_reason="stale after replan: req"),
    ]


def by_arm(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.set_index(["policy", "executor_inputs"])


def row(frame: pd.DataFrame, key: tuple[str, str]) -> dict[str, Any]:
    return {str(k): v for k, v in frame.loc[[key]].iloc[0].items()}


def test_table_1b_counts_every_scheduled_task_per_arm() -> None:
    tables = {t.name: t for t in live_tables(make_run(c2_rows()), OPTIONS)}
    assert set(tables) == {"table_1b_loopback", "table_c2_loopback", "table_c4_loopback",
                           "table_live_costs_loopback"}
    table = tables["table_1b_loopback"]
    data = by_arm(table.data)
    fresh = row(data, ("owner_head_freshness", "local"))
    assert (fresh["tasks"], fresh["task_success"], fresh["invalid_primary"],
            fresh["primary_obsolete"], fresh["infra"]) == (3, 0, 2, 2, 1)
    planfence = row(data, ("planfence", "local"))
    assert (planfence["tasks"], planfence["task_success"], planfence["successful_replans"],
            planfence["redundant_auditor_actions"], planfence["model_failures"],
            planfence["primary_model_failure"], planfence["primary_correct"],
            planfence["primary_blocked"]) == (4, 2, 2, 1, 1, 1, 2, 1)
    control = row(data, ("owner_head_freshness", "fresh"))
    assert (control["primary_correct"], control["primary_obsolete"],
            control["task_success"]) == (2, 1, 1)
    # arms in the paper's order, the fresh control right after its policy
    assert [r[0].text for r in table.rows] == [
        "Owner-head freshness", "Owner-head freshness, fresh before generation", "PlanFence"]
    assert [r[1].text for r in table.rows] == ["0/3", "1/3", "2/4"]
    assert STAND_IN_NOTE in table.legend


def test_c2_counts_the_adapted_primary_and_the_auditor_that_undoes_it() -> None:
    tables = {t.name: t for t in live_tables(make_run(c2_rows()), OPTIONS)}
    data = by_arm(tables["table_c2_loopback"].data)
    control = row(data, ("owner_head_freshness", "fresh"))
    assert (control["correct_primary"], control["task_success"],
            control["incorrect_auditor_actions"]) == (2, 1, 1)
    assert data.loc[("owner_head_freshness", "local"), "correct_primary"] == 0


def test_c4_splits_stale_plans_by_what_the_executor_held_and_did() -> None:
    tables = {t.name: t for t in live_tables(make_run(c2_rows()), OPTIONS)}
    data = by_arm(tables["table_c4_loopback"].data)
    fresh = row(data, ("owner_head_freshness", "local"))
    assert (fresh["stale_plan"], fresh["fresh_memory_stale_plan_incorrect"],
            fresh["fresh_memory_stale_plan_correct"], fresh["current_plan"]) == (2, 2, 0, 0)
    control = row(data, ("owner_head_freshness", "fresh"))
    assert (control["stale_plan"], control["fresh_memory_stale_plan_correct"],
            control["obsolete_memory_incorrect"]) == (3, 2, 1)
    assert data.loc[("planfence", "local"), "current_plan"] == 4


def test_c4_a_correct_action_from_a_stale_plan_without_the_revision_is_not_fresh_memory(
        ) -> None:
    rows = [task(1, "owner_head_freshness", "correct", plan_from_initial=True,
                 executor_held_revision=False),
            task(2, "owner_head_freshness", "correct", plan_from_initial=True)]
    tables = {t.name: t for t in live_tables(make_run(rows), OPTIONS)}
    fresh = row(by_arm(tables["table_c4_loopback"].data), ("owner_head_freshness", "local"))
    assert (fresh["stale_plan"], fresh["fresh_memory_stale_plan_correct"],
            fresh["obsolete_memory_incorrect"], fresh["current_plan"]) == (2, 1, 0, 0)


def test_the_costs_are_per_arm_and_count_every_completion() -> None:
    tables = {t.name: t for t in live_tables(make_run(c2_rows()), OPTIONS)}
    data = by_arm(tables["table_live_costs_loopback"].data)
    planfence = row(data, ("planfence", "local"))
    assert planfence["completions"] == 16
    assert planfence["replan_call_ms_median"] == 50.0
    assert planfence["corrections"] == 1
    assert planfence["model_kib_median"] == 2.0
    assert planfence["tokens_median"] == 320


def test_the_live_cohort_counts_confirmed_overlaps_and_blocks_after_a_replan() -> None:
    rows = [task(i, policy, "blocked", overlap="in_generation", replans=1,
                 overlap_confirmed=i != 2, block_reason="stale after replan: req")
            for policy in ("planfence", "centralized_lineage") for i in range(1, 4)]
    rows.append(task(4, "planfence", "blocked", overlap="in_generation", replans=0,
                     overlap_confirmed=False, block_reason="rpc timeout"))
    rows += [task(i, "planfence", "correct", replans=1) for i in (5, 6)]
    tables = {t.name: t for t in live_tables(make_run(rows, stand_in=False), OPTIONS)}
    assert "table_f_live_loopback" in tables
    assert "table_c2_loopback" not in tables
    data = tables["table_f_live_loopback"].data.set_index(["policy", "overlap"])
    overlapped = row(data, ("planfence", "in_generation"))
    assert (overlapped["attempts"], overlapped["overlap_confirmed"],
            overlapped["blocked_after_replan"], overlapped["effect_correct_primary"]) == \
        (4, 2, 3, 0)
    control = row(data, ("planfence", "none"))
    assert (control["attempts"], control["effect_correct_primary"]) == (2, 2)
    assert pd.isna(control["overlap_confirmed"])
    assert data.loc[("centralized_lineage", "in_generation"), "blocked_after_replan"] == 3
    # the 1(b) layout is about the overlap-free tasks only
    table_1b = by_arm(tables["table_1b_loopback"].data)
    assert table_1b.loc[("planfence", "local"), "tasks"] == 2
    assert "centralized_lineage" not in table_1b.index.get_level_values(0)
    assert all(STAND_IN_NOTE not in t.legend for t in tables.values())


def test_only_a_live_run_has_live_tables() -> None:
    run = make_run(c2_rows(), kind="episodes")
    assert live_tables(run, OPTIONS) == []
    names = [t.name for t in build_tables(make_run(c2_rows()), draws=10, seed=0)]
    assert "table_1b_loopback" in names


def test_the_run_summary_tells_the_live_arms_and_conditions_apart() -> None:
    settings = [_setting(pd.Series({"executor_inputs": inputs, "overlap": overlap,
                                    "batch": 1}))
                for inputs, overlap in (("local", "none"), ("fresh", "none"),
                                        ("local", "in_generation"))]
    assert settings == ["", "fresh before generation", "update in generation"]
