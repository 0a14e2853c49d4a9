"""Liveness of one node while an episode runs: how often to ping it, when it is frozen.

Rules of this module:

1. Each node is watched on its own (one slow node never delays the pings of another):
   a ping every ``interval_s = timeout_s / PINGS_PER_TIMEOUT``, the next one
   ``interval_s`` after the previous answer.
2. Each ping must be answered within ``answer_within_s = timeout_s - interval_s``. This
   catches every freeze longer than ``timeout_s``: a freeze that starts right after an
   answer meets the next ping ``interval_s`` later and holds it for the rest of the
   freeze, more than ``timeout_s - interval_s``; a freeze that starts while a ping is
   waiting holds that ping for all of it. (Only the controller's own lateness, in
   reading an answer or in sending the next ping, is added to what it can miss.)
   A healthy node answers a ping in well under a millisecond, so it is misjudged only
   if it cannot answer for ``answer_within_s`` (0.9 of the timeout).
3. A ping is overdue either when its deadline passes, or when its answer arrives after
   the deadline (a loaded controller may see the answer before its own timer): both
   are the same verdict, so a freeze that ends just after the deadline is never
   recorded as a slow action.

The earlier loop pinged every node, waited for every answer, then slept
``timeout_s / 4``: a freeze that began just after an answer met the next ping a
quarter of the timeout later, so freezes up to 1.25x the timeout slipped through and
their time was measured as stall.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

PINGS_PER_TIMEOUT = 10


@dataclass(frozen=True)
class PingSchedule:
    """How often to ping a node and how long each ping may wait (seconds)."""

    timeout_s: float
    interval_s: float
    answer_within_s: float

    @classmethod
    def for_timeout(cls, timeout_s: float) -> PingSchedule:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: must be positive, got {timeout_s!r}")
        interval_s = timeout_s / PINGS_PER_TIMEOUT
        return cls(timeout_s, interval_s, timeout_s - interval_s)


@dataclass(frozen=True)
class Overdue:
    """A ping that was not answered in time: how long it waited (so far)."""

    waited_s: float
    schedule: PingSchedule

    def describe(self) -> str:
        return (f"did not answer a ping within {self.schedule.answer_within_s:g} s "
                f"(waited {self.waited_s:.2f} s; heartbeat timeout "
                f"{self.schedule.timeout_s:g} s)")


async def watch_pings(ping: Callable[[], Awaitable[bool]], *, timeout_s: float
                      ) -> Overdue | None:
    """Ping until cancelled (rules 1-3); returns the first overdue ping, or None when
    ``ping`` says the node is gone (returns False: a dead node is not a frozen one)."""
    schedule = PingSchedule.for_timeout(timeout_s)
    while True:
        sent = trio.current_time()
        alive = True
        with trio.move_on_at(sent + schedule.answer_within_s) as deadline:
            alive = await ping()
        waited = trio.current_time() - sent
        if deadline.cancelled_caught or waited > schedule.answer_within_s:
            return Overdue(waited, schedule)
        if not alive:
            return None
        await trio.sleep(schedule.interval_s)
