"""``dask worker SCHEDULER --preload testbed.tools.worker_preload``: a stock dask worker
as a testbed worker (the way dask-jobqueue, dask-ssh and Dask's Kubernetes operator
start workers, with their own options untouched).

Rules:

- ``dask_setup`` runs in each worker process after it listens and before it registers
  with the scheduler. It runs ``testbed worker``'s host check (doctor's probes: a host
  that cannot run shaped networks, as root or rootless, is refused unless
  ``--loopback-only`` follows the preload on the command line); the worker then fails
  to start with that reason in its log.
- A worker that declares no ``lanes`` resource (``--resources lanes=N``) gets one lane
  per thread, so the dask engine's units (one lane each) find it.
- Everything else is the worker's own: addresses, TLS (``--tls-*``), threads,
  memory, death timeout. Bind it to an address (``--host``/``--interface``) and give it
  certificates as docs/cluster.md says; a stock worker listens on every interface
  otherwise.
"""

from __future__ import annotations

import asyncio
import io
import logging
from typing import Any

import click
from rich.console import Console

from testbed.tools.worker import check_host

logger = logging.getLogger("distributed.testbed")  # dask configures "distributed"


@click.command()
@click.option("--loopback-only", is_flag=True,
              help="serve even if no link backend works (loopback campaigns only)")
async def dask_setup(worker: Any, loopback_only: bool) -> None:
    text = io.StringIO()
    try:
        choice = await asyncio.to_thread(
            lambda: check_host(loopback_only=loopback_only,
                               console=Console(file=text, width=120)))
    finally:
        logger.info("testbed host check:\n%s", text.getvalue())
    state = worker.state
    if "lanes" not in state.total_resources:
        state.total_resources["lanes"] = float(state.nthreads)
        state.available_resources["lanes"] = float(state.nthreads)
    logger.info("testbed worker: %g lane(s), backend auto -> %s",
                state.total_resources["lanes"], choice or "none (loopback only)")
