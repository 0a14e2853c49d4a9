"""Liveness of one node while an episode runs: how often to ping it, when it is frozen.

Rules of this module:

1. Each node is watched on its own (one slow node never delays the pings of another):
   a ping every ``interval_s = timeout_s / PINGS_PER_TIMEOUT``, the next one
   ``interval_s`` after the previous answer.
2. Each ping must be answered within ``answer_within_s = timeout_s - interval_s``. This
   catches every freeze longer than ``timeout_s``: a freeze that starts right after an
   answer meets the next ping ``interval_s`` later and holds it for the rest of the
   freeze, more than ``timeout_s - interval_s``; a freeze that starts while a ping is
   waiting holds that ping for all of it. A healthy node answers a ping in well under
   a millisecond, so it is misjudged only if it cannot answer for ``answer_within_s``
   (0.9 of the timeout).
3. The node stamps each answer with the time it handled the ping (CLOCK_MONOTONIC is
   system wide): a ping is overdue when the node handled it more than
   ``answer_within_s`` after it was sent, so a controller that reads the answer late
   (a loaded host) never makes a live node look frozen, and a freeze that ends just
   after the deadline is still judged a freeze (its stamp is late), never a slow
   action.
4. While no answer has come, the ping is overdue at its deadline; if the controller
   itself woke up late for that deadline, the node gets as much longer (and at least
   ``GRACE_S``) to show that it answered in time (rule 3 still judges the answer).
5. A node that is gone (its heartbeat connection broke, its process exited) is not
   frozen: that is ``NodeDied``'s business (testbed/run/team.py); :func:`watch_all`
   stops watching it and goes on with the others.

The earlier loop pinged every node, waited for every answer, then slept
``timeout_s / 4``: a freeze that began just after an answer met the next ping a
quarter of the timeout later, so freezes up to 1.25x the timeout slipped through and
their time was measured as stall.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import trio

from nodes.control import ControlClient
from protocols.errors import RemoteProtocolError

PINGS_PER_TIMEOUT = 10
GRACE_S = 0.05


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


#: One ping: the node's time (on ``clock``) at which it handled it, or None if the node
#: is gone (a dead node is not a frozen one).
Ping = Callable[[], Awaitable[float | None]]


async def watch_pings(ping: Ping, *, timeout_s: float,
                      clock: Callable[[], float] = time.monotonic) -> Overdue | None:
    """Ping until cancelled (rules 1-4); returns the first overdue ping, or None when
    the node is gone."""
    schedule = PingSchedule.for_timeout(timeout_s)
    found: list[Overdue | None] = []
    async with trio.open_nursery() as nursery:  # the pings in flight
        found.append(await _watch(ping, schedule, clock, nursery))
        nursery.cancel_scope.cancel()
    return found[0]


async def _watch(ping: Ping, schedule: PingSchedule, clock: Callable[[], float],
                 nursery: trio.Nursery) -> Overdue | None:
    within = schedule.answer_within_s

    async def one(stamps: list[float | None], answered: trio.Event) -> None:
        stamps.append(await ping())
        answered.set()

    while True:
        sent = clock()
        stamps: list[float | None] = []
        answered = trio.Event()
        nursery.start_soon(one, stamps, answered)
        deadline = trio.current_time() + within
        with trio.move_on_at(deadline):
            await answered.wait()
        if not answered.is_set():  # rule 4
            late = trio.current_time() - deadline
            with trio.move_on_after(max(late, GRACE_S)):
                await answered.wait()
        if not answered.is_set():
            return Overdue(clock() - sent, schedule)
        stamp = stamps[0]
        if stamp is None:
            return None
        if stamp - sent > within:  # rule 3
            return Overdue(stamp - sent, schedule)
        await trio.sleep(schedule.interval_s)


@dataclass(frozen=True)
class Watched:
    """A node to watch: its heartbeat connection, and whether its process has exited."""

    agent: str
    heartbeat: ControlClient
    exited: Callable[[], bool]


async def ping_stamp(heartbeat: ControlClient) -> float | None:
    """One ping: when the node handled it (its own stamp, monotonic seconds), None if
    the node is gone."""
    try:
        reply = await heartbeat.request("ping")
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError,
            RemoteProtocolError):
        return None
    stamp = reply.get("t_ns")
    return stamp / 1e9 if isinstance(stamp, int) else time.monotonic()


async def watch_all(nodes: Sequence[Watched], *, timeout_s: float) -> tuple[str, Overdue]:
    """Watch every node on its own (rule 1) until one is frozen: returns it and its
    overdue ping. Runs until cancelled while none is (rule 5 for nodes that are gone)."""
    found: list[tuple[str, Overdue]] = []

    async def one(node: Watched, cancel: trio.CancelScope) -> None:
        overdue = await watch_pings(lambda: ping_stamp(node.heartbeat), timeout_s=timeout_s)
        if overdue is not None and not node.exited():
            found.append((node.agent, overdue))
            cancel.cancel()

    async with trio.open_nursery() as nursery:
        for node in nodes:
            nursery.start_soon(one, node, nursery.cancel_scope)
    if not found:
        await trio.sleep_forever()  # every node is gone: nothing left to watch
    return found[0]
