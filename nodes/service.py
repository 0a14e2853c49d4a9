"""Small process helpers of the node: a stoppable background service, the parent watch."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import trio

log = logging.getLogger("nodes.node")
PARENT_CHECK_S = 1.0


class Service:
    """A background task started with ``nursery.start`` that can be stopped alone."""

    def __init__(self, value: Any, scope: trio.CancelScope, done: trio.Event) -> None:
        self.value = value
        self._scope = scope
        self._done = done

    @classmethod
    async def start(cls, nursery: trio.Nursery,
                    body: Callable[..., Awaitable[None]]) -> Service:
        """``body(task_status)`` must call ``task_status.started(value)`` once ready."""
        scope = trio.CancelScope()
        done = trio.Event()

        async def run(task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
            try:
                with scope:
                    await body(task_status)
            finally:
                done.set()

        value = await nursery.start(run)
        return cls(value, scope, done)

    async def stop(self) -> None:
        self._scope.cancel()
        await self._done.wait()



async def watch_parent(parent_pid: int, shutdown: trio.Event) -> None:
    """Shut down if the controller that started us is gone (we were re-parented, also
    before this started: ``parent_pid`` comes from the controller's command line).

    (Not PR_SET_PDEATHSIG: trio starts children from a worker thread, and that signal
    fires when the *thread* exits.)
    """
    while os.getppid() == parent_pid:
        await trio.sleep(PARENT_CHECK_S)
    log.warning("parent process %d is gone: shutting down", parent_pid)
    shutdown.set()
