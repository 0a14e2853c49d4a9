"""Trace loader and replay arithmetic, checked against a naive Mahimahi-style unroll."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from testbed.links.traces import (
    TRACE_DIR,
    Trace,
    TraceError,
    load_named,
    load_trace,
    trace_catalogue,
)
from testbed.tools.traces_view import summarize, traces_list, traces_show


def write(tmp_path: Path, text: str, name: str = "t.up") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="ascii")
    return path


def make(stamps: list[int], name: str = "mem.up") -> Trace:
    arr = np.asarray(stamps, dtype=np.int64)
    return Trace(name=name, direction="up", stamps_ms=arr, period_ms=int(arr[-1]))


def naive_opportunities(stamps: list[int], start: float, end: float, offset: float) -> list[float]:
    """Reference: walk the trace cycle by cycle the way mm-link does."""
    period = stamps[-1]
    offset = offset % period
    out: list[float] = []
    base = 0
    while base + 0 <= offset + end + period:
        for s in stamps:
            t = base + s - offset
            if start <= t < end:
                out.append(float(t))
        base += period
    return sorted(out)


# --- loader errors -------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "\n\n", "   \n"])
def test_empty_file_is_rejected_with_its_name(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(TraceError, match=r"t\.up: trace is empty"):
        load_trace(path)


def test_non_numeric_line_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "1\n2\nthree\n4\n")
    with pytest.raises(TraceError, match=r"t\.up:3: expected an integer") as info:
        load_trace(path)
    assert "three" in str(info.value)


def test_fractional_stamp_is_not_an_integer(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r":2: expected an integer"):
        load_trace(write(tmp_path, "1\n2.5\n"))


def test_negative_stamp_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"t\.up:1: stamp -4 is negative"):
        load_trace(write(tmp_path, "-4\n3\n"))


def test_decreasing_stamps_name_the_line(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"t\.up:4: stamp 5 is smaller than the previous 9"):
        load_trace(write(tmp_path, "1\n1\n9\n5\n"))


def test_all_zero_trace_has_no_duration(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="longer than 0 ms"):
        load_trace(write(tmp_path, "0\n0\n"))


def test_direction_from_suffix_or_argument(tmp_path: Path) -> None:
    assert load_trace(write(tmp_path, "5\n", "a.down")).direction == "down"
    odd = write(tmp_path, "5\n", "a.txt")
    with pytest.raises(TraceError, match=r"a\.txt: cannot tell the direction"):
        load_trace(odd)
    assert load_trace(odd, direction="up").direction == "up"


def test_binary_file_is_a_trace_error(tmp_path: Path) -> None:
    path = tmp_path / "bin.up"
    path.write_bytes(b"\xff\xfe1\n")
    with pytest.raises(TraceError, match=r"bin\.up"):
        load_trace(path)


def test_stamps_are_read_only(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "1\n2\n"))
    with pytest.raises(ValueError, match="read-only"):
        trace.stamps_ms[0] = 7


# --- rates and replay ----------------------------------------------------------------


def test_one_line_trace_is_12_mbit(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "1\n"))
    assert trace.period_ms == 1
    assert trace.mean_rate_kbit() == pytest.approx(12_000.0)
    # one opportunity each millisecond, the first at 1 ms after replay start
    opp = trace.opportunities(0, 1000)
    assert opp.size == 999
    assert opp[0] == 1.0
    assert np.all(np.diff(opp) == 1.0)


def test_repeated_stamps_are_several_packets(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "3\n3\n3\n10\n"))
    assert trace.mean_rate_kbit() == pytest.approx(4 * 12_000 / 10)
    assert trace.opportunities(0, 4).tolist() == [3.0, 3.0, 3.0]
    assert trace.opportunities(0, 20).tolist() == [3.0, 3.0, 3.0, 10.0, 13.0, 13.0, 13.0]


def test_wrap_around_with_offset() -> None:
    trace = make([2, 5, 10])
    # unrolled trace time: 2 5 10 12 15 20 22 25 30 ...; replay starts at trace time 7
    assert trace.opportunities(0, 16, offset_ms=7).tolist() == [3.0, 5.0, 8.0, 13.0, 15.0]
    # an offset of whole periods is the same as no offset
    assert trace.opportunities(0, 50, 30).tolist() == trace.opportunities(0, 50, 0).tolist()
    # a window that starts later
    assert trace.opportunities(13, 16, offset_ms=7).tolist() == [13.0, 15.0]


def test_longest_outage_counts_the_wrap_gap() -> None:
    assert make([3, 10]).longest_outage_ms() == 7
    # 8 -> 10 is 2 ms, then the wrap: 10 -> 10 + 8 = 18 is 8 ms
    assert make([8, 10]).longest_outage_ms() == 8
    assert make([1]).longest_outage_ms() == 1


def test_capacity_series_bins() -> None:
    trace = make([*range(1, 2001), 2500])
    series = trace.capacity_series_kbit(1000)
    assert series.size == 3
    # bin 0 holds stamps 1..999, bin 1 holds 1000..1999, bin 2 holds 2000 and 2500
    assert series.tolist() == pytest.approx([999 * 12.0, 1000 * 12.0, 2 * 12.0 * 1000 / 500])
    with pytest.raises(ValueError, match="bin_ms"):
        trace.capacity_series_kbit(0)


def test_bad_windows() -> None:
    trace = make([1])
    assert trace.opportunities(5, 5).size == 0
    with pytest.raises(ValueError, match="start_ms"):
        trace.opportunities(-1, 5)
    with pytest.raises(ValueError, match="offset_ms"):
        trace.opportunities(0, 5, -3)


trace_lists = st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=25).map(
    sorted
).filter(lambda s: s[-1] > 0)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    stamps=trace_lists,
    start=st.integers(min_value=0, max_value=120),
    length=st.integers(min_value=0, max_value=150),
    offset=st.integers(min_value=0, max_value=200),
)
def test_opportunities_match_naive_unroll(
    stamps: list[int], start: int, length: int, offset: int
) -> None:
    got = make(stamps).opportunities(start, start + length, offset).tolist()
    assert got == naive_opportunities(stamps, start, start + length, offset)


@settings(max_examples=100, derandomize=True, deadline=None)
@given(stamps=trace_lists, cut=st.integers(min_value=0, max_value=300),
       offset=st.integers(min_value=0, max_value=100))
def test_windows_add_up(stamps: list[int], cut: int, offset: int) -> None:
    trace = make(stamps)
    whole = trace.opportunities(0, 300, offset)
    parts = np.concatenate([trace.opportunities(0, cut, offset), trace.opportunities(cut, 300, offset)])
    assert whole.tolist() == parts.tolist()


# --- catalogue -----------------------------------------------------------------------

def readme_rows() -> dict[str, tuple[float, float, float]]:
    """Per shipped trace, (mean Mbit/s, length s, longest gap s) as traces/README.md's
    table states them (the recipe for a new network adds a row there)."""
    rows: dict[str, tuple[float, float, float]] = {}
    for line in (TRACE_DIR / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[1].startswith("`"):
            continue
        up = cells[1].split("`")[1]
        stem = up.removesuffix(".up")
        lengths, means, gaps = ([float(x) for x in re.findall(r"[0-9.]+", cell)]
                                for cell in cells[2:5])
        rows[up] = (means[0], lengths[0], gaps[0])
        rows[f"{stem}.down"] = (means[1], lengths[1], gaps[1])
    return rows


SHIPPED = readme_rows()


def test_catalogue_lists_the_shipped_traces() -> None:
    assert TRACE_DIR.name == "traces"
    assert sorted(trace_catalogue()) == sorted(SHIPPED), "each trace needs a README row"
    assert "ATT-LTE-driving.up" in SHIPPED


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_trace_rates_match_readme(name: str) -> None:
    mbit, length_s, gap_s = SHIPPED[name]
    trace = load_named(name)
    assert trace.direction == name.rsplit(".", 1)[1]
    assert trace.mean_rate_kbit() / 1000 == pytest.approx(mbit, rel=0.01)
    assert trace.length_s == pytest.approx(length_s, abs=0.05)
    assert trace.longest_outage_ms() / 1000 == pytest.approx(gap_s, abs=0.05)
    assert load_named(name) is trace  # cached


def test_att_uplink_has_long_outages() -> None:
    trace = load_named("ATT-LTE-driving.up")
    assert trace.longest_outage_ms() > 60_000
    assert trace.opportunities(0, 800).size == 0  # first opportunity is at 831 ms


def test_env_var_selects_another_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "1\n", "mine.down")
    write(tmp_path, "not a trace", "notes.txt")
    monkeypatch.setenv("TESTBED_TRACE_DIR", str(tmp_path))
    assert list(trace_catalogue()) == ["mine.down"]
    assert load_named("mine.down").mean_rate_kbit() == pytest.approx(12_000)
    with pytest.raises(TraceError, match=r"unknown name 'ATT-LTE-driving\.up'.*allowed: mine\.down"):
        load_named("ATT-LTE-driving.up")


# --- `testbed traces list|show` ------------------------------------------------------


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200, color_system=None), buf


def test_traces_list_shows_every_trace_with_its_numbers() -> None:
    console, buf = _console()
    traces_list(console)
    out = buf.getvalue()
    for name in SHIPPED:
        assert name in out
    row = next(line for line in out.splitlines() if "ATT-LTE-driving.up" in line)
    assert "1012.5" in row
    assert "0.83" in row
    assert "78.3" in row  # the longest uplink outage, in seconds


def test_traces_show_writes_a_png(tmp_path: Path) -> None:
    console, buf = _console()
    plot = tmp_path / "sub" / "att.png"
    traces_show("ATT-LTE-driving.up", plot, console)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = buf.getvalue()
    assert "0.834 Mbit/s" in out
    assert "94 s" in out  # zero-capacity seconds of the AT&T uplink (1 s bins)


def test_traces_show_unknown_name_is_a_trace_error() -> None:
    console, _ = _console()
    with pytest.raises(TraceError, match="unknown name 'nope'"):
        traces_show("nope", None, console)


def test_summary_of_a_tiny_trace() -> None:
    s = summarize(make([500, 500, 3000]))
    assert (s.length_s, s.opportunities, s.longest_outage_s) == (3.0, 3, 2.5)
    assert s.zero_capacity_s == 1.0  # bin [1 s, 2 s) has no opportunity
    assert s.mean_mbit == pytest.approx(3 * 12 / 3000)
