"""Packet logs of one link direction: Mahimahi's mm-link log, and the testbed's extras.

The log (``<host>.<up|down>.log``) is exactly what mm-link writes with
``--uplink-log`` / ``--downlink-log``, so Mahimahi's own ``mm-throughput-graph`` and
``mm-delay-graph`` read it unmodified: a header of ``#`` lines (``# init timestamp``,
``# base timestamp: 0``), then one event per line, times in whole milliseconds since
the trace start of the episode (the base timestamp):

- ``T + SIZE``: a packet of SIZE bytes arrived at the queue;
- ``T # 1500``: a delivery opportunity (written for every one, used or not);
- ``T - SIZE DELAY``: a packet left the queue; DELAY = T minus the ``+`` time of its
  arrival line (its queueing delay in whole ms; the propagation delay is not in it).

Nothing else goes into the log, because those scripts stop at any other event type
(``Unknown event type``) and at any time that is not a whole number (``Invalid
timestamp``). The testbed's extras go beside it, in ``<host>.<up|down>.drops``:

- ``T d COUNT BYTES``: dropped at the queue (a bound, CoDel's head drop, a drop-head
  queue's eviction): mm-link's own drop line;
- ``T l COUNT BYTES``: lost after the queue by the loss model (the packet used the
  link and has its departure line in the log, as mm-loss behind mm-link would see it);

with times in ms to the microsecond. Times are floored to whole ms in the log, the
clock mm-link keeps. A packet that arrived before the log started (queued across the
episode's trace restart) departs with its delay counted from the log's start, as its
arrival line is not in the log. An unlimited link (no rate, no trace) has no
opportunities: each arrival is followed by its departure with delay 0
(``mm-delay-graph`` reads such a log; ``mm-throughput-graph`` needs a capacity).

Reading logs back (for plots) is ``testbed.links.logread``; this module stays small
because the emulator process imports it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol, TextIO

PACKET_BYTES = 1500
LOG_SUFFIX = ".log"
EXTRA_SUFFIX = ".drops"
"""``<host>.<side>.drops``: the drops and losses beside ``<host>.<side>.log``."""


class _Opportunities(Protocol):
    def time_of(self, k: int) -> float: ...

    def first_at_or_after(self, t_ms: float) -> int: ...


def _ms(rel_ms: float) -> int:
    """Whole ms as mm-link's clock counts them (a little float noise forgiven)."""
    return math.floor(rel_ms + 1e-6)


class LinkLog:
    """Writes one direction's events (module rules); times are model ms.

    HANDLE receives the Mahimahi log, EXTRA (optional) the drops and losses.
    """

    def __init__(self, handle: TextIO, *, origin_ms: float,
                 opportunities: _Opportunities | None, header: Iterable[str],
                 extra: TextIO | None = None, start_ms: float | None = None) -> None:
        self.handle = handle
        self.extra = extra
        self.origin_ms = origin_ms
        #: arrivals before this (relative ms) are not in the log (module rules)
        self.start_rel_ms = max(0.0, (origin_ms if start_ms is None else start_ms)
                                - origin_ms)
        self.opportunities = opportunities
        self._k = 0 if opportunities is None else opportunities.first_at_or_after(
            self.start_rel_ms)
        self.write = handle.write
        for line in header:
            self.write(f"# {line}\n")
        self.write(f"# init timestamp: {round(origin_ms)}\n# base timestamp: 0\n")
        if extra is not None:
            extra.write("# planfence-testbed: drops (d) and losses (l) beside the Mahimahi "
                        "log of the same name; T d|l COUNT BYTES, T in ms since the base "
                        "timestamp\n")

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
            write(f"{_ms(t)} # {PACKET_BYTES}\n")
            k += 1
        self._k = k

    def arrival(self, t_ms: float, size: int) -> None:
        self._catch_up(t_ms, inclusive=False)
        self.write(f"{_ms(t_ms - self.origin_ms)} + {size}\n")

    def opportunity(self, t_ms: float) -> None:
        self._catch_up(t_ms, inclusive=True)

    def departure(self, t_ms: float, size: int, arrival_ms: float) -> None:
        """A packet that arrived at ARRIVAL_MS left at T_MS."""
        left = _ms(t_ms - self.origin_ms)
        came = _ms(max(arrival_ms - self.origin_ms, self.start_rel_ms))
        self.write(f"{left} - {size} {max(0, left - came)}\n")

    def drop(self, t_ms: float, size: int) -> None:
        self._catch_up(t_ms, inclusive=False)
        if self.extra is not None:
            self.extra.write(f"{t_ms - self.origin_ms:.3f} d 1 {size}\n")

    def lost(self, t_ms: float, size: int) -> None:
        if self.extra is not None:
            self.extra.write(f"{t_ms - self.origin_ms:.3f} l 1 {size}\n")

    def close(self, now_ms: float) -> None:
        """Write the opportunities up to NOW_MS and close the files."""
        self._catch_up(now_ms, inclusive=True)
        self.handle.close()
        if self.extra is not None:
            self.extra.close()
