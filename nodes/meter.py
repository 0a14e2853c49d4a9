"""Explainable costs of one operation: its sequential RPC rounds, and bytes and time per phase.

A *round* is a busy period of the node's client: it starts when a call is sent while no
other call of this node is in flight and ends when the last one in flight returns. The
calls of one round run concurrently (``PolicyEnv.concurrently``), so the rounds are the
sequential waits an action pays on the network; with ``fresh`` connections each call of
a round also pays the TCP and channel handshakes (counted in ``connections``).

``handshake_rounds`` counts the sequential round trips those handshakes add: two (the
TCP handshake, then the channel's two-message handshake) for every round in which at
least one call opened a new connection (the connections a round opens open
concurrently). ``exchanges`` counts the request/response exchanges (calls), however
they overlap. Beside the per-operation counts (:meth:`reset` zeroes them) the meter
keeps running totals (``total_rounds``, ``total_handshake_rounds``) that a caller marks
before something it times, e.g. a policy hook, and reads the rounds since after it
(:meth:`RoundMeter.mark`, :meth:`RoundMeter.rounds_since`), without resetting the
operation's counts.

A round takes the phase of the call that opened it: head reads (owner ``heads``,
``dir_heads``, replica ``versions``, and policy-defined methods of phase ``query``) are
``query`` before the operation's first replan
and ``revalidation`` after it; content transfers (``fetch``, and anything else) are
``fetch``. Bytes of a round are the node's sent plus received frame bytes over the
round, which is the traffic of the exchanges in it while the node takes part in no other
exchange (the controller runs an episode's operations one at a time). Calls a node
answers itself (no socket) open no round.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nodes.transport import Counters

T = TypeVar("T")
PHASES: tuple[str, ...] = ("query", "fetch", "revalidation")
HEAD_READS = frozenset({"heads", "dir_heads", "versions"})
#: Sequential round trips a new connection adds before its first request: TCP's
#: handshake and the channel's (message 1 out, message 2 back).
HANDSHAKE_ROUND_TRIPS = 2


class RoundMeter:
    """Counts rounds and per-phase bytes and time; :meth:`reset` at each operation."""

    def __init__(self, counters: Counters) -> None:
        self._counters = counters
        self.total_rounds = 0
        self.total_handshake_rounds = 0
        self.reset()

    def reset(self) -> None:
        self.rounds = 0
        self.handshake_rounds = 0
        self.exchanges = 0
        self.replanned = False
        self.bytes = dict.fromkeys(PHASES, 0)
        self.ms = dict.fromkeys(PHASES, 0.0)
        #: CLOCK_MONOTONIC ns at which the last head read of the operation returned, and at
        #: which the round holding it began (its requests were sent).
        self.last_head_read_ns = 0
        self.last_head_round_ns = 0
        self._in_flight = 0
        self._phase = ""
        self._start_bytes = 0
        self._start_ns = 0
        self._start_opened = 0

    def _traffic(self) -> int:
        return self._counters.bytes_sent + self._counters.bytes_received

    def phase_of(self, method: str, head_read: bool | None = None) -> str:
        if (method in HEAD_READS) if head_read is None else head_read:
            return "revalidation" if self.replanned else "query"
        return "fetch"

    async def measure(self, method: str, call: Callable[[], Awaitable[T]], *,
                      head_read: bool | None = None) -> T:
        """Run one remote call, accounting it to the current round (or opening one).
        ``head_read`` says whether a policy-defined method reads heads (its ``phase``);
        None: the built-in method's own kind."""
        is_head_read = (method in HEAD_READS) if head_read is None else head_read
        if self._in_flight == 0:
            self.rounds += 1
            self.total_rounds += 1
            self._phase = self.phase_of(method, head_read)
            self._start_bytes = self._traffic()
            self._start_ns = time.monotonic_ns()
            self._start_opened = self._counters.connections_opened
        self._in_flight += 1
        self.exchanges += 1
        try:
            return await call()
        finally:
            self._in_flight -= 1
            now = time.monotonic_ns()
            if is_head_read:
                self.last_head_read_ns = now
                self.last_head_round_ns = self._start_ns
            if self._in_flight == 0:
                self.bytes[self._phase] += self._traffic() - self._start_bytes
                self.ms[self._phase] += (now - self._start_ns) / 1e6
                if self._counters.connections_opened > self._start_opened:
                    self.handshake_rounds += HANDSHAKE_ROUND_TRIPS
                    self.total_handshake_rounds += HANDSHAKE_ROUND_TRIPS

    def mark(self) -> tuple[int, int]:
        """The running totals now, for :meth:`rounds_since`."""
        return self.total_rounds, self.total_handshake_rounds

    def rounds_since(self, mark: tuple[int, int] | None) -> dict[str, int]:
        """``rounds`` and ``handshake_rounds`` since MARK (both 0 without one: a hook
        off the path reports none, as it reports no stall)."""
        if mark is None:
            return {"rounds": 0, "handshake_rounds": 0}
        return {"rounds": self.total_rounds - mark[0],
                "handshake_rounds": self.total_handshake_rounds - mark[1]}

    def report(self) -> dict[str, float | int]:
        """The act reply's fields: ``rounds``, ``handshake_rounds``, ``exchanges``,
        ``<phase>_bytes``, ``<phase>_ms``."""
        out: dict[str, float | int] = {"rounds": self.rounds,
                                       "handshake_rounds": self.handshake_rounds,
                                       "exchanges": self.exchanges}
        for phase in PHASES:
            out[f"{phase}_bytes"] = self.bytes[phase]
            out[f"{phase}_ms"] = self.ms[phase]
        return out
