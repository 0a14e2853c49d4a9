"""Precision arithmetic (pure): the verdict against the tie band, resolution, the family
floor, the fitted resolution curve, the --until-resolved growth rule, the attempt plans
and verdicts, the report's attempt collapse, and the disturbance verdict."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from testbed.report.attempts import collapse
from testbed.report.sizing import Curve, Size, fit_curve, next_size, repeat_scale
from testbed.report.stats import (
    compare,
    family_floor,
    half_width,
    interval_verdict,
    practical_tie,
    tie_band,
)
from testbed.results.rundir import Attempt, split_shard_name
from testbed.run.attempts import AttemptPolicy, Slot, plan_episode, verdict_attempt
from testbed.run.disturbance import HostSample, host_columns

# --- verdict and resolution ------------------------------------------------------------------


def test_the_tie_band_is_the_practical_tie_rule_on_the_relative_change() -> None:
    low, high = tie_band()
    assert low == pytest.approx(-0.10)
    assert high == pytest.approx(1 / 0.9 - 1)
    b = 100.0
    for change in (-0.0999, 0.111, 0.0, -0.05):
        assert practical_tie(b * (1 + change), b)
    for change in (-0.1001, 0.1112):
        assert not practical_tie(b * (1 + change), b)


@pytest.mark.parametrize(("low", "high", "verdict"), [
    (-0.40, -0.12, "lower"),
    (-0.40, -0.10, "lower"),        # touching the band's edge from below: still outside
    (0.12, 0.50, "higher"),
    (-0.08, 0.10, "tie"),
    (-0.15, 0.05, "unresolved"),    # straddles the lower edge
    (0.05, 0.20, "unresolved"),     # straddles the upper edge
    (-0.50, 0.50, "unresolved"),    # covers the whole band
    (float("nan"), 0.1, "unresolved"),
])
def test_verdict_reads_the_interval_against_the_band(low: float, high: float,
                                                      verdict: str) -> None:
    assert interval_verdict(low, high) == verdict


def test_resolution_is_the_half_width() -> None:
    assert half_width(-0.3, 0.1) == pytest.approx(0.2)
    assert math.isnan(half_width(float("nan"), 0.1))


def _pairs(a: list[float], b: list[float], families: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"family": families, "template": [f"t{i}" for i in range(len(a))],
                         "a": a, "b": b})


def test_a_wide_interval_is_unresolved_not_a_win_even_when_the_point_change_is_large() -> None:
    rng = np.random.default_rng(1)
    b = rng.uniform(800, 2000, 9)
    a = b * rng.choice([0.4, 1.3], 9)  # half the templates much lower, half higher
    result = compare(_pairs(list(a), list(b), ["f1", "f2", "f3"] * 3), draws=2000)
    assert result is not None
    assert result.verdict == "unresolved"
    assert result.resolution == pytest.approx((result.change_high - result.change_low) / 2)
    assert result.resolution > 0.1


def test_a_consistent_difference_is_resolved_and_a_consistent_tie_is_a_tie() -> None:
    b = [1000.0 + 37 * i for i in range(12)]
    lower = compare(_pairs([x * 0.6 for x in b], b, ["f1", "f2", "f3"] * 4), draws=2000)
    tie = compare(_pairs([x * 1.01 for x in b], b, ["f1", "f2", "f3"] * 4), draws=2000)
    assert lower is not None
    assert lower.verdict == "lower"
    assert tie is not None
    assert tie.verdict == "tie"


def test_the_family_floor_is_what_resampling_families_alone_leaves() -> None:
    b = [1000.0] * 12
    same = _pairs([600.0] * 12, b, ["f1", "f2", "f3"] * 4)
    assert family_floor(same, draws=2000) == pytest.approx(0.0)
    a = [600.0 if f == "f1" else 1000.0 for f in ["f1", "f2", "f3"] * 4]
    split = _pairs(a, b, ["f1", "f2", "f3"] * 4)
    assert family_floor(split, draws=2000) > 0.1


# --- the resolution curve and the growth rule --------------------------------------------------


def test_fit_recovers_a_square_root_law_and_a_floor() -> None:
    points = [(n, math.sqrt(0.05 ** 2 + 0.6 ** 2 / n)) for n in (6, 9, 12, 15, 30)]
    curve = fit_curve(points)
    assert curve is not None
    assert curve.floor == pytest.approx(0.05, abs=1e-6)
    assert curve.term == pytest.approx(0.6, abs=1e-6)
    assert curve.templates_for(0.10) == math.ceil(0.36 / (0.01 - 0.0025))
    assert curve.templates_for(0.04) is None  # below the floor


def test_fit_of_a_flat_resolution_is_all_floor() -> None:
    curve = fit_curve([(6, 0.30), (12, 0.31), (30, 0.29)])
    assert curve is not None
    assert curve.floor == pytest.approx(0.30, abs=0.01)
    assert curve.term == pytest.approx(0.0, abs=1e-9) or curve.templates_for(0.2) is None


def test_repeats_only_average_away_the_rerun_noise() -> None:
    assert repeat_scale(0.5, None, 1, 4) == 1.0
    scale = repeat_scale(0.5, 0.2, 1, 4)
    assert math.sqrt(0.5 ** 2 - 2 * 0.04) / 0.5 < scale < 1.0
    assert repeat_scale(0.5, 0.2, 1, 1) == pytest.approx(1.0)


def test_growth_adds_templates_first_then_repeats_then_stops_at_the_cap() -> None:
    step = next_size(Size(6, 1), 0.40, 0.20, max_templates=30, max_repeats=2)
    assert step.size == Size(12, 1)  # at most doubling per round
    step = next_size(Size(27, 1), 0.25, 0.20, max_templates=30, max_repeats=2)
    assert step.size == Size(30, 1)
    step = next_size(Size(30, 1), 0.25, 0.20, max_templates=30, max_repeats=2)
    assert step.size == Size(30, 2)
    step = next_size(Size(30, 2), 0.25, 0.20, max_templates=30, max_repeats=2)
    assert step.size is None
    assert step.reason.startswith("cap reached")
    step = next_size(Size(30, 2), 0.19, 0.20, max_templates=30, max_repeats=2)
    assert step.resolved


def test_growth_asks_for_what_the_curve_needs_in_whole_rounds_of_families() -> None:
    curve = Curve(0.0, 0.9)  # 0.9 / sqrt(n): 0.2 needs 21 templates
    step = next_size(Size(12, 1), 0.26, 0.20, max_templates=30, max_repeats=1, curve=curve)
    assert step.size == Size(21, 1)
    step = next_size(Size(6, 1), 0.37, 0.20, max_templates=30, max_repeats=1, curve=curve)
    assert step.size == Size(12, 1)  # 21 needed, but at most doubling


def test_growth_stops_when_the_target_is_below_the_floor() -> None:
    step = next_size(Size(12, 1), 0.33, 0.20, max_templates=30, max_repeats=3,
                     curve=Curve(0.30, 0.1))
    assert step.size is None
    assert step.reason.startswith("not reachable")


def test_a_resolution_from_one_template_per_family_is_not_trusted() -> None:
    step = next_size(Size(3, 1), 0.12, 0.15, max_templates=30, max_repeats=2)
    assert step.size == Size(6, 1)
    assert "not trusted" in step.reason
    capped = next_size(Size(3, 1), 0.12, 0.15, max_templates=3, max_repeats=2)
    assert capped.size is None
    assert not capped.resolved
    assert next_size(Size(6, 1), 0.12, 0.15, max_templates=30, max_repeats=2).resolved


def test_unmeasurable_resolution_counts_as_unresolved() -> None:
    step = next_size(Size(6, 1), float("nan"), 0.2, max_templates=9, max_repeats=1)
    assert step.size == Size(9, 1)


# --- attempts ---------------------------------------------------------------------------------


def test_plan_of_a_fresh_episode_is_every_repeat_with_its_rerun_budget() -> None:
    plan = plan_episode([], AttemptPolicy(repeats=3, rerun_disturbed=2))
    assert plan is not None
    assert plan.slots == (Slot(1, 3), Slot(2, 3), Slot(3, 3))
    assert plan.next_attempt == 1
    assert plan_episode([], AttemptPolicy()) is not None


def test_plan_resumes_an_interrupted_rerun_under_the_next_number() -> None:
    policy = AttemptPolicy(repeats=1, rerun_disturbed=2)
    done = [Attempt(1, 1, True, False)]  # disturbed; its rerun was killed (no rows)
    plan = plan_episode(done, policy)
    assert plan is not None
    assert plan.slots == (Slot(1, 2),)
    assert plan.next_attempt == 2
    done.append(Attempt(2, 1, True, False))
    plan = plan_episode(done, policy)
    assert plan is not None
    assert plan.slots == (Slot(1, 1),)
    assert plan.next_attempt == 3
    done.append(Attempt(3, 1, True, False))
    assert plan_episode(done, policy) is None  # budget used: settled, all disturbed


def test_an_undisturbed_or_aborted_attempt_settles_its_repeat() -> None:
    policy = AttemptPolicy(repeats=2, rerun_disturbed=3)
    plan = plan_episode([Attempt(1, 1, False, False), Attempt(2, 2, False, True)], policy)
    assert plan is None
    plan = plan_episode([Attempt(1, 1, True, False), Attempt(2, 1, False, False)], policy)
    assert plan is not None
    assert [s.repeat for s in plan.slots] == [2]
    assert plan.next_attempt == 3


def test_raising_repeats_on_resume_adds_only_the_new_repeats() -> None:
    done = [Attempt(1, 1, False, False)]
    plan = plan_episode(done, AttemptPolicy(repeats=3))
    assert plan is not None
    assert [s.repeat for s in plan.slots] == [2, 3]


def test_the_verdict_attempt_is_the_first_undisturbed_else_the_first() -> None:
    assert verdict_attempt([Attempt(2, 1, False, False), Attempt(1, 1, True, False),
                            Attempt(3, 1, False, False)]).attempt == 2
    assert verdict_attempt([Attempt(2, 1, True, False), Attempt(1, 1, True, False)]).attempt == 1


def test_attempt_policy_refuses_out_of_range_values() -> None:
    from testbed.campaign.model import CampaignError

    with pytest.raises(CampaignError, match="repeats"):
        AttemptPolicy(repeats=0)
    with pytest.raises(CampaignError, match="rerun_disturbed"):
        AttemptPolicy(rerun_disturbed=-1)


def test_shard_names_carry_the_attempt() -> None:
    assert split_shard_name("cell~reservation-01") == ("cell/reservation-01", 1)
    assert split_shard_name("cell~reservation-01@3") == ("cell/reservation-01", 3)


# --- the report's reading of attempts ------------------------------------------------------


def _episode(template: str, attempt: int, repeat: int, stall: float, disturbed: bool,
             aborted: bool = False) -> dict[str, object]:
    return {"episode": f"c/{template}", "cell": "c", "policy": "planfence",
            "template": template, "attempt": attempt, "repeat": repeat,
            "stall_ms_per_action": None if aborted else stall, "disturbed": disturbed,
            "disturbed_reason": "runq_wait x" if disturbed else "", "aborted": aborted,
            "scheduled": 10, "available": 0 if aborted else 10, "invalid_n": 0,
            "valid": 0 if aborted else 10}


def test_collapse_takes_the_first_undisturbed_attempt_and_keeps_every_attempt() -> None:
    episodes = pd.DataFrame([_episode("t1", 1, 1, 900.0, True),
                             _episode("t1", 2, 1, 500.0, False),
                             _episode("t1", 3, 1, 400.0, False),
                             _episode("t2", 1, 1, 700.0, True),
                             _episode("t2", 2, 1, 800.0, True)])
    actions = pd.DataFrame({"episode": ["c/t1", "c/t1", "c/t2"], "attempt": [1, 2, 1]})
    view = collapse(episodes, actions)
    rows = view.episodes.set_index("template")
    assert rows.loc["t1", "stall_ms_per_action"] == 500.0
    assert not rows.loc["t1", "disturbed"]
    assert rows.loc["t2", "stall_ms_per_action"] == 700.0
    assert rows.loc["t2", "disturbed"]
    assert rows.loc["t1", "attempts"] == 3
    assert len(view.attempts) == 5
    assert view.attempts["verdict"].sum() == 2
    assert sorted(zip(view.actions["episode"], view.actions["attempt"], strict=True)) == [
        ("c/t1", 2), ("c/t2", 1)]
    excluded = collapse(episodes, actions, exclude_disturbed=True)
    assert list(excluded.episodes["template"]) == ["t1"]
    assert (excluded.excluded_attempts, excluded.excluded_episodes) == (3, 1)


def test_collapse_of_repeats_is_the_median_cost_and_the_summed_counts() -> None:
    episodes = pd.DataFrame([_episode("t1", 1, 1, 100.0, False),
                             _episode("t1", 2, 2, 300.0, False),
                             _episode("t1", 3, 3, 200.0, False),
                             _episode("t1", 4, 4, 0.0, False, aborted=True)])
    view = collapse(episodes, pd.DataFrame({"episode": [], "attempt": []}))
    row = view.episodes.iloc[0]
    assert row["stall_ms_per_action"] == 200.0  # aborted repeat left out of the median
    assert row["scheduled"] == 40
    assert row["available"] == 30
    assert not row["aborted"]
    assert row["repeats"] == 4


# --- the disturbance verdict -------------------------------------------------------------------


# (the verdict's own tests: tests/testbed/results/test_disturbance_verdict.py)


def test_host_columns_are_shares_of_the_interval() -> None:
    before, after = HostSample(total=1000, idle=600, steal=10), \
        HostSample(total=1200, idle=650, steal=30)
    columns = host_columns(before, after)
    assert columns["host_busy_pct"] == pytest.approx(75.0)
    assert columns["host_steal_pct"] == pytest.approx(10.0)
    assert host_columns(None, after)["host_busy_pct"] is None
