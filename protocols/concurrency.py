"""``PolicyEnv.concurrently`` for every trio-based environment (the node's, the twin's)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import trio

T = TypeVar("T")


async def run_concurrently(calls: Sequence[Callable[[], Awaitable[T]]]
                           ) -> list[T | BaseException]:
    """Run independent calls at once; each result, or the exception it raised, in order.

    Exceptions (not BaseExceptions: cancellation still propagates) are returned to the
    caller, a policy, which fails closed on them.
    """
    results: list[T | BaseException] = [RuntimeError("not run")] * len(calls)

    async def run_one(i: int, call: Callable[[], Awaitable[T]]) -> None:
        try:
            results[i] = await call()
        except Exception as exc:  # reported to the policy, which fails closed
            results[i] = exc

    if len(calls) == 1:  # nothing to overlap: skip the nursery's task switches
        await run_one(0, calls[0])
        return results
    async with trio.open_nursery() as nursery:
        for i, call in enumerate(calls):
            nursery.start_soon(run_one, i, call)
    return results
