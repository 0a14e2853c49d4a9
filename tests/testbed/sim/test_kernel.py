"""The event loop: virtual time, insertion order at equal times, tasks, gather."""

from __future__ import annotations

import pytest

from testbed.sim.kernel import NS_PER_MS, Future, Loop, SimDeadlock, gather


def test_events_run_in_time_then_insertion_order() -> None:
    loop = Loop()
    seen: list[str] = []
    loop.call_at(5, seen.append, "b")
    loop.call_at(5, seen.append, "c")
    loop.call_at(1, seen.append, "a")
    loop.run_until(10)
    assert seen == ["a", "b", "c"]
    assert loop.now_ns == 10


def test_sleep_advances_virtual_time_only() -> None:
    loop = Loop()

    async def body() -> int:
        await loop.sleep(2.5)
        return loop.now_ns

    assert loop.run(body()) == 2500 * NS_PER_MS


def test_gather_overlaps_calls_and_returns_their_exceptions() -> None:
    loop = Loop()

    async def slow(ms: int) -> int:
        await loop.sleep_ns(ms * NS_PER_MS)
        return ms

    async def bad() -> int:
        await loop.sleep_ns(NS_PER_MS)
        raise ValueError("refused")

    async def body() -> list[int | BaseException]:
        return await gather(loop, [lambda: slow(30), bad, lambda: slow(10)])

    results = loop.run(body())
    assert results[0] == 30
    assert results[2] == 10
    assert isinstance(results[1], ValueError)
    assert loop.now_ns == 30 * NS_PER_MS  # concurrent: the slowest, not the sum


def test_a_coroutine_waiting_on_nothing_is_a_deadlock() -> None:
    loop = Loop()

    async def body() -> None:
        await Future()

    with pytest.raises(SimDeadlock):
        loop.run(body())


def test_awaiting_a_foreign_awaitable_is_refused() -> None:
    loop = Loop()

    class Foreign:
        def __await__(self):  # type: ignore[no-untyped-def]
            yield "not a sim future"

    async def body() -> None:
        await Foreign()

    with pytest.raises(TypeError, match="not a sim Future"):
        loop.run(body())
