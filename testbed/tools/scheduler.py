"""`testbed scheduler`: a dask scheduler for campaigns, secure by default.

Rules:

- It is dask's own ``distributed.Scheduler``, with the testbed's defaults: it listens on
  127.0.0.1 unless ``--listen``/``--interface`` says otherwise, with mutual TLS where
  certificates are given (and refuses plain tcp beyond loopback without
  ``--insecure``), and its dashboard is off unless asked for; its HTTP endpoint
  (health, metrics) is bound to loopback (``testbed.run.cluster_security``).
- A unit whose worker dies is run again once (``allowed-failures`` 1, as the workers
  enforce themselves, testbed.run.remote rule 3).
- It serves until SIGINT or SIGTERM. A stock ``dask scheduler`` with the same options
  works as well (docs/cluster.md).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from testbed.run.cluster_security import (
    DEFAULT_PORT,
    LOOPBACK,
    ClusterAccess,
    check_listen,
    dashboard_address,
    listen_options,
)

ALLOWED_FAILURES = 1


@dataclass(frozen=True)
class SchedulerOptions:
    port: int = DEFAULT_PORT
    listen: str | None = None
    interface: str | None = None
    dashboard: bool = False
    dashboard_address: str | None = None
    access: ClusterAccess = field(default_factory=ClusterAccess)

    def check(self) -> list[str]:
        listen = self.listen or (LOOPBACK if self.interface in (None, "lo") else "")
        return check_listen(listen, self.access, what="scheduler")

    def scheduler_kwargs(self) -> dict[str, Any]:
        return {"port": self.port, "security": self.access.security(),
                "protocol": self.access.protocol(), "dashboard": self.dashboard,
                "dashboard_address": dashboard_address(self.dashboard,
                                                       self.dashboard_address),
                **listen_options(self.listen, self.interface)}


async def serve_scheduler(options: SchedulerOptions,
                          on_ready: Callable[[str], None] = print) -> None:
    import dask
    from distributed import Scheduler

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    with dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_FAILURES}):
        scheduler: Any = Scheduler(**options.scheduler_kwargs())
    try:
        await scheduler
        on_ready(scheduler.address)
        finished = asyncio.ensure_future(scheduler.finished())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({finished, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
    finally:
        await scheduler.close()


def run_scheduler(options: SchedulerOptions, *, console: Console) -> int:
    for line in options.check():
        console.print(line, markup=False)

    def ready(address: str) -> None:
        console.print(f"scheduler: listening at {address}", markup=False)

    asyncio.run(serve_scheduler(options, ready))
    return 0
