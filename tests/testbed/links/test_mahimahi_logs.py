"""The packet logs are Mahimahi's: its own graph scripts read them unmodified.

The logs come from the emulator's own writer (``LinkLog`` on a ``LinkQueue``) over a
trace with an outage, a bounded queue that drops, loss after the queue, CoDel, a
drop-head queue and a packet queued across the log's start. Each must pass what
``mm-throughput-graph`` and ``mm-delay-graph`` check (tests/testbed/links/
mahimahi_graphs.py), with the statistics they print matching the model's. Where the
real scripts are at hand (``MAHIMAHI_SCRIPTS=<folder>``: Mahimahi's ``scripts/``), they
run on the same logs and must print the same statistics.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest

from testbed.links.disciplines import Codel
from testbed.links.linklog import EXTRA_SUFFIX, LinkLog
from testbed.links.logread import link_series, read_log
from testbed.links.model import LinkQueue, TraceOpportunities
from tests.testbed.links import mahimahi_graphs as mm


def _logged_queue(tmp_path: Path, name: str, queue: LinkQueue, *, origin_ms: float,
                  start_ms: float | None = None) -> tuple[Path, io.StringIO, io.StringIO]:
    log, extra = io.StringIO(), io.StringIO()
    assert queue.opportunities is not None
    queue.log = LinkLog(log, origin_ms=origin_ms, opportunities=queue.opportunities,
                        header=[f"mahimahi mm-link (uplink) [{name}] > {name}.up.log"],
                        extra=extra, start_ms=start_ms)
    return tmp_path / f"{name}.up.log", log, extra


def _write(queue: LinkQueue, path: Path, log: io.StringIO, extra: io.StringIO,
           until_ms: float) -> str:
    queue.advance(until_ms)
    assert queue.log is not None
    queue.log._catch_up(until_ms, inclusive=True)
    path.write_text(log.getvalue())
    path.with_name(path.name.removesuffix(".log") + EXTRA_SUFFIX).write_text(extra.getvalue())
    return log.getvalue()


def _bursty(queue: LinkQueue, *, origin_ms: float, seconds: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    t = origin_ms
    while t < origin_ms + seconds * 1000:
        for _ in range(rng.randrange(1, 12)):
            queue.offer(None, rng.choice((60, 576, 1500)), t)
        t += rng.uniform(0.5, 30.0)
        queue.advance(t)


def _trace() -> TraceOpportunities:
    """12 Mbit/s for 2 s, nothing for 1.5 s, 6 Mbit/s to 5 s, with an offset."""
    stamps = [*range(0, 2000), *range(3500, 5001, 2)]
    return TraceOpportunities(stamps, 5000, 250.5)


CASES = {
    "droptail": dict(queue_packets=50),
    "loss": dict(queue_packets=1000, loss_pct=3.0),
    "codel": dict(queue_packets=1000, codel=Codel(5.0, 100.0)),
    "drophead": dict(queue_packets=30, drop_head=True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_emulators_logs_pass_mahimahis_graph_scripts(case: str, tmp_path: Path) -> None:
    origin = 10_000.25
    queue = LinkQueue(_trace(), rng=random.Random(3), origin_ms=origin - 100.0,
                      **CASES[case])
    queue.offer(None, 1500, origin - 40.0)  # queued before the log starts: no arrival line
    queue.restart(origin)  # the episode's trace restart; the packet keeps its place
    path, log, extra = _logged_queue(tmp_path, case, queue, origin_ms=origin,
                                     start_ms=origin + 0.5)
    _bursty(queue, origin_ms=origin + 0.5, seconds=8)
    text = _write(queue, path, log, extra, origin + 9000.0)

    lines = [x for x in text.splitlines() if not x.startswith("#")]
    assert {x.split()[1] for x in lines} == {"+", "#", "-"}
    assert all(x.split()[0].isdigit() for x in lines), "whole ms, as mm-link writes"
    assert "# base timestamp: 0" in text
    stats = mm.throughput_graph(text, 500)
    delays = mm.delay_graph(text)
    assert delays["p95_delay_ms"] == stats["p95_delay_ms"]
    events = read_log(path)
    span_s = (events.opportunities_ms.max() - 0) / 1000.0
    assert stats["capacity_mbit"] == pytest.approx(
        events.opportunities_ms.size * 1500 * 8 / span_s / 1e6, rel=0.01)
    assert stats["throughput_mbit"] < stats["capacity_mbit"]
    dropped = events.drops_ms.size + (0 if events.losses_ms is None else events.losses_ms.size)
    if case != "codel":
        assert dropped > 0, "the case drops or loses packets; they are beside the log"
    assert queue.counters.drops == dropped
    series = link_series(events, bin_ms=100.0)
    if case != "drophead":  # drop-head keeps the newest packets through the outage
        assert max(series["delay_ms"]) >= 1000, "the 1.5 s outage held packets"


def test_the_old_log_format_is_what_the_scripts_refused() -> None:
    """Decimal times and drop lines: what the log was before (the issue's report)."""
    with pytest.raises(mm.ScriptDies, match=r"^Invalid timestamp: 2\.000$"):
        mm.throughput_graph("# base timestamp: 0\n2.000 + 1500\n")
    with pytest.raises(mm.ScriptDies, match=r"^Unknown event type: d$"):
        mm.throughput_graph("# base timestamp: 0\n2 + 1500\n2 d 1 1500\n")
    with pytest.raises(mm.ScriptDies, match=r"^Invalid timestamp: 2\.000$"):
        mm.delay_graph("# base timestamp: 0\n2.000 - 1500 0.000\n")


def test_an_unlimited_link_reads_in_the_delay_graph_only(tmp_path: Path) -> None:
    queue = LinkQueue(None)
    log, extra = io.StringIO(), io.StringIO()
    queue.log = LinkLog(log, origin_ms=0.0, opportunities=None, header=[], extra=extra)
    for i in range(20):
        queue.offer(None, 100, i * 10.5)
    text = log.getvalue()
    assert mm.delay_graph(text)["p95_delay_ms"] == 0
    with pytest.raises(mm.ScriptDies, match="division by zero"):
        mm.throughput_graph(text)  # no capacity to divide by, as in Mahimahi


@pytest.mark.skipif(mm.scripts_folder() is None,
                    reason="Mahimahi's scripts are not here (MAHIMAHI_SCRIPTS=<its scripts/>)")
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_real_scripts_print_the_same_statistics(case: str, tmp_path: Path) -> None:
    origin = 500.0
    queue = LinkQueue(_trace(), rng=random.Random(5), origin_ms=origin, **CASES[case])
    path, log, extra = _logged_queue(tmp_path, case, queue, origin_ms=origin)
    _bursty(queue, origin_ms=origin, seconds=6, seed=9)
    text = _write(queue, path, log, extra, origin + 7000.0)
    ours = mm.throughput_graph(text, 500)
    real = mm.run_real_script("mm-throughput-graph", path, "500", tmp=tmp_path)
    assert real.returncode == 0, real.stderr
    printed = mm.printed_statistics(real.stderr)
    assert printed["capacity_mbit"] == pytest.approx(ours["capacity_mbit"], abs=0.006)
    assert printed["throughput_mbit"] == pytest.approx(ours["throughput_mbit"], abs=0.006)
    assert printed["p95_delay_ms"] == pytest.approx(ours["p95_delay_ms"], abs=0.5)
    assert printed["p95_signal_delay_ms"] == pytest.approx(ours["p95_signal_delay_ms"],
                                                           abs=0.5)
    delay = mm.run_real_script("mm-delay-graph", path, tmp=tmp_path)
    assert delay.returncode == 0, delay.stderr
    assert mm.printed_statistics(delay.stderr)["p95_delay_ms"] == pytest.approx(
        ours["p95_delay_ms"], abs=0.5)
    old = tmp_path / "old.log"
    old.write_text("# base timestamp: 0\n2.000 + 1500\n")
    refused = mm.run_real_script("mm-throughput-graph", old, "500", tmp=tmp_path)
    assert refused.returncode != 0
    assert "Invalid timestamp: 2.000" in refused.stderr
