"""Loss models, CoDel, delay traces, statistics windows and packet logs of the link model
(pure: no kernel, explicit times)."""

from __future__ import annotations

import io
import random
import statistics
from pathlib import Path

import pytest

from testbed.links.disciplines import Codel, GilbertElliott
from testbed.links.linklog import LinkLog
from testbed.links.logread import link_series, read_log
from testbed.links.model import (
    DelaySteps,
    DirectionSpec,
    LinkQueue,
    RateOpportunities,
    TraceOpportunities,
)
from testbed.links.traces import TraceError, load_delay_trace
from testbed.tools.udp_probe import loss_runs
from tests.testbed.links.test_model import drain

# --- Gilbert-Elliott ------------------------------------------------------------------


def test_gilbert_elliott_mean_and_burst_length() -> None:
    ge = GilbertElliott(0.01, 0.2, 0.0, 100.0, random.Random(3))
    lost = [ge.lose() for _ in range(200_000)]
    # stationary loss p / (p + r) = 4.76 %; bad runs last 1 / r = 5 packets on average
    assert sum(lost) / len(lost) == pytest.approx(0.01 / 0.21, rel=0.1)
    assert statistics.mean(loss_runs(lost)) == pytest.approx(5.0, rel=0.1)
    rng = random.Random(3)
    iid = [rng.random() < 0.0476 for _ in range(200_000)]
    assert statistics.mean(loss_runs(iid)) < 1.1  # IID at the same mean: runs of ~1.05


def test_gilbert_elliott_through_a_queue_is_seeded() -> None:
    def run(seed: int) -> list[object]:
        spec = DirectionSpec(gilbert=(0.05, 0.3, 1.0, 60.0))
        q = spec.make_queue(random.Random(seed))
        for i in range(2000):
            q.offer(i, 100, float(i))
        return [item for _, item in q.advance(1e9)]

    first = run(5)
    assert first == run(5)
    assert first != run(6)
    assert 1700 < len(first) < 1950  # mean loss (0.3 * 1 + 0.05 * 60) / 0.35 = 9.4 %


# --- CoDel ----------------------------------------------------------------------------


def _overload(codel: Codel | None) -> tuple[LinkQueue, int]:
    """12 Mbit/s (one opportunity per ms), 1.1 full packets offered per ms for 10 s."""
    q = LinkQueue(RateOpportunities(12_000.0), queue_packets=100_000, codel=codel)
    sent = 0
    for ms in range(10_000):
        q.advance(float(ms))
        for _ in range(1 + (ms % 10 == 0)):
            q.offer(sent, 1500, float(ms))
            sent += 1
    return q, sent


def test_droptail_lets_the_standing_queue_grow() -> None:
    q, _ = _overload(None)
    assert q.counters.drops == 0
    assert statistics.median(q.sojourns_ms[-1000:]) > 500  # the excess waits ever longer


def test_codel_keeps_the_sojourn_near_its_target() -> None:
    q, sent = _overload(Codel(target_ms=5.0, interval_ms=100.0))
    assert q.counters.drops > 500  # about the 10 % excess, dropped at the head
    assert statistics.median(q.sojourns_ms[-1000:]) < 5.0 * 10  # ~13 ms, not ~860 ms
    assert q.counters.packets + q.counters.drops + q.queued_packets == sent


def test_codel_does_not_drop_before_the_sojourn_stays_above_target_for_an_interval() -> None:
    q = LinkQueue(RateOpportunities(12_000.0), codel=Codel(5.0, 100.0))
    dropped_at: list[float] = []
    for ms in range(400):
        before = q.counters.drops
        q.advance(float(ms))
        if q.counters.drops > before:
            dropped_at.append(float(ms))
        q.offer(ms, 1500, float(ms))
        q.offer(-ms - 1, 1500, float(ms))
    # sojourn passes 5 ms at ~10 ms; the first drop is one interval later, not before
    assert dropped_at
    assert 100.0 <= dropped_at[0] <= 120.0


# --- delay traces ----------------------------------------------------------------------


def test_delay_steps_follow_the_trace_and_keep_fifo_order() -> None:
    q = LinkQueue(None, delays=DelaySteps([(0.0, 10.0), (100.0, 50.0), (200.0, 5.0)]))
    for t in (0.0, 99.0, 100.0, 199.0, 200.0, 250.0):
        q.offer(t, 100, t)
    exits = [t for t, _ in q.advance(1e6)]
    # 10 ms, then 50 ms from 100 ms; at 200 ms the delay drops to 5 ms but a packet never
    # overtakes the one before it (199 + 50 = 249)
    assert exits == [10.0, 109.0, 150.0, 249.0, 249.0, 255.0]


def test_delay_steps_start_at_the_offset() -> None:
    steps = DelaySteps([(0.0, 10.0), (1000.0, 40.0)], offset_ms=900.0)
    assert steps.at(50.0) == 10.0
    assert steps.at(150.0) == 40.0


def test_delay_trace_files(tmp_path: Path) -> None:
    path = tmp_path / "d.txt"
    path.write_text("# a comment\n0 20   # trailing\n\n8000 70\n12000 20\n")
    trace = load_delay_trace(path)
    assert trace.steps == ((0.0, 20.0), (8000.0, 70.0), (12000.0, 20.0))
    assert (trace.delay_at(7999), trace.delay_at(8000), trace.delay_at(1e9)) == (20, 70, 20)
    for text, message in (("5 20\n", "the first step must be at 0 ms"),
                          ("0 20\n0 30\n", "is not after the previous 0"),
                          ("0 -1\n", "delay -1 is not allowed"),
                          ("", "delay trace is empty"), ("0 1 2\n", "expected '<ms>")):
        path.write_text(text)
        with pytest.raises(TraceError, match=message):
            load_delay_trace(path)


# --- statistics windows ------------------------------------------------------------------


def test_window_counts_capacity_bytes_and_sojourns() -> None:
    q = LinkQueue(TraceOpportunities([10, 20, 30, 40], 40))
    q.restart(1000.0)
    q.offer("a", 1500, 1000.0)
    q.offer("b", 1500, 1000.0)
    drain(q)
    assert q.window_bytes == 3000
    assert q.window_released == 2
    assert list(q.sojourns_ms) == [10.0, 20.0]
    assert q.capacity_bytes(1040.5) == 4 * 1500  # opportunities at 10, 20, 30, 40 ms
    q.clear_window(1040.5)
    assert q.window_bytes == 0
    assert list(q.sojourns_ms) == []
    assert LinkQueue(None).capacity_bytes(5.0) is None


# --- packet logs ----------------------------------------------------------------------------


def test_link_log_is_mahimahi_format_and_reads_back(tmp_path: Path) -> None:
    opps = TraceOpportunities([10, 20, 30, 40], 40)
    q = LinkQueue(opps, queue_packets=2)
    q.restart(100.0)
    handle = io.StringIO()
    extra = io.StringIO()
    q.log = LinkLog(handle, origin_ms=100.0, opportunities=opps, header=["mm-link test"],
                    extra=extra)
    for name in ("a", "b", "c"):  # c finds the queue full
        q.offer(name, 1500, 105.4)
    drain(q, 125.0)
    text_before_close = handle.getvalue()
    lines = [x for x in text_before_close.splitlines() if not x.startswith("#")]
    # as mm-link: the refused packet is logged as an arrival; its drop goes beside the log
    assert lines == ["5 + 1500", "5 + 1500", "5 + 1500", "10 # 1500",
                     "10 - 1500 5", "20 # 1500", "20 - 1500 15"]
    assert extra.getvalue().splitlines()[1:] == ["5.400 d 1 1500"]
    assert "# init timestamp: 100" in text_before_close
    path = tmp_path / "a.up.log"
    path.write_text(text_before_close + "30 # 1500\n40 # 1500\n")
    (tmp_path / "a.up.drops").write_text(extra.getvalue())
    events = read_log(path)
    assert list(events.delays_ms) == [5.0, 15.0]
    assert len(events.opportunities_ms) == 4
    assert len(events.drops_ms) == 1
    series = link_series(events, bin_ms=20.0)
    # 1500 B per 20 ms bin is 0.6 Mbit/s; the last bin ends with the log (at 40 ms) and
    # holds its last stamp
    assert list(series["edges_s"]) == pytest.approx([0.0, 0.02, 0.04])
    assert list(series["throughput_mbit"]) == pytest.approx([0.6, 0.6])
    assert list(series["capacity_mbit"]) == pytest.approx([0.6, 1.8])
    short = link_series(events, bin_ms=30.0)  # a last bin of 10 ms: its rate over 10 ms
    assert list(short["edges_s"]) == pytest.approx([0.0, 0.03, 0.04])
    assert list(short["capacity_mbit"]) == pytest.approx([0.8, 2.4])  # 30 and 40 ms


def test_an_unlimited_link_logs_arrival_and_departure_only() -> None:
    q = LinkQueue(None, delay_ms=3.0)
    handle = io.StringIO()
    q.log = LinkLog(handle, origin_ms=0.0, opportunities=None, header=[])
    q.offer("p", 80, 2.0)
    assert [x for x in handle.getvalue().splitlines() if not x.startswith("#")] == [
        "2 + 80", "2 - 80 0"]
