"""The absolute-gap table (``testbed.report.decomposition``) and the round trip it uses
(``testbed.links.exchange``): the arithmetic on hand-made frames and links."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from testbed.campaign.workload import Update, generate_schedule
from testbed.links.exchange import (
    Chain,
    Crossing,
    agent_pairs,
    base_rtt_ms,
    exchange_rtt_ms,
    round_trip_ms,
)
from testbed.links.linkspec import LinkSpec, NetworkProfile
from testbed.links.opportunities import RateOpportunities
from testbed.links.profiles import network_template
from testbed.report import decomposition as dec
from testbed.report.load import Run
from testbed.report.table_common import Options
from testbed.report.tables_decomposition import decomposition_tables

# --- the round trip -------------------------------------------------------------------------


class Stamps:
    """Opportunities at given replay times (ms), for hand-checked crossings."""

    def __init__(self, times: list[float]) -> None:
        self.times = times

    def time_of(self, k: int) -> float:
        return self.times[k]

    def first_at_or_after(self, t_ms: float) -> int:
        return next(i for i, t in enumerate(self.times) if t >= t_ms)


def test_a_fixed_link_gives_four_delays() -> None:
    fixed = network_template("fixed")
    assert fixed is not None
    assert exchange_rtt_ms(fixed, 3, offset_s=0, window_s=10) == pytest.approx(80.0)
    assert base_rtt_ms(fixed, 3) == 80.0


def test_crossings_wait_for_the_next_opportunity_then_the_delay() -> None:
    up = Crossing(Stamps([0.0, 100.0, 1000.0, 2000.0, 3000.0]), 10.0)
    down = Crossing(None, 5.0)
    # out at 0 (opportunity 0) +10, down +5, back: waits for 100, +10, +5 -> 115
    assert round_trip_ms((up, down, up, down), 0.0) == pytest.approx(115.0)
    # started at 1: waits for 100 (+10, +5 = 115), back waits for 1000 (+10, +5)
    assert round_trip_ms((up, down, up, down), 1.0) == pytest.approx(1015.0 - 1.0)
    first = Crossing(Stamps([0.0, 30.0, 60.0]), 10.0, delay_first=True)
    assert first.exit_ms(0.0) == 30.0  # queued at 10, leaves at the next opportunity


def test_a_fixed_rate_link_is_periodic_opportunities() -> None:
    rate = Crossing(RateOpportunities(1200.0), 20.0)  # one every 10 ms
    assert rate.exit_ms(0.0) == pytest.approx(20.0)
    assert rate.exit_ms(0.5) == pytest.approx(30.0)


def test_the_chain_is_exchange_weighted_and_skips_the_first_exchange() -> None:
    # a gap of 1000 ms at the start, then an opportunity every ms
    up = Crossing(Stamps([1000.0 + i for i in range(100_000)]), 0.0)
    down = Crossing(None, 10.0)
    chain = Chain((up, down, up, down), [], [])
    rtts = chain.window(2.0)
    # first exchange waited the gap (1020 ms) and is left out; the rest are 20-22 ms
    assert chain.rtts_ms[0] == pytest.approx(1020.0)
    assert 40 <= len(rtts) <= 50
    assert rtts.max() < 25
    # a random instant in the first two seconds would wait 250 ms on average for the
    # gap alone: the closed loop meets it once
    assert float(np.mean(rtts)) < 25


def test_pairs_of_a_mixed_network_are_weighted_by_their_counts() -> None:
    fast = LinkSpec(delay_ms=5.0)
    slow = LinkSpec(delay_ms=20.0)
    profile = NetworkProfile("mixed", fast, hosts=(("0", slow),))
    pairs = agent_pairs(profile, 3)
    assert sorted(n for _, _, n in pairs) == [2, 2, 2]
    # a0-a1, a0-a2 (and back): 2 x (20 + 5); a1-a2: 4 x 5
    expected = (4 * 50.0 + 2 * 20.0) / 6
    assert base_rtt_ms(profile, 3) == pytest.approx(expected)
    assert exchange_rtt_ms(profile, 3, offset_s=0, window_s=5) == pytest.approx(expected)
    assert math.isnan(exchange_rtt_ms(profile, 1, offset_s=0, window_s=5))


# --- counts -------------------------------------------------------------------------------


def _actions(**columns: list[object]) -> pd.DataFrame:
    return pd.DataFrame(columns)


def test_recorded_handshake_rounds_are_taken_as_they_are() -> None:
    acts = _actions(episode=["e1", "e1", "e2"], rounds=[3, 0, 1], connection=["reuse"] * 3,
                    connections=[1, 0, 0], bytes=[100, 0, 50], rpc_timeouts=[0, 0, 1],
                    handshake_rounds=[2, 0, 0])
    counts = dec.action_counts(acts)
    assert counts.loc["e1", "action_rounds"] == 3
    assert counts.loc["e1", "action_handshake_rounds"] == 2
    assert counts.loc["e2", "path_timeouts"] == 1
    assert set(counts["action_source"]) == {"recorded"}


def test_derived_handshake_rounds_for_runs_without_the_column() -> None:
    acts = _actions(episode=["f", "f", "r", "r"], rounds=[3, 2, 3, 2],
                    connection=["fresh", "fresh", "reuse", "reuse"],
                    connections=[3, 4, 1, 0], bytes=[0, 0, 0, 0])
    counts = dec.action_counts(acts)
    assert counts.loc["f", "action_handshake_rounds"] == 2 * (3 + 2)  # every round opens
    assert counts.loc["r", "action_handshake_rounds"] == 2  # one round opened one
    assert set(counts["action_source"]) == {"derived"}


def test_barriers_count_windows_with_an_update_inside_the_horizon() -> None:
    assert dec.barriers_with_heads((1, 2, 3, 9), 1, 64) == 4
    assert dec.barriers_with_heads((1, 2, 3, 9), 2, 64) == 3  # windows 0, 1, 4
    assert dec.barriers_with_heads((1, 2, 3, 9), 4, 10) == 1  # window 2 ends at unit 11


def test_adaptive_announces_until_its_rule_switches() -> None:
    # one update per unit from unit 1: the rule cannot fire before unit 7 (warm-up)
    assert dec.adaptive_announcements(tuple(range(1, 40))) < 39
    assert dec.adaptive_announcements((1, 2, 3)) == 3
    assert dec.adaptive_announcements(()) == 0


def _episode(policy: str, connection: str = "fresh", **extra: object) -> pd.Series:
    row = {"episode": "e", "policy": policy, "connection": connection, "seed": 7,
           "family": "reservation", "template": "reservation-01", "agents": 3, "keys": 6,
           "units": 24, "deps": 1, "rho": 4.0, "tier": "compact", **extra}
    return pd.Series(row)


def test_derived_hook_rounds_follow_the_schedule() -> None:
    schedule = generate_schedule(seed=7, family="reservation", template="reservation-01",
                                 agents=3, keys=6, units=24, deps=1, rho=4.0)
    updates = [e.unit for e in schedule.events if isinstance(e, Update)]
    central = dec._derived_hooks(_episode("centralized_lineage"))
    assert central["hook_rounds"] == len(updates)
    assert central["hook_handshake_rounds"] == 2 * len(updates)
    sync2 = dec._derived_hooks(_episode("metadata_sync/2", "reuse"))
    assert sync2["hook_rounds"] == len({u // 2 for u in updates})
    assert sync2["hook_handshake_rounds"] == 0
    assert dec._derived_hooks(_episode("planfence"))["hook_rounds"] == 0
    assert dec._derived_hooks(_episode("planfence"))["hook_source"] == "derived"


def test_recorded_hook_rounds_win() -> None:
    frame = pd.DataFrame([{**_episode("centralized_lineage").to_dict(), "barrier_rounds": 0,
                           "commit_rounds": 5, "barrier_handshake_rounds": 0,
                           "commit_handshake_rounds": 4}])
    hooks = dec.hook_counts(frame)
    assert hooks.loc["e"].to_dict() == {"hook_rounds": 5.0, "hook_handshake_rounds": 4.0,
                                       "hook_source": "recorded"}


# --- predictions ----------------------------------------------------------------------------


def test_prediction_arithmetic() -> None:
    frame = pd.DataFrame({"action_rounds": [6.0], "action_handshake_rounds": [12.0],
                          "hook_rounds": [4.0], "hook_handshake_rounds": [8.0],
                          "path_timeouts": [1.0], "rtt_ms": [100.0],
                          "attempted_actions": [10]})
    out = dec.predict(frame, timeout_s=2.0).iloc[0]
    assert out["counted_rounds_per_action"] == 1.0
    assert out["counted_handshake_rounds_per_action"] == 2.0
    assert out["predicted_ms"] == pytest.approx((30 * 100 + 2000) / 10)
    assert out["paper_model_ms"] == pytest.approx((10 * 100 + 2000) / 10)


def _run(tmp_path: Path, network: str = "fixed") -> Run:
    episodes, actions = [], []
    for connection, opened in (("fresh", 3), ("reuse", 1)):
        for t, stall in enumerate((200.0, 240.0, 260.0)):
            episode = f"planfence_{connection}/reservation-0{t + 1}"
            episodes.append({
                "campaign": "toy", "cell": f"planfence_{connection}", "policy": "planfence",
                "network": network, "connection": connection, "agents": 3, "keys": 6,
                "deps": 1, "rho": 4.0, "units": 24, "tier": "compact",
                "trace_offset_s": 0.0, "episode": episode, "family": "reservation",
                "template": f"reservation-0{t + 1}", "seed": 7, "attempted_actions": 2,
                "aborted": False, "stall_ms_per_action": stall, "wall_s": 5.0,
                "replay_s": 4.0, "barrier_rounds": 0, "commit_rounds": 0,
                "barrier_handshake_rounds": 0, "commit_handshake_rounds": 0})
            for action, rounds in (("act000", 3), ("act001", 0)):
                actions.append({
                    "episode": episode, "action": action, "rounds": rounds,
                    "connection": connection, "connections": opened if rounds else 0,
                    "bytes": 1000 * rounds, "rpc_timeouts": 0,
                    "handshake_rounds": (2 * rounds if connection == "fresh"
                                         else 2 * bool(rounds))})
    return Run(tmp_path, {"campaign": "toy"}, pd.DataFrame(actions), pd.DataFrame(episodes))


def test_cells_on_a_fixed_link(tmp_path: Path) -> None:
    rows = {str(r.key["connection"]): r for r in dec.decomposition(_run(tmp_path))}
    fresh, reuse = rows["fresh"], rows["reuse"]
    # fresh: (3 rounds + 6 handshake round trips) x 80 ms over 2 actions
    assert fresh.predicted_ms == pytest.approx(9 * 80 / 2)
    assert fresh.paper_model_ms == pytest.approx(3 * 80 / 2)
    assert fresh.measured_ms == 240.0
    assert fresh.ratio == pytest.approx(360 / 240)
    assert not fresh.within
    # reuse: (3 + 2) x 80 / 2 = 200
    assert reuse.predicted_ms == pytest.approx(200.0)
    assert reuse.ratio == pytest.approx(200 / 240)
    assert fresh.source == reuse.source == "recorded"
    assert fresh.rtt_ms == reuse.rtt_ms == pytest.approx(80.0)


def test_the_table_and_its_findings(tmp_path: Path) -> None:
    tables = decomposition_tables(_run(tmp_path), Options(draws=10, seed=0))
    assert [t.name for t in tables] == ["table_decomposition_fixed"]
    table = tables[0]
    assert table.header[:2] == ["Method", "Connection"]
    assert [c.text for c in table.rows[0]][-4:] == ["240", "360", "1.50", "120"]
    assert table.data["stall_ms_predicted"].tolist() == pytest.approx([360.0, 200.0])
    assert table.findings[0].startswith("0 of 2 cells within 10%")


def test_loopback_runs_get_no_table(tmp_path: Path) -> None:
    assert decomposition_tables(_run(tmp_path, "loopback"), Options(10, 0)) == []
