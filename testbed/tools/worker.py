"""`testbed worker SCHEDULER [options]`: this host as a dask worker for campaigns.

Rules:

- The host is checked first with the same probes as ``testbed doctor``. As root a host
  where no link backend works is refused with the reason; as an ordinary user the
  worker needs unprivileged user namespaces and a usable /dev/net/tun (doctor's
  ``rootless`` row: each shaped unit then runs in a user namespace of its own,
  ``testbed.run.userns_unit``). ``--loopback-only`` serves anyway, for campaigns that
  never shape a link.
- It takes the options deployment tools give ``dask worker`` (dask-jobqueue, dask-ssh,
  a Kubernetes pod spec): ``--nthreads``, ``--memory-limit``, ``--death-timeout``,
  ``--name``, ``--nworkers``, ``--local-directory``, ``--resources``, ``--interface``,
  ``--protocol``, ``--nanny/--no-nanny``, ``--lifetime*``, ``--tls-*``, with dask's
  meanings. Lanes (the units this host runs at once, each on its own topology) are
  ``--lanes``, else a ``lanes=`` resource, else ``--nthreads``; each worker process
  declares that many ``lanes`` resources and the dask engine asks one per unit.
- It listens on 127.0.0.1 unless ``--listen`` or ``--interface`` says otherwise, with
  TLS where certificates are given, and refuses plain tcp beyond loopback without
  ``--insecure`` (``testbed.run.cluster_security``).
- Each worker process runs under a ``distributed.Nanny``, which restarts it if it
  dies. When the scheduler goes away the nanny ends (dask workers do not reconnect);
  this command then starts a fresh one, which waits for a scheduler at the same address
  for up to ``--death-timeout`` (dask's own bound) and exits in one line if none comes.
  The same scheduler process still there (its id unchanged) means it closed this
  worker on purpose, which ends it too; a restarted one (a new id) is joined.
- SIGINT and SIGTERM close the nannies, which stop their workers; units they were
  running are resubmitted by the scheduler (testbed.run.dask_engine rule 3).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from testbed.errors import HostError
from testbed.run.cluster_security import (
    DEFAULT_DEATH_TIMEOUT_S,
    LOOPBACK,
    ClusterAccess,
    check_listen,
    check_peer,
    is_loopback,
    listen_options,
    split_address,
)
from testbed.tools.doctor import auto_backend, render_doctor, run_doctor

if TYPE_CHECKING:  # rich only where a worker runs: `testbed exec` parses this module's CLI
    from rich.console import Console

PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class WorkerOptions:
    """What `testbed worker` was asked for (dask worker's options, and ours)."""

    scheduler: str
    lanes: int = 1
    nthreads: int = 1
    name: str | None = None
    nworkers: int = 1
    memory_limit: str = "auto"
    death_timeout_s: float | None = DEFAULT_DEATH_TIMEOUT_S
    local_directory: str | None = None
    resources: dict[str, float] = field(default_factory=dict)
    listen: str | None = None
    interface: str | None = None
    protocol: str | None = None
    nanny: bool = True
    dashboard: bool = False
    dashboard_address: str | None = None
    lifetime: str | None = None
    lifetime_stagger: str = "0 seconds"
    lifetime_restart: bool = False
    access: ClusterAccess = field(default_factory=ClusterAccess)
    loopback_only: bool = False

    def check(self) -> list[str]:
        """One-line errors for what cannot work; the warnings to print."""
        warnings = check_peer(self.scheduler, self.access, what="worker")
        _, host, _ = split_address(self.scheduler)
        listen = self.listen or (LOOPBACK if self.interface in (None, "lo") else "")
        if not is_loopback(host) and is_loopback(listen or "0.0.0.0"):
            raise HostError(f"worker: the scheduler {self.scheduler} is on another host but "
                            f"this worker would listen on {LOOPBACK} only; give --listen "
                            "ADDRESS (this host's address on the lab network) or --interface "
                            "NAME")
        return warnings + check_listen(listen, self.access, what="worker")

    def nanny_kwargs(self, index: int) -> dict[str, Any]:
        name = self.name
        if name is not None and self.nworkers > 1:
            name = f"{name}-{index}"
        kwargs: dict[str, Any] = {
            "nthreads": self.nthreads, "resources": {**self.resources, "lanes": self.lanes},
            "name": name, "memory_limit": self.memory_limit,
            "death_timeout": self.death_timeout_s, "local_directory": self.local_directory,
            "security": self.access.security(), "protocol": self.protocol,
            "dashboard": self.dashboard,
            "dashboard_address": self.dashboard_address or f"{LOOPBACK}:0",
            "lifetime": self.lifetime, "lifetime_stagger": self.lifetime_stagger,
            "lifetime_restart": self.lifetime_restart,
            **listen_options(self.listen, self.interface)}
        return kwargs


def check_host(*, loopback_only: bool, console: Console) -> str | None:
    """Run the doctor; the backend this host will use (``userns`` for a rootless
    worker), or None for loopback only."""
    checks = run_doctor()
    render_doctor(checks, console)
    if os.geteuid() != 0:
        rootless = next(c for c in checks if c.name == "rootless")
        if rootless.ok:
            return "userns"
        if loopback_only:
            return None
        raise HostError(f"worker: as uid {os.geteuid()} this host cannot run shaped networks "
                        f"({rootless.detail}); run it as root, let users create user "
                        "namespaces and open /dev/net/tun, or pass --loopback-only")
    choice = auto_backend(checks)
    if choice is None and not loopback_only:
        detail = next((c.detail for c in checks if c.name == "backend auto"), "")
        raise HostError(f"worker: this host cannot run shaped networks ({detail}); fix it "
                        "(see the table above) or pass --loopback-only")
    return choice


async def _scheduler_id(options: WorkerOptions) -> str | None:
    """The id of the scheduler answering at the address now (each scheduler process has
    its own), or None if none answers."""
    from distributed.comm import connect
    from distributed.core import send_recv

    try:
        comm = await connect(options.scheduler, timeout=PROBE_TIMEOUT_S,
                             **options.access.security().get_connection_args("worker"))
    except (OSError, TimeoutError):
        return None
    try:
        answer = await asyncio.wait_for(send_recv(comm, op="identity", n_workers=0),
                                        PROBE_TIMEOUT_S)
    except (OSError, TimeoutError):
        return None
    finally:
        await comm.close()
    return str(answer.get("id")) if isinstance(answer, dict) else None


async def serve_worker(options: WorkerOptions, say: Callable[[str], None] = print) -> int:
    """Serve until a signal arrives, the scheduler closes this worker, or no scheduler
    is back within the death timeout (module rules)."""
    from distributed import Nanny, Worker

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    server_class: Any = Nanny if options.nanny else Worker
    while True:
        servers = [server_class(options.scheduler, **options.nanny_kwargs(i))
                   for i in range(options.nworkers)]
        stopping = asyncio.ensure_future(stop.wait())
        try:
            starting = asyncio.ensure_future(asyncio.gather(*(s.start() for s in servers)))
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                starting.cancel()
                return 0
            try:
                starting.result()
            except (TimeoutError, OSError) as exc:
                raise HostError(f"worker: no scheduler at {options.scheduler} within the "
                                f"death timeout ({options.death_timeout_s:g} s): {exc!r}; "
                                "start it, or raise --death-timeout") from None
            say(f"worker: serving {options.scheduler} ({options.nworkers} process(es), "
                f"{options.lanes} lane(s) each)")
            serving = await _scheduler_id(options)
            finished = asyncio.ensure_future(asyncio.gather(*(s.finished() for s in servers)))
            await asyncio.wait({finished, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                return 0
        finally:
            stopping.cancel()
            await asyncio.gather(*(s.close() for s in servers), return_exceptions=True)
        if serving is not None and await _scheduler_id(options) == serving:
            say(f"worker: the scheduler at {options.scheduler} closed this worker")
            return 0
        bound = ("no limit" if options.death_timeout_s is None
                 else f"up to {options.death_timeout_s:g} s, --death-timeout")
        say(f"worker: lost the scheduler at {options.scheduler}; waiting for it to come back "
            f"({bound})")


def run_worker(options: WorkerOptions, *, console: Console) -> int:
    for line in options.check():
        console.print(line, markup=False)
    choice = check_host(loopback_only=options.loopback_only, console=console)
    mode = {"userns": "rootless (a user namespace per unit)", None: "none (loopback only)"}
    console.print(f"worker: {options.lanes} lane(s) x {options.nworkers} process(es), "
                  f"backend auto -> {mode.get(choice, choice)}, scheduler "
                  f"{options.scheduler}", markup=False)
    return asyncio.run(serve_worker(options, lambda text: console.print(text, markup=False)))
