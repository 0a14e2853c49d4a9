"""The report's link plots: the episode that shows the network's outages, a log axis
for wired links, one legend off the data, and the links' delay over an episode."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.links.netdef import network_to_data
from testbed.links.profiles import get_profile
from testbed.report.delay_figure import delay_figure
from testbed.report.link_figures import link_figures
from testbed.report.load import load_run
from testbed.report.recorded_links import recorded_profiles, what_it_met
from tests.testbed.report.report_fixtures import make_campaign
from tests.testbed.report.test_report import _write_log


def test_what_an_episode_met_on_att() -> None:
    att = get_profile("att")
    quiet = what_it_met(att, agents=2, central=False, offset_s=100.0, seconds=20.0)
    gap = what_it_met(att, agents=2, central=False, offset_s=780.0, seconds=20.0)
    assert gap.outage_s >= 2 * 12.0  # both agents' uplinks in the 78 s outage from 787.6 s
    assert gap.score > quiet.score


def _att_run(tmp_path: Path) -> tuple[Path, str, str]:
    data = make_campaign("lp", [{"policy": ["planfence"], "network": ["att"],
                                 "trace_offset_s": [0.0, 780.0], "agents": [2]}],
                         templates_per_family=1)
    data.manifest["networks"] = {"att": {"definition": network_to_data(get_profile("att"))}}
    ep = data.episodes
    ep["wall_s"] = 20.0
    ep["link_log"] = None
    quiet = ep[ep["trace_offset_s"] == 0.0].index[0]
    gap = ep[ep["trace_offset_s"] == 780.0].index[0]
    for row in (quiet, gap):
        ep.loc[row, "link_log"] = f"links/e{row}"
    run = data.write(tmp_path / "run")
    for row in (quiet, gap):
        (run / f"links/e{row}").mkdir(parents=True)
        for host in ("a0", "a1"):
            _write_log(run / f"links/e{row}" / f"{host}.up.log", rate_opps_per_ms=1,
                       packets=50)
            _write_log(run / f"links/e{row}" / f"{host}.down.log", rate_opps_per_ms=1,
                       packets=50)
        # a wired central host: 100 opportunities per ms (1.2 Gbit/s), 50 packets
        _write_log(run / f"links/e{row}" / "central.up.log", rate_opps_per_ms=100,
                   packets=50)
    return run, str(ep.loc[quiet, "episode"]), str(ep.loc[gap, "episode"])


@pytest.mark.slow
def test_the_default_episode_is_the_one_that_meets_the_outage(tmp_path: Path) -> None:
    run_dir, quiet, gap = _att_run(tmp_path)
    run = load_run(run_dir)
    assert set(recorded_profiles(run.manifest)) == {"att"}
    paths, notes = link_figures(run, tmp_path / "figs")
    assert notes == []
    assert [p.stem for p in paths] == ["fig_link_att", "fig_link_att"]  # png and svg
    figure_text = paths[1].read_text()  # the SVG names the episode in its title
    assert gap in figure_text
    assert quiet not in figure_text


@pytest.mark.slow
def test_a_wired_link_gets_a_log_axis_and_the_legend_sits_off_the_data(
        tmp_path: Path) -> None:
    import matplotlib.figure

    run_dir, _, gap = _att_run(tmp_path)
    saved: list[matplotlib.figure.Figure] = []
    import testbed.report.link_figures as lf

    real = lf.save

    def keep(figure: matplotlib.figure.Figure, directory: Path, stem: str) -> list[Path]:
        saved.append(figure)
        return real(figure, directory, stem)

    lf.save = keep  # type: ignore[assignment]
    try:
        link_figures(load_run(run_dir), tmp_path / "figs", episode=gap)
    finally:
        lf.save = real  # type: ignore[assignment]
    (figure,) = saved
    titled = {ax.get_title(): ax for ax in figure.axes}
    central = next(ax for title, ax in titled.items() if title.startswith("central uplink"))
    agent = next(ax for title, ax in titled.items() if title.startswith("a0 uplink"))
    assert central.get_yscale() == "log"
    assert agent.get_yscale() == "linear"
    figure.canvas.draw()
    (legend,) = figure.legends
    box = legend.get_window_extent()
    for ax in figure.axes:
        data = ax.get_window_extent()
        assert box.y1 <= data.y0 or box.y0 >= data.y1 or box.x1 <= data.x0 or \
            box.x0 >= data.x1, "the legend covers no panel"


def test_the_delay_figure_draws_a_delay_trace_step(tmp_path: Path) -> None:
    delay = tmp_path / "d.txt"
    delay.write_text("0 20\n8000 70\n12000 20\n")
    data = make_campaign("dl", [{"policy": ["planfence"], "network": ["att"]}],
                         templates_per_family=1)
    definition = network_to_data(get_profile("att"))
    definition["hosts"] = {"1": {"delay_trace": str(delay)}}
    data.manifest["networks"] = {"att": {"definition": definition}}
    data.episodes["wall_s"] = 15.0
    run = load_run(data.write(tmp_path / "run"))
    paths, notes = delay_figure(run, tmp_path / "figs")
    assert notes == []
    assert [p.suffix for p in paths] == [".png", ".svg"]
    assert "host 1 up @ 0 s" in paths[1].read_text()
