"""The round meter's counts (``nodes.meter``): rounds are busy periods, a round that
opened a connection adds two handshake round trips however many it opened, exchanges
count every call, and the running totals survive ``reset``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio

from nodes.meter import HANDSHAKE_ROUND_TRIPS, RoundMeter
from nodes.transport import Counters


def _call(counters: Counters, opens: int, delay_s: float = 0.001
          ) -> Callable[[], Awaitable[str]]:
    async def call() -> str:
        counters.connections_opened += opens
        await trio.sleep(delay_s)
        return "ok"
    return call


async def test_rounds_handshake_rounds_and_exchanges() -> None:
    counters = Counters()
    meter = RoundMeter(counters)
    # round 1: three concurrent head reads, two of them to new peers
    async with trio.open_nursery() as nursery:
        for opens in (1, 1, 0):
            nursery.start_soon(meter.measure, "heads", _call(counters, opens))
    # round 2: a fetch on a pooled connection; round 3: a head read on a new one
    await meter.measure("fetch", _call(counters, 0))
    await meter.measure("heads", _call(counters, 1))
    report = meter.report()
    assert report["rounds"] == 3
    assert report["exchanges"] == 5
    assert report["handshake_rounds"] == 2 * HANDSHAKE_ROUND_TRIPS == 4
    meter.reset()
    assert meter.report()["rounds"] == meter.report()["handshake_rounds"] == 0
    assert meter.report()["exchanges"] == 0
    assert (meter.total_rounds, meter.total_handshake_rounds) == (3, 4)
    mark = meter.mark()
    await meter.measure("heads", _call(counters, 1))
    assert meter.rounds_since(mark) == {"rounds": 1, "handshake_rounds": 2}
    assert meter.rounds_since(None) == {"rounds": 0, "handshake_rounds": 0}
    assert (meter.total_rounds, meter.total_handshake_rounds) == (4, 6)


async def test_a_failed_call_still_closes_its_round() -> None:
    counters = Counters()
    meter = RoundMeter(counters)

    async def broken() -> None:
        counters.connections_opened += 1
        raise OSError("reset")

    with pytest.raises(OSError, match="reset"):
        await meter.measure("heads", broken)
    assert meter.report()["rounds"] == 1
    assert meter.report()["handshake_rounds"] == HANDSHAKE_ROUND_TRIPS
    await meter.measure("heads", _call(counters, 0))
    assert meter.report()["rounds"] == 2
    assert meter.report()["handshake_rounds"] == HANDSHAKE_ROUND_TRIPS
