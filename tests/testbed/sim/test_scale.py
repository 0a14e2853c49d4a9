"""Teams beyond the packet-level limit: the sim backend runs them, deterministically; the
packet-level backends refuse them in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testbed.campaign.model import Campaign, CampaignError
from testbed.campaign.networks import check_backend
from testbed.campaign.parse import parse_campaign
from testbed.campaign.workload import MAX_AGENTS, generate_schedule
from testbed.sim.calibration import Calibration
from testbed.sim.episode import run_sim_episode

ROOT = Path(__file__).resolve().parents[3]


def _calibration() -> Calibration:
    figures = json.loads((ROOT / "docs" / "bench-rpc-policy.json").read_text())
    return Calibration.from_bench(figures, host="docs/bench-rpc-policy.json",
                                  revision="committed", measured_at="2026-12-01")


def _campaign(agents: int, **options: Any) -> Campaign:
    return parse_campaign({"name": "scale", "seed": 7, "templates": 1, "options": options,
                           "grid": {"policy": ["planfence"], "network": ["att"],
                                    "agents": [agents]}})


def test_a_100_agent_sim_episode_completes_and_is_deterministic() -> None:
    campaign = _campaign(100, backend="sim")
    ((key, (cell,)),) = campaign.groups()
    schedule = campaign.schedule(cell, campaign.templates[0])
    assert len(schedule.agents) == 100

    def once() -> Any:
        return run_sim_episode(campaign, cell, schedule, central=key.central,
                               calibration=_calibration())

    first, second = once(), once()
    assert len(first.actions) == schedule.counts.actions
    assert all(a["outcome"] in ("released", "blocked") for a in first.actions)
    assert first.episode["link_bytes"] > 0
    assert (first.actions, first.episode) == (second.actions, second.episode)


@pytest.mark.parametrize("backend", ["auto", "netem", "userspace"])
def test_packet_level_backends_refuse_a_team_beyond_their_limit_in_one_line(
        backend: str) -> None:
    campaign = _campaign(MAX_AGENTS + 1)  # a file without a backend parses: --backend sim
    with pytest.raises(CampaignError) as info:
        check_backend(campaign, backend)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"grid.agents: {MAX_AGENTS + 1} is more than backend {backend}")
    assert "backend sim" in message
    check_backend(campaign, "sim")  # the sim backend runs it
    check_backend(_campaign(MAX_AGENTS), backend)  # the packet-level limit itself is fine


def test_a_file_naming_a_packet_level_backend_is_refused_when_parsed() -> None:
    with pytest.raises(CampaignError, match=r"^grid\.agents: 17 is more than backend netem"):
        _campaign(17, backend="netem")


def test_large_teams_keep_the_templates_roles_and_small_teams_their_schedules() -> None:
    big = generate_schedule(seed=3, family="reservation", template="reservation-01",
                            agents=1000)
    roles = {p.planner for p in big.plans()} | {a.executor for a in big.acts()}
    assert roles <= {f"a{i}" for i in range(16)}
    assert set(big.owners.values()) == {f"a{i}" for i in range(8)}
    # A template's roles do not depend on the largest team allowed: the D.3 team of 5
    # still plans and executes where it did (digest of this schedule before the change).
    small = generate_schedule(seed=3, family="reservation", template="reservation-01",
                              agents=5)
    assert small.digest == SMALL_DIGEST


SMALL_DIGEST = "b05b9c8b1522dd4e85cbb5fca5593167"


def test_bench_sim_reports_time_and_memory_per_member() -> None:
    from testbed.sim.bench import bench_sim

    result = bench_sim(_calibration(), sizes=(3, 30))
    small, large = result["rows"]
    assert (small["members"], large["members"]) == (3, 30)
    assert large["wall_s"] > 0
    assert large["virtual_s"] > 0
    assert large["python_bytes"] > small["python_bytes"]
    assert large["python_bytes_per_member"] > 0  # stores, handlers and links of each node
    assert "peak_rss_bytes_per_member" in large
