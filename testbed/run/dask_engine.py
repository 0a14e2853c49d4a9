"""The cluster engine: work units on a ``dask.distributed`` cluster.

Rules (the engine side; the worker side is ``testbed.run.remote``):

1. ``open_dask_engine("local:N" | "tls://HOST:PORT")`` starts a LocalCluster of N
   worker processes (one lane each, everything on 127.0.0.1, no dashboard) or connects
   to a running scheduler, with mutual TLS where certificates are given and plain tcp
   beyond loopback only if allowed (``testbed.run.cluster_security``). Every worker
   declares ``lanes`` resources (``testbed worker --lanes N``); each unit asks for one
   lane, so a host runs at most its lanes' worth of units at once.
2. Before anything runs, every worker's summary (host, kernel, which backends work,
   congestion controls) is collected for the manifest; a campaign whose shaped
   networks would run on different backends on different workers is refused unless
   ``allow_mixed_backends`` (the manifest then records each episode's backend, as
   always).
3. Episodes are marked started when their unit is submitted; outcomes are committed by
   the campaign loop as units finish. A unit whose worker died is resubmitted by the
   scheduler; the worker side caps that at one more attempt (``worker_lost`` after).
   A unit's failures come back beside its outcomes (``testbed.run.remote`` rule 5); a
   task that raised all the same (e.g. a worker that cannot rebuild the campaign)
   aborts that unit's episodes with the reason, and the others go on.
4. Unshaped (loopback-like) units are submitted one at a time and waited for before anything else is
   sent (their stall is CPU time); emulated-link units fill every lane.
5. Cancelling (Ctrl-C) sets the run's cancel event, cancels the futures and waits for
   the workers' running units to tear their topologies down.
6. Losing the scheduler (its futures cancelled under us) raises :class:`SchedulerLost`
   once, with no traceback: what finished is committed, the run directory is
   consistent, and ``testbed run`` says how to ``--resume``.
7. Every unit a lost worker took with it is said in one line (``say``) and recorded in
   the engine's description (``recoveries``), which the manifest's session keeps
   (``testbed.run.recovery``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import dask
import trio
from distributed import Client, Event, LocalCluster, as_completed
from distributed.client import FutureCancelledError
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.scheduler import KilledWorker

from testbed.campaign.model import Campaign
from testbed.errors import HostError, RunFailure, UserError
from testbed.run.cluster_security import LOOPBACK, ClusterAccess, check_peer, split_address
from testbed.run.engines import OnFailure, OnOutcome, OnStart
from testbed.run.failures import UnitFailure, failure_reason, format_trace, unit_reason
from testbed.run.recovery import STARTED_TOPIC, RecoveryLog
from testbed.run.recovery import TOPIC as RECOVERY_TOPIC
from testbed.run.remote import (
    UnitReport,
    UnitTask,
    cancel_event_name,
    lost_outcomes,
    off_loop,
    run_unit_task,
    running_units,
    worker_summary,
)
from testbed.run.units import EpisodeOutcome, WorkUnit, unshaped_networks

CANCEL_WAIT_S = 60.0
CONNECT_TIMEOUT_S = 30.0
WORKER_WAIT_S = 60.0


def parse_cluster(spec: str) -> tuple[str, int | str]:
    """``local:N`` -> ("local", N); ``tls://HOST:PORT`` -> ("scheduler", address)."""
    if spec.startswith("local:"):
        count = spec.removeprefix("local:")
        if count.isdigit() and int(count) >= 1:
            return "local", int(count)
    elif spec.startswith(("tcp://", "tls://")):
        try:
            split_address(spec)
        except UserError:
            pass
        else:
            return "scheduler", spec
    raise UserError(f"cluster: {spec!r} is not allowed; allowed: local:N (N >= 1) or "
                    "tls://HOST:PORT (tcp://HOST:PORT) of a dask scheduler")


class WorkerLostError(RunFailure):
    """The cluster gave up on a unit (its workers died); its episodes are aborted."""


class SchedulerLost(HostError):
    """The connection to the scheduler broke mid-run (rule 6)."""

    def __init__(self, scheduler: str, reason: str) -> None:
        super().__init__(f"cluster: lost the scheduler at {scheduler} ({reason})")
        self.scheduler = scheduler
        self.reason = reason


class DaskEngine:
    """Runs units on a dask cluster (see the module rules)."""

    per_template = True

    def __init__(self, client: Any, *, cluster: str, backend: str | None,
                 workdir: Path | None, allow_mixed_backends: bool = False,
                 say: Callable[[str], None] = lambda line: None) -> None:
        self.client = client
        self.cluster = cluster
        self.backend = backend
        self.workdir = workdir
        self.allow_mixed_backends = allow_mixed_backends
        self.token = secrets.token_hex(4)
        self.workers: dict[str, Any] = {}
        self.scheduler_address = str(client.scheduler.address)
        self.lost: SchedulerLost | None = None
        self.recovery = RecoveryLog(self.token, say)
        self.say = say

    def describe(self) -> dict[str, Any]:
        return {"engine": "dask", "cluster": self.cluster,
                "scheduler": self.scheduler_address, "workers": self.workers,
                "allow_mixed_backends": self.allow_mixed_backends,
                "recovery": self.recovery.summary(), "recoveries": self.recovery.records}

    async def survey(self, campaign: Campaign) -> None:
        """Collect every worker's summary and refuse a mix of backends (rule 2)."""
        def collect() -> dict[str, Any]:
            try:
                self.client.wait_for_workers(1, timeout=WORKER_WAIT_S)
            except TimeoutError:
                return {}
            summaries: dict[str, Any] = self.client.run(worker_summary)
            return summaries

        summaries = await trio.to_thread.run_sync(collect)
        if not summaries:
            raise HostError(f"cluster {self.cluster}: no worker connected within "
                            f"{WORKER_WAIT_S:g} s; start one with `testbed worker SCHEDULER`")
        self.workers = summaries
        shaped = len(unshaped_networks(campaign)) < len(campaign.network_names())
        if not shaped:
            return
        wanted = self.backend or campaign.options.backend
        choices = {}
        for address, summary in summaries.items():
            if wanted == "auto":
                choice = summary["backend_auto"]
            else:
                choice = wanted if summary["backends"][wanted]["works"] else None
            if choice is None:
                raise HostError(f"worker {address} ({summary['host']}) cannot run the "
                                f"campaign's shaped networks with backend {wanted}; "
                                "see `testbed doctor` on that host")
            choices[address] = choice
        if len(set(choices.values())) > 1 and not self.allow_mixed_backends:
            raise UserError("cluster: workers would run different link backends ("
                            + ", ".join(f"{a}: {c}" for a, c in sorted(choices.items()))
                            + "); pass --backend, or allow it with --allow-mixed-backends")

    async def run(self, units: Sequence[WorkUnit], campaign: Campaign, *,
                  on_start: OnStart, on_outcome: OnOutcome,
                  on_failure: OnFailure | None = None) -> None:
        tasks = [UnitTask(self.token, i, campaign.config(), campaign.source,
                          tuple((cell.id, template) for cell, template in unit.episodes),
                          self.backend, str(self.workdir) if self.workdir else None,
                          unit.plans)
                 for i, unit in enumerate(units)]
        paired = list(zip(units, tasks, strict=True))
        self.recovery.watch(units, self.workers)  # rule 7
        await trio.to_thread.run_sync(self.client.subscribe_topic, STARTED_TOPIC,
                                      self.recovery.on_started)
        await trio.to_thread.run_sync(self.client.subscribe_topic, RECOVERY_TOPIC,
                                      self.recovery.on_event)
        try:
            for unit, task in [p for p in paired if p[0].unshaped]:
                await self._batch([(unit, task)], on_start, on_outcome, on_failure)
            await self._batch([p for p in paired if not p[0].unshaped], on_start, on_outcome,
                              on_failure)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._cancel_all)
                await trio.to_thread.run_sync(self._catch_up)
            line = self.recovery.summary_line()
            if line is not None:
                self.say(line)

    async def _batch(self, batch: Sequence[tuple[WorkUnit, UnitTask]], on_start: OnStart,
                     on_outcome: OnOutcome, on_failure: OnFailure | None) -> None:
        if not batch:
            return
        for unit, _ in batch:
            for key in unit.keys:
                on_start(key)
        futures = await trio.to_thread.run_sync(lambda: [
            self.client.submit(run_unit_task, task, key=task.key, pure=False,
                               resources={"lanes": 1}) for _, task in batch])
        by_key = {future.key: unit for future, (unit, _) in zip(futures, batch, strict=True)}
        send, receive = trio.open_memory_channel[Any](math.inf)
        token = trio.lowlevel.current_trio_token()

        def wait_all() -> None:
            for future in as_completed(futures):
                trio.from_thread.run_sync(send.send_nowait, future, trio_token=token)

        try:
            async with trio.open_nursery() as nursery:
                # abandoned on cancel: a lost scheduler may never finish every future
                nursery.start_soon(partial(trio.to_thread.run_sync, wait_all,
                                           abandon_on_cancel=True))
                for _ in futures:
                    future = await receive.receive()
                    report = await trio.to_thread.run_sync(self._report, future,
                                                           by_key[future.key])
                    for outcome in report.outcomes:
                        on_outcome(outcome)
                    for failure in report.failures:
                        if on_failure is not None:
                            on_failure(failure)
        except BaseExceptionGroup:
            if self.lost is not None:  # one error, not a group of its consequences
                raise self.lost from None
            raise

    def _report(self, future: Any, unit: WorkUnit) -> UnitReport:
        try:
            result: UnitReport = future.result()
        except FutureCancelledError as exc:
            if self.client.status == "running" and "connection-lost" not in str(exc):
                raise  # cancelled by us (rule 5)
            self.lost = SchedulerLost(self.scheduler_address,
                                      "its connection broke; dask cancelled the running units")
            raise self.lost from None
        except KilledWorker as exc:
            reason = f"worker_lost: the cluster gave up on this unit ({exc})"
            return UnitReport(_aborted(unit, reason), [])
        except Exception as exc:  # the task raised on its worker (rule 3)
            reason = failure_reason(exc)
            aborted = _aborted(unit, unit_reason("worker", reason))
            return UnitReport(aborted, [UnitFailure(unit.group.id, "worker", reason,
                                                    tuple(unit.keys),
                                                    trace=format_trace(exc))])
        return result

    def _catch_up(self) -> None:
        if self.lost is not None or self.client.status != "running":
            return
        try:
            self.client.unsubscribe_topic(STARTED_TOPIC)
            self.client.unsubscribe_topic(RECOVERY_TOPIC)
            self.recovery.catch_up(self.client.get_events(STARTED_TOPIC),
                                   self.client.get_events(RECOVERY_TOPIC))
        except (OSError, TimeoutError):
            pass  # the scheduler went away at the end: what arrived is recorded

    def _cancel_all(self) -> None:
        if self.lost is not None or self.client.status != "running":
            return  # no scheduler to tell; the workers lost it too and stop their units
        deadline = time.monotonic() + CANCEL_WAIT_S
        try:
            Event(cancel_event_name(self.token), client=self.client).set()
        except (OSError, TimeoutError):  # CommClosedError is an OSError
            return
        while time.monotonic() < deadline:
            try:
                busy = sum(self.client.run(running_units).values())
            except (OSError, TimeoutError):
                return
            if not busy:
                return
            time.sleep(0.2)


def _aborted(unit: WorkUnit, reason: str) -> list[EpisodeOutcome]:
    return lost_outcomes(unit, reason)


def _clean_dead_runs() -> list[str]:
    """Undo the ledgers of runs whose owner died (a killed worker's topology)."""
    import os

    from testbed.host.ledger import clean_all

    return clean_all() if os.geteuid() == 0 else []


class CleanDeadRuns(WorkerPlugin):  # type: ignore[misc]
    """Worker plugin: every worker, also one restarted after a crash, first removes
    what dead runs on its host left behind (``testbed clean``'s rule: only ledgers
    whose owner process is gone)."""

    name = "testbed-clean-dead-runs"

    def setup(self, worker: Any) -> None:
        off_loop(_clean_dead_runs)


@contextlib.contextmanager
def _silenced(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def _register_cleanup(client: Any) -> None:
    client.register_plugin(CleanDeadRuns(), name=CleanDeadRuns.name)


@asynccontextmanager
async def open_dask_engine(cluster: str, *, backend: str | None = None,
                           workdir: Path | None = None, allow_mixed_backends: bool = False,
                           access: ClusterAccess | None = None,
                           say: Callable[[str], None] | None = None,
                           ) -> AsyncIterator[DaskEngine]:
    """Start (``local:N``) or join (``tls://...``) a cluster; close what we started."""
    kind, value = parse_cluster(cluster)
    access = access or ClusterAccess()
    if kind == "scheduler":
        for line in check_peer(str(value), access, what="cluster"):
            if say is not None:
                say(line)
    local: Any = None

    def connect() -> Any:
        nonlocal local
        security = access.security()
        if kind == "local":
            with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
                local = LocalCluster(n_workers=int(value), threads_per_worker=1,
                                     processes=True, resources={"lanes": 1},
                                     host=LOOPBACK, dashboard_address=f"{LOOPBACK}:0",
                                     scheduler_kwargs={"dashboard": False},
                                     security=security, protocol=access.protocol())
            return Client(local, security=security)
        try:
            return Client(str(value), timeout=CONNECT_TIMEOUT_S, security=security)
        except (OSError, TimeoutError) as exc:
            raise HostError(f"cluster: cannot reach the scheduler at {value} ({exc}); "
                            "start one with `testbed scheduler` (with the same TLS "
                            "certificates' CA)") from None

    client = await trio.to_thread.run_sync(connect)
    engine: DaskEngine | None = None
    try:
        await trio.to_thread.run_sync(_register_cleanup, client)
        engine = DaskEngine(client, cluster=cluster, backend=backend, workdir=workdir,
                            allow_mixed_backends=allow_mixed_backends,
                            say=say or (lambda line: None))
        yield engine
    finally:
        with trio.CancelScope(shield=True):
            def close() -> None:
                # closing a client that lost its scheduler cancels its reconnect loop,
                # which dask logs as an error with a traceback: the run says it in one
                # line instead (rule 6)
                quiet = engine is not None and engine.lost is not None
                with _silenced("distributed.client") if quiet else contextlib.nullcontext():
                    client.close()
                if local is not None:
                    local.close()

            await trio.to_thread.run_sync(close)
