"""What Mahimahi's own graph scripts accept, for tests: their log parsers, rewritten.

Mahimahi's ``scripts/mm-throughput-graph`` and ``scripts/mm-delay-graph`` (Perl, GPL-3,
github.com/ravinet/mahimahi; not copied here) read an mm-link log line by line before
they plot it with gnuplot. This module reproduces what those scripts check and compute
on the way, so a test can tell whether the unmodified scripts would read a log:

- a line ``# base timestamp: N`` sets the base (a second one is fatal); other ``#``
  lines are skipped; every other line is ``TIMESTAMP TYPE BYTES [DELAY]`` split on
  whitespace, and both TIMESTAMP and BYTES must be runs of decimal digits ("Invalid
  timestamp", "Invalid byte count"); an event before the base line is fatal;
- mm-throughput-graph knows exactly three types, ``+`` (arrival), ``#`` (delivery
  opportunity) and ``-`` (departure, with DELAY >= 0 and TIMESTAMP - DELAY >= 0, both
  after taking the base off), and stops at any other ("Unknown event type"); it then
  needs a non-zero duration, a capacity to divide by (a log without ``#`` lines stops
  with a division by zero) and at least one departure, and at least two bins;
- mm-delay-graph reads only the departures (other types are skipped) and needs one;
- the statistics both print: the mean capacity and throughput in Mbit/s over the
  log's span, the 95th percentile per-packet delay (element ``int(0.95 n)`` of the
  sorted delays) and the 95th percentile "signal delay" (the smallest delay of the
  packets sent in each millisecond, filled backwards one ms at a time).

:func:`run_real_script` runs the real scripts where a test run has them
(``MAHIMAHI_SCRIPTS`` names their folder), with a stand-in ``gnuplot`` when none is
installed, so that the two can be compared.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

DIGITS = re.compile(r"^\d+$")
SCRIPTS_ENV = "MAHIMAHI_SCRIPTS"


class ScriptDies(Exception):
    """The script would stop (Perl ``die``) with this message."""


@dataclass(frozen=True)
class Event:
    t: int
    kind: str
    size: int
    delay: float | None


def _events(text: str, *, known: tuple[str, ...] | None) -> list[Event]:
    base: int | None = None
    out: list[Event] = []
    for line in text.split("\n"):
        if line == "":
            continue  # the split after the file's last newline
        match = re.match(r"^# base timestamp: (\d+)", line)
        if match:
            if base is not None:
                raise ScriptDies("base timestamp multiply defined")
            base = int(match.group(1))
            continue
        if line.startswith("#"):
            continue
        fields = re.split(r"\s+", line)
        if len(fields) < 3 or fields[2] == "":
            raise ScriptDies("Format: timestamp event_type num_bytes [delay]")
        stamp, kind, size = fields[0], fields[1], fields[2]
        delay_text = fields[3] if len(fields) > 3 and fields[3] != "" else None
        if not DIGITS.match(stamp):
            raise ScriptDies(f"Invalid timestamp: {stamp}")
        if not DIGITS.match(size):
            raise ScriptDies(f"Invalid byte count: {size}")
        if base is None:
            raise ScriptDies("logfile is missing base timestamp")
        t = int(stamp) - base
        if known is not None and kind not in known:
            raise ScriptDies(f"Unknown event type: {kind}")
        delay = None
        if kind == "-":
            if delay_text is None:
                raise ScriptDies("Departure format: timestamp - num_bytes delay")
            delay = float(delay_text)
        out.append(Event(t, kind, int(size), delay))
    return out


def _signal_delays(departures: list[Event]) -> dict[int, float]:
    signal: dict[int, float] = {}
    for e in departures:
        assert e.delay is not None
        sent = int(e.t - e.delay)
        signal[sent] = min(e.delay, signal.get(sent, float("inf")))
    if signal:
        for ts in range(max(signal), min(signal) - 1, -1):
            if ts not in signal:
                signal[ts] = signal[ts + 1] + 1
    return signal


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.95 * len(ordered))]


def throughput_graph(text: str, ms_per_bin: int = 500) -> dict[str, float]:
    """mm-throughput-graph's checks and printed statistics, or ScriptDies."""
    events = _events(text, known=("+", "#", "-"))
    if not events:
        raise ScriptDies("Must have at least one event")
    for e in events:
        if e.kind == "-":
            assert e.delay is not None
            if e.delay < 0:
                raise ScriptDies(f"Invalid delay: {e.delay:g}")
            if e.t - e.delay < 0:
                raise ScriptDies(f"Invalid timestamp and delay: ts={e.t}, delay={e.delay:g}")
    first = events[0].t
    last = max(e.t for e in events)
    duration_s = (last - first) / 1000.0
    bits = {kind: sum(e.size * 8 for e in events if e.kind == kind) for kind in "+#-"}
    if duration_s == 0:
        raise ScriptDies("Illegal division by zero")
    capacity = bits["#"] / duration_s / 1e6
    throughput = bits["-"] / duration_s / 1e6
    departures = [e for e in events if e.kind == "-"]
    if not departures:
        raise ScriptDies("Must have at least one departure event")
    if capacity == 0:
        raise ScriptDies("Illegal division by zero")  # the utilisation's denominator
    bins = {e.t // ms_per_bin for e in events}
    if min(bins) == max(bins):
        raise ScriptDies("MS_PER_BIN is too large for length of trace")
    delays = [e.delay for e in departures if e.delay is not None]
    return {"capacity_mbit": capacity, "ingress_mbit": bits["+"] / duration_s / 1e6,
            "throughput_mbit": throughput, "utilization_pct": 100.0 * throughput / capacity,
            "p95_delay_ms": _p95(delays),
            "p95_signal_delay_ms": _p95(list(_signal_delays(departures).values()))}


def delay_graph(text: str) -> dict[str, float]:
    """mm-delay-graph's checks and printed statistics, or ScriptDies."""
    departures = [e for e in _events(text, known=None) if e.kind == "-"]
    if not departures:
        raise ScriptDies("Must have at least one departure event")
    delays = [e.delay for e in departures if e.delay is not None]
    return {"p95_delay_ms": _p95(delays),
            "p95_signal_delay_ms": _p95(list(_signal_delays(departures).values()))}


def scripts_folder() -> Path | None:
    """Where the real scripts are, if this test run has them."""
    folder = os.environ.get(SCRIPTS_ENV)
    if folder and (Path(folder) / "mm-throughput-graph").is_file():
        return Path(folder)
    found = shutil.which("mm-throughput-graph")
    return Path(found).parent if found else None


def run_real_script(name: str, log: Path, *args: str, tmp: Path,
                    ) -> subprocess.CompletedProcess[str]:
    """Run Mahimahi's script NAME on LOG; gnuplot is a stand-in that swallows the plot
    where none is installed (the scripts pipe their data into it)."""
    folder = scripts_folder()
    assert folder is not None
    env = dict(os.environ)
    if shutil.which("gnuplot") is None:
        bin_dir = tmp / "bin"
        bin_dir.mkdir(exist_ok=True)
        stand_in = bin_dir / "gnuplot"
        stand_in.write_text("#!/bin/sh\ncat > /dev/null\n")
        stand_in.chmod(0o755)
        env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    return subprocess.run(["perl", str(folder / name), *args, str(log)], env=env, text=True,
                          capture_output=True, timeout=120, check=False)


def printed_statistics(stderr: str) -> dict[str, float]:
    """The statistics a real script printed (its STDERR lines), by the keys above."""
    patterns = {"capacity_mbit": r"Average capacity: ([\d.]+)",
                "throughput_mbit": r"Average throughput: ([\d.]+)",
                "utilization_pct": r"\(([\d.]+)% utilization\)",
                "p95_delay_ms": r"95th percentile per-packet queueing delay: ([\d.]+)",
                "p95_signal_delay_ms": r"95th percentile signal delay: ([\d.]+)"}
    out = {}
    for key, pattern in patterns.items():
        match = re.search(pattern, stderr)
        if match:
            out[key] = float(match.group(1))
    return out
