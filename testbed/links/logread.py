"""Reading Mahimahi-format link logs back (``testbed.links.linklog`` writes them): the
series of a ``mm-throughput-graph``-like plot, throughput and capacity per bin and the
queueing delay of every packet. The drops and losses come from the ``.drops`` file
beside a log; logs of runs made before it existed (decimal times, drops inline as
``d`` lines) read the same way."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from testbed.links.linklog import EXTRA_SUFFIX, LOG_SUFFIX, PACKET_BYTES

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class LogEvents:
    """One log as arrays (ms since the log start)."""

    arrivals_ms: FloatArray
    arrival_bytes: FloatArray
    departures_ms: FloatArray
    departure_bytes: FloatArray
    delays_ms: FloatArray
    opportunities_ms: FloatArray
    drops_ms: FloatArray
    header: dict[str, str]
    losses_ms: FloatArray | None = None


def read_log(path: Path | str) -> LogEvents:
    """Parse a Mahimahi-format link log and its ``.drops`` file (lines neither format
    knows are skipped)."""
    cols: dict[str, list[float]] = {k: [] for k in ("+", "+b", "-", "-b", "delay", "#", "d",
                                                    "l")}
    header: dict[str, str] = {}
    path = Path(path)
    _read_into(path, cols, header)
    extra = path.with_name(path.name.removesuffix(LOG_SUFFIX) + EXTRA_SUFFIX)
    if extra.is_file():
        _read_into(extra, cols, {})

    def arr(key: str) -> FloatArray:
        return np.asarray(cols[key], dtype=np.float64)

    return LogEvents(arr("+"), arr("+b"), arr("-"), arr("-b"), arr("delay"), arr("#"),
                     arr("d"), header, arr("l"))


def _read_into(path: Path, cols: dict[str, list[float]], header: dict[str, str]) -> None:
    with open(path, encoding="ascii", errors="replace") as handle:
        for line in handle:
            if line.startswith("#"):
                key, _, value = line[1:].partition(":")
                header[key.strip()] = value.strip()
                continue
            parts = line.split()
            if len(parts) < 3:
                continue
            try:
                t = float(parts[0])
                kind = parts[1]
                if kind == "+":
                    cols["+"].append(t)
                    cols["+b"].append(float(parts[2]))
                elif kind == "-" and len(parts) >= 4:
                    cols["-"].append(t)
                    cols["-b"].append(float(parts[2]))
                    cols["delay"].append(float(parts[3]))
                elif kind == "#":
                    cols["#"].append(t)
                elif kind in ("d", "l"):
                    cols[kind].append(t)
            except ValueError:
                continue


def link_series(events: LogEvents, *, bin_ms: float = 500.0) -> dict[str, Any]:
    """Per-bin throughput and capacity (Mbit/s) and per-packet queueing delay.

    Keys: ``t_s`` (bin starts), ``edges_s`` (every bin's edges: the last bin ends with
    the log, so it is as wide as what it covers and its rate is over that width),
    ``throughput_mbit``, ``capacity_mbit`` (None for an unlimited link), ``delay_t_s``,
    ``delay_ms`` (one point per departure).
    """
    ends = [a.max() for a in (events.arrivals_ms, events.departures_ms,
                              events.opportunities_ms) if a.size]
    span = max(ends) if ends else 0.0
    starts = np.arange(0.0, span, bin_ms) if span > 0 else np.zeros(1)
    edges = np.append(starts, span if span > 0 else bin_ms)
    to_mbit = 8.0 / (np.diff(edges) * 1000.0)  # bytes per bin -> Mbit/s
    throughput, _ = np.histogram(events.departures_ms, bins=edges,
                                 weights=events.departure_bytes)
    capacity = None
    if events.opportunities_ms.size:
        counts, _ = np.histogram(events.opportunities_ms, bins=edges)
        capacity = counts * PACKET_BYTES * to_mbit
    return {
        "t_s": edges[:-1] / 1000.0,
        "edges_s": edges / 1000.0,
        "throughput_mbit": throughput * to_mbit,
        "capacity_mbit": capacity,
        "delay_t_s": events.departures_ms / 1000.0,
        "delay_ms": events.delays_ms,
    }
