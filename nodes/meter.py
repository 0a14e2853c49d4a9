"""Explainable costs of one operation: its sequential RPC rounds, and bytes and time per phase.

A *round* is a busy period of the node's client: it starts when a call is sent while no
other call of this node is in flight and ends when the last one in flight returns. The
calls of one round run concurrently (``PolicyEnv.concurrently``), so the rounds are the
sequential waits an action pays on the network; with ``fresh`` connections each call of
a round also pays the TCP and channel handshakes (counted in ``connections``).

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


class RoundMeter:
    """Counts rounds and per-phase bytes and time; :meth:`reset` at each operation."""

    def __init__(self, counters: Counters) -> None:
        self._counters = counters
        self.reset()

    def reset(self) -> None:
        self.rounds = 0
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
            self._phase = self.phase_of(method, head_read)
            self._start_bytes = self._traffic()
            self._start_ns = time.monotonic_ns()
        self._in_flight += 1
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

    def report(self) -> dict[str, float | int]:
        """The act reply's fields: ``rounds``, ``<phase>_bytes``, ``<phase>_ms``."""
        out: dict[str, float | int] = {"rounds": self.rounds}
        for phase in PHASES:
            out[f"{phase}_bytes"] = self.bytes[phase]
            out[f"{phase}_ms"] = self.ms[phase]
        return out
