"""A deterministic event loop in virtual time, and coroutine tasks on it.

Rules:

1. Time is an integer count of nanoseconds from 0 (:attr:`Loop.now_ns`); nothing reads a
   wall clock. Events run in (time, insertion order): the same inputs give the same run.
2. A task is a coroutine that awaits only :class:`Future` objects (``sleep``,
   ``gather``, or futures the network completes). The protocol code's ``async`` methods
   run unchanged on it: they await the environment's methods, which await futures.
3. A future's callbacks run when it completes; a task resumes through the event queue
   (``call_soon``), never by recursion, so long chains cannot overflow the stack.
4. :meth:`Loop.run` runs one coroutine to its end; if the queue empties before it ends
   the run is deadlocked, which is a bug in the model (:class:`SimDeadlock`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


def ms_to_ns(t_ms: float) -> int:
    """A model time in ms as the first loop instant at or after it."""
    return math.ceil(round(t_ms * NS_PER_MS, 3))


class SimDeadlock(RuntimeError):
    """Nothing is scheduled but the coroutine has not ended (a bug in the model)."""


class Future(Generic[T]):
    """A value that arrives later; awaitable by tasks (rule 2)."""

    __slots__ = ("_callbacks", "done", "error", "value")

    def __init__(self) -> None:
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None
        self._callbacks: list[Callable[[Future[T]], None]] = []

    def set_result(self, value: T) -> None:
        if self.done:
            raise RuntimeError("future already done")
        self.done, self.value = True, value
        self._fire()

    def set_error(self, error: BaseException) -> None:
        if self.done:
            raise RuntimeError("future already done")
        self.done, self.error = True, error
        self._fire()

    def _fire(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def add_callback(self, callback: Callable[[Future[T]], None]) -> None:
        if self.done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def result(self) -> T:
        if not self.done:
            raise RuntimeError("future not done")
        if self.error is not None:
            raise self.error
        value: T = self.value
        return value

    def __await__(self) -> Generator[Future[T], None, T]:
        if not self.done:
            yield self
        return self.result()


class Task(Generic[T]):
    """A coroutine stepped by the loop; ``future`` completes with its result."""

    __slots__ = ("_coro", "future", "loop")

    def __init__(self, loop: Loop, coro: Coroutine[Any, Any, T]) -> None:
        self.loop = loop
        self._coro = coro
        self.future: Future[T] = Future()
        loop.call_soon(self._step, None, None)

    def _step(self, value: Any, error: BaseException | None) -> None:
        try:
            waited = self._coro.throw(error) if error is not None else self._coro.send(value)
        except StopIteration as stop:
            self.future.set_result(stop.value)
            return
        except BaseException as exc:  # handed to whoever awaits the task
            self.future.set_error(exc)
            return
        if not isinstance(waited, Future):
            self._coro.close()
            self.future.set_error(TypeError(
                f"a sim task awaited {type(waited).__name__}, not a sim Future (a trio or "
                "asyncio call inside code run in virtual time)"))
            return
        waited.add_callback(self._resume)

    def _resume(self, future: Future[Any]) -> None:
        self.loop.call_soon(self._step, future.value, future.error)


class Loop:
    """The event queue and the virtual clock (module rules)."""

    def __init__(self) -> None:
        self.now_ns = 0
        self._heap: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.events_run = 0

    @property
    def now_ms(self) -> float:
        return self.now_ns / NS_PER_MS

    def now_s(self) -> float:
        return self.now_ns / NS_PER_S

    def call_at(self, t_ns: int, fn: Callable[..., None], *args: Any) -> None:
        if t_ns < self.now_ns:
            raise ValueError(f"call_at: {t_ns} ns is before now ({self.now_ns} ns)")
        self._seq += 1
        heapq.heappush(self._heap, (t_ns, self._seq, fn, args))

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        self.call_at(self.now_ns, fn, *args)

    def spawn(self, coro: Coroutine[Any, Any, T]) -> Task[T]:
        return Task(self, coro)

    def sleep(self, seconds: float) -> Future[None]:
        return self.sleep_ns(round(seconds * NS_PER_S))

    def sleep_ns(self, delay_ns: int) -> Future[None]:
        future: Future[None] = Future()
        self.call_at(self.now_ns + max(0, delay_ns), future.set_result, None)
        return future

    def _step_one(self) -> None:
        t_ns, _, fn, args = heapq.heappop(self._heap)
        self.now_ns = t_ns
        self.events_run += 1
        fn(*args)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run CORO to its end (rule 4); events it left behind stay queued."""
        task = self.spawn(coro)
        while not task.future.done:
            if not self._heap:
                raise SimDeadlock("the event queue ran dry before the operation ended")
            self._step_one()
        return task.future.result()

    def run_until(self, t_ns: int) -> None:
        """Run every event before T_NS, then set the clock to it."""
        while self._heap and self._heap[0][0] < t_ns:
            self._step_one()
        self.now_ns = max(self.now_ns, t_ns)

    @property
    def idle(self) -> bool:
        return not self._heap


async def gather(loop: Loop, calls: Sequence[Callable[[], Awaitable[T]]]
                 ) -> list[T | BaseException]:
    """``PolicyEnv.concurrently`` in virtual time: each call as its own task, each
    result or the Exception it raised in order (BaseExceptions propagate)."""
    async def wrap(call: Callable[[], Awaitable[T]]) -> T | BaseException:
        try:
            return await call()
        except Exception as exc:  # reported to the policy, which fails closed
            return exc

    tasks = [loop.spawn(wrap(call)) for call in calls]
    return [await task.future for task in tasks]
