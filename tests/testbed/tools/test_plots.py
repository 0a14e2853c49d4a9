"""Plots a user reads first: bins that show outages, last bins drawn to the end,
legends off the data, wired links readable, the link order's delay visible."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from testbed.campaign.parse import load_campaign
from testbed.links.linkspec import LinkSpec, NetworkProfile
from testbed.links.netinfo import plot_bin_ms, trace_gaps_ms
from testbed.links.profiles import get_profile
from testbed.links.traces import load_named
from testbed.tools.networks_view import _series, network_figure

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "mixed-team" / "campaign.toml"


@pytest.mark.parametrize(("span_ms", "gaps", "expected"), [
    (1_000_000, [], 1000),          # a long trace without outages: 1 s bins
    (1_000_000, [5000, 78_000], 1000),  # outages of seconds show in 1 s bins
    (140_000, [724], 200),          # T-Mobile's 0.7 s outage: 200 ms bins
    (60_000, [450], 200),
    (20_000, [], 100),              # a short episode: 100 ms
    (1_000_000, [210], 100),
    (1_000_000, [120, 90], 1000),   # shorter than an outage worth showing
])
def test_bins_are_finer_than_the_shortest_outage(span_ms: float, gaps: list[float],
                                                  expected: int) -> None:
    assert plot_bin_ms(span_ms, gaps) == expected


def test_tmobile_is_drawn_in_sub_second_bins_to_its_end() -> None:
    trace = load_named("TMobile-LTE-short.up")
    assert trace.longest_outage_ms() < 1000
    edges, mbit, _, bin_ms = _series(get_profile("tmobile").link, "up")  # type: ignore[arg-type]
    assert bin_ms < 1000
    assert edges[-1] == pytest.approx(trace.length_s)  # the last bin ends at the period
    assert len(edges) == len(mbit) + 1
    gaps = trace_gaps_ms(trace.stamps_ms, trace.period_ms)
    # the longest outage covers at least one whole bin, so some bin is empty
    assert gaps.max() >= 2 * bin_ms
    assert (np.asarray(mbit) == 0).any()


def test_a_short_last_bin_keeps_its_real_rate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    (tmp_path / "t.up").write_text("".join(f"{ms}\n" for ms in range(1, 1501)))  # 1.5 s
    (tmp_path / "t.down").write_text("1\n")
    monkeypatch.setenv("TESTBED_TRACE_DIR", str(tmp_path))
    edges, mbit, _, bin_ms = _series(LinkSpec(up_trace="t.up", down_trace="t.down"), "up")
    assert bin_ms == 100
    assert edges[-1] == pytest.approx(1.5)
    assert np.allclose(mbit, 12.0, rtol=0.011)  # every bin, the last one too, at 12 Mbit/s


def test_network_plot_has_legends_off_the_data_and_the_delay_step() -> None:
    profile = load_campaign(EXAMPLE).network_profile("field")
    figure = network_figure(profile)
    figure.canvas.draw()
    axes = figure.axes
    assert len(axes) == 2 * (1 + len(profile.hosts))  # capacity and delay per link
    for ax in axes:
        legend = ax.get_legend()
        assert legend is not None
        box, data = legend.get_window_extent(), ax.get_window_extent()
        assert box.x0 >= data.x1, "the legend is outside the axes, to the right"
    # hosts.a2's delay trace: 20 ms, 70 ms from 8 s to 12 s
    a2_delay = axes[2 * 2 + 1]
    peaks = [max(patch.get_data()[0]) for patch in a2_delay.patches]
    assert any(abs(p - 70.0) < 1e-9 for p in peaks), peaks


def test_a_wired_host_is_on_its_own_axes() -> None:
    wired = NetworkProfile("w", LinkSpec(up_trace="ATT-LTE-driving.up",
                                         down_trace="ATT-LTE-driving.down"),
                           hosts=(("central", LinkSpec(rate_kbit=100_000, delay_ms=1)),))
    figure = network_figure(wired)
    lte, central = figure.axes[0], figure.axes[2]
    assert lte.get_ylim()[1] < 50
    assert central.get_ylim()[1] >= 100


# --- the wall-time estimate: capacity, outages, setup ------------------------------------


@pytest.mark.slow
def test_the_att_estimate_matches_the_reference_runs_within_a_fifth() -> None:
    """AT&T episodes of results/rates (offset 0): its downlink's many 1 s gaps stall no
    episode (they are in its mean capacity); the estimate stays near what ran."""
    import pandas as pd

    from testbed.tools.plan_view import _episode_s

    root = Path(__file__).resolve().parents[3]
    episodes = pd.read_parquet(root / "results" / "rates" / "episodes.parquet")
    campaign = load_campaign("rates")
    cells = {c.id: c for c in campaign.cells() if c.network == "att"}
    att = episodes[(~episodes["aborted"]) & episodes["cell"].isin(list(cells))]
    assert len(att) > 100
    estimated = [_episode_s(campaign.network_profile("att"), cells[c]) for c in att["cell"]]
    ratio = float(att["wall_s"].median()) / float(pd.Series(estimated).median())
    assert 0.8 < ratio < 1.25, ratio


def test_an_episode_that_reaches_an_outage_is_estimated_longer() -> None:
    from testbed.links.netinfo import team_outage_s
    from testbed.tools.plan_view import _base_episode_s, _episode_s

    campaign = load_campaign(EXAMPLE)
    profile = campaign.network_profile("field")
    # the uplink of field-lte has no capacity from 12 s to 14 s
    assert team_outage_s(profile, 3, False, offset_s=0.0, seconds=10.0) == 0.0
    assert team_outage_s(profile, 3, False, offset_s=0.0, seconds=20.0) == pytest.approx(
        2.0, abs=0.05)
    assert team_outage_s(profile, 3, False, offset_s=13.0, seconds=20.0) == pytest.approx(
        1.0, abs=0.05)
    cell = campaign.cells()[0]
    base = _base_episode_s(profile, cell)
    assert base > 12.0, "this cell's episodes reach the outage"
    assert _episode_s(profile, cell) == pytest.approx(base + 2.0 + 0.5, abs=0.1)


def test_the_estimate_counts_a_node_process_per_host_and_the_runs_start() -> None:
    from testbed.campaign.parse import parse_campaign
    from testbed.tools.plan_view import HOST_START_S, RUN_END_S, RUN_START_S, estimate_wall_s

    def campaign(agents: int) -> float:
        return estimate_wall_s(parse_campaign({
            "name": "e", "seed": 1, "templates": 1,
            "grid": {"policy": ["planfence"], "network": ["loopback"], "agents": [agents],
                     "units": [8]}}))

    assert campaign(8) - campaign(2) == pytest.approx(6 * HOST_START_S)
    assert campaign(2) > RUN_START_S + RUN_END_S


def test_a_window_of_many_periods_is_counted_without_unrolling_it() -> None:
    from testbed.links.netinfo import outage_ms_in_window

    # ATT's uplink: a 78.3 s outage per 1012.5 s period; 10^5 periods in about a day
    att = get_profile("att").link
    assert att is not None
    period = float(load_named("ATT-LTE-driving.up").period_ms)
    one = outage_ms_in_window(att, "up", 0.0, period)
    assert one > 78_000
    many = outage_ms_in_window(att, "up", 0.0, period * 100_000)
    assert many == pytest.approx(one * 100_000, rel=1e-6)
    assert outage_ms_in_window(LinkSpec(rate_kbit=10), "up", 0.0, 1e12) == 0.0


def test_a_plot_into_a_folder_not_yet_there_makes_it(tmp_path: Path) -> None:
    from testbed.tools.networks_view import write_network_plot

    target = tmp_path / "new" / "deeper" / "att.svg"
    write_network_plot(get_profile("att"), target)
    assert target.read_text().startswith("<?xml")
