"""Packet logs of one link direction in Mahimahi's mm-link log format, and reading them.

Format (as mm-link writes it with ``--uplink-log`` / ``--downlink-log``): a header of
``#`` lines, then one event per line, times in ms since the log's base timestamp:

- ``T + SIZE``: a packet of SIZE bytes arrived at the queue;
- ``T # 1500``: a delivery opportunity (written for every one, used or not);
- ``T - SIZE DELAY``: a packet left the queue, DELAY ms after it arrived (its queueing
  delay; the propagation delay comes after and is not in the log);
- ``T d COUNT BYTES``: COUNT packets of BYTES bytes in total were dropped (queue full, or
  CoDel). A packet lost by the loss model (after the queue, like mm-loss behind
  mm-link) is logged as a departure followed by a drop line at the same time.

Times here are written with microsecond resolution (Mahimahi writes whole ms; its
tools read either). An unlimited link (no rate, no trace) has no opportunities: each
arrival is followed by its departure with delay 0.

Reading logs back (for plots) is ``testbed.links.logread``; this module stays small
because the emulator process imports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TextIO

PACKET_BYTES = 1500


class _Opportunities(Protocol):
    def time_of(self, k: int) -> float: ...

    def first_at_or_after(self, t_ms: float) -> int: ...


class LinkLog:
    """Writes one direction's events (module rules); times are model ms."""

    def __init__(self, handle: TextIO, *, origin_ms: float,
                 opportunities: _Opportunities | None, header: Iterable[str]) -> None:
        self.handle = handle
        self.origin_ms = origin_ms
        self.opportunities = opportunities
        self._k = 0 if opportunities is None else opportunities.first_at_or_after(0.0)
        self.write = handle.write
        for line in header:
            self.write(f"# {line}\n")
        self.write(f"# init timestamp: {round(origin_ms)}\n# base timestamp: 0\n")

    def _catch_up(self, t_ms: float, *, inclusive: bool) -> None:
        """Write every opportunity before T_MS (or at it, with INCLUSIVE)."""
        opps = self.opportunities
        if opps is None:
            return
        rel = t_ms - self.origin_ms
        k = self._k
        write = self.write
        while True:
            t = opps.time_of(k)
            if t > rel or (t == rel and not inclusive):
                break
            write(f"{t:.3f} # {PACKET_BYTES}\n")
            k += 1
        self._k = k

    def arrival(self, t_ms: float, size: int) -> None:
        self._catch_up(t_ms, inclusive=False)
        self.write(f"{t_ms - self.origin_ms:.3f} + {size}\n")

    def opportunity(self, t_ms: float) -> None:
        self._catch_up(t_ms, inclusive=True)

    def departure(self, t_ms: float, size: int, delay_ms: float) -> None:
        self.write(f"{t_ms - self.origin_ms:.3f} - {size} {delay_ms:.3f}\n")

    def drop(self, t_ms: float, size: int) -> None:
        self._catch_up(t_ms, inclusive=False)
        self.write(f"{t_ms - self.origin_ms:.3f} d 1 {size}\n")

    def lost(self, t_ms: float, size: int) -> None:
        self.write(f"{t_ms - self.origin_ms:.3f} d 1 {size}\n")

    def close(self, now_ms: float) -> None:
        """Write the opportunities up to NOW_MS and close the file."""
        self._catch_up(now_ms, inclusive=True)
        self.handle.close()
