"""Progress in a log: lines with the count and an ETA at a fixed interval."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest
from rich.console import Console

from testbed.campaign.parse import parse_campaign
from testbed.run.loop import run_campaign
from testbed.run.progress import LineProgress, open_progress, progress_bar, shorten_middle
from tests.testbed.run.fake_runner import SMALL, FakeRunner


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_says_how_far_and_how_long_yet() -> None:
    clock = Clock()
    progress = LineProgress(Console(file=io.StringIO()), interval_s=60, clock=clock)
    progress.started = clock.now
    task = progress.add_task("episodes", total=10, completed=2)  # two from an earlier run
    progress.update(task, description="planfence_att/reservation-01")
    assert progress.line() == ("progress: 2/10 episodes (20%), elapsed 0:00:00, ETA unknown; "
                               "running planfence_att/reservation-01")
    clock.now += 120
    progress.advance(task)
    progress.advance(task)
    # two episodes in 2 min this session, six left: 6 min
    assert progress.line().startswith("progress: 4/10 episodes (40%), elapsed 0:02:00, "
                                      "ETA 0:06:00; running ")


def test_a_line_says_who_holds_the_host_while_the_run_waits() -> None:
    clock = Clock()
    progress = LineProgress(Console(file=io.StringIO()), interval_s=60, clock=clock)
    task = progress.add_task("episodes", total=3, completed=0, host="")
    progress.update(task, host="waiting for a lane: run /x holds 8 lane(s)")
    assert progress.line().endswith("; waiting for a lane: run /x holds 8 lane(s)")
    progress.update(task, description="planfence_att/reservation-01")  # keeps the host
    assert "waiting for a lane" in progress.line()
    progress.update(task, host="")
    assert progress.line().endswith("running planfence_att/reservation-01")


def test_a_console_that_is_not_a_terminal_gets_lines() -> None:
    assert isinstance(open_progress(Console(file=io.StringIO())), LineProgress)
    assert not isinstance(open_progress(Console(file=io.StringIO(), force_terminal=True)),
                          LineProgress)


async def test_a_campaign_logged_to_a_file_shows_progress_while_it_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESTBED_PROGRESS_S", "0.02")
    log = io.StringIO()
    campaign = parse_campaign(SMALL)
    slow = FakeRunner()
    real = slow.measure

    def measure(*args: object) -> object:
        time.sleep(0.01)  # episodes that take a moment, so ticks fall between them
        return real(*args)  # type: ignore[arg-type]

    slow.measure = measure  # type: ignore[method-assign,assignment]
    await run_campaign(campaign, tmp_path / "o", resume=False, runner=slow,
                       console=Console(file=log, width=200))
    lines = [x for x in log.getvalue().splitlines() if x.startswith("progress: ")]
    total = len(campaign.episodes())
    assert len(lines) >= 3, log.getvalue()
    counts = [int(re.match(r"progress: (\d+)/", x).group(1)) for x in lines]  # type: ignore[union-attr]
    assert counts == sorted(counts)
    assert lines[-1].startswith(f"progress: {total}/{total} episodes (100%)")
    assert all("ETA" in x for x in lines)


KEY = ("planfence_budget-b=2-ranking=critical_first_att_o0_r1_x8_n5_d4_reuse_compact_t64/"
       "fulfillment-04")


def _bar_lines(width: int, host: str = "") -> list[str]:
    clock = Clock()
    console = Console(file=io.StringIO(), width=width, force_terminal=True,
                      color_system=None, record=True)
    bar = progress_bar(console, get_time=clock)
    task = bar.add_task("episodes", total=1020, completed=0, host="")
    bar.update(task, description=KEY)
    for _ in range(5):  # one episode every 40 s
        clock.now += 40
        bar.advance(task)
    bar.update(task, host=host)
    console.print(bar.get_renderable())
    return console.export_text().splitlines()


def test_the_bar_keeps_count_rate_and_eta_on_one_80_column_line() -> None:
    (line,) = _bar_lines(80)
    assert len(line) <= 80
    assert "5/1020" in line
    assert "1.5/min" in line
    assert "ETA 11:16:40" in line
    assert "0:03:20" in line  # elapsed
    assert "…" in line
    assert line.split()[0].endswith("fulfillment-04")
    assert line.startswith("planfence")


def test_the_bar_shares_the_line_with_who_holds_the_host() -> None:
    (line,) = _bar_lines(80, host="waiting for a lane: run /x holds 8 lane(s)")
    assert len(line) <= 80
    assert "ETA 11:16:40" in line
    assert "waiti" in line
    (wide,) = _bar_lines(200, host="waiting for a lane: run /x holds 8 lane(s)")
    assert KEY in wide
    assert "waiting for a lane: run /x holds 8 lane(s)" in wide


def test_shorten_middle_keeps_both_ends() -> None:
    assert shorten_middle("abcdefghij", 20) == "abcdefghij"
    assert shorten_middle("abcdefghij", 6) == "ab…hij"
    assert len(shorten_middle(KEY, 30)) == 30
    assert shorten_middle("abc", 1) == "…"
    assert shorten_middle("abc", 0) == ""
