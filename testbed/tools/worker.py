"""`testbed worker SCHEDULER [--lanes N]`: this host as a dask worker for campaigns.

Rules:

- The host is checked first with the same probes as ``testbed doctor``: a host where
  no link backend works is refused with the reason (unless ``--loopback-only``, for
  campaigns that never shape a link).
- The worker (a ``distributed.Nanny`` with one worker process, restarted if it dies)
  declares ``lanes`` resources: the dask engine asks one lane per work unit, so this
  host runs at most N units at once, each on its own topology.
- SIGINT and SIGTERM close the nanny, which stops its worker; units it was running are
  resubmitted by the scheduler (testbed.run.dask_engine rule 3).
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from rich.console import Console

from testbed.errors import HostError
from testbed.tools.doctor import auto_backend, render_doctor, run_doctor


def check_host(*, loopback_only: bool, console: Console) -> str | None:
    """Run the doctor; the backend this host will use, or None for loopback only."""
    checks = run_doctor()
    render_doctor(checks, console)
    choice = auto_backend(checks)
    if choice is None and not loopback_only:
        detail = next((c.detail for c in checks if c.name == "backend auto"), "")
        raise HostError(f"worker: this host cannot run shaped networks ({detail}); fix it "
                        "(see the table above) or pass --loopback-only")
    return choice


async def serve_worker(scheduler: str, *, lanes: int, name: str | None = None) -> None:
    """Serve as a worker of ``scheduler`` until the nanny finishes or a signal arrives."""
    from distributed import Nanny

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    nanny: Any = Nanny(scheduler, nthreads=lanes, resources={"lanes": lanes}, name=name,
                       dashboard_address=":0")
    try:
        await nanny
        finished = asyncio.ensure_future(nanny.finished())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({finished, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
    finally:
        await nanny.close()


def run_worker(scheduler: str, *, lanes: int, name: str | None, loopback_only: bool,
               console: Console) -> int:
    choice = check_host(loopback_only=loopback_only, console=console)
    console.print(f"worker: {lanes} lane(s), backend auto -> {choice or 'none'}, "
                  f"scheduler {scheduler}")
    asyncio.run(serve_worker(scheduler, lanes=lanes, name=name))
    return 0
