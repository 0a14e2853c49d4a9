"""The worker side of the dask engine: run one work unit whole and return its outcomes.

Rules:

1. A task carries the campaign's own configuration (``Campaign.config()``), the unit's
   episodes by cell id and template, and the run's token; the worker rebuilds the
   campaign from it, so workers need the same testbed installed, nothing else.
2. A unit runs entirely on one worker: topology, node processes, every episode
   (``testbed.run.units.run_unit``). Its outcomes come back only when the unit ends,
   so a worker lost mid-unit leaves nothing half-committed.
3. Attempts are counted per (run, unit) in the cluster (scheduler metadata under a
   ``distributed.Lock``): a unit whose worker was lost runs again at most once
   more; a third start returns every episode as aborted with reason ``worker_lost``
   without running anything, whatever the scheduler's own retry limit is.
4. The run's cancel event (a ``distributed.Event``) is polled while the unit runs; when
   it is set the unit's trio scope is cancelled, so its topology and processes are torn
   down by their own ``finally`` blocks.
5. A unit's failures come back with its outcomes (:class:`UnitReport`), never as the
   task's exception: ``run_unit`` contains its own (``testbed.run.failures``), and an
   error around it (the worker's ledger cannot be torn down) is reported the same way,
   with every episode that has no outcome yet aborted.
6. A worker that is not root runs each shaped unit in a user namespace of its own
   (``testbed.run.userns_unit``: a child process, stopped with SIGTERM on cancel), and
   describes itself from inside one (``privilege = "userns"``): what its units can
   run, not what its unprivileged process can. Loopback units need no namespace and
   run in the worker's process as with root.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from testbed.campaign.model import Campaign
from testbed.campaign.parse import campaign_from_config
from testbed.errors import HostError, RunFailure
from testbed.host.ledger import open_run_ledger
from testbed.host.userns import outer_uid, privilege
from testbed.links.backends import AUTO_ORDER, probe_backend
from testbed.results.cpu_speed import python_probe_ms
from testbed.results.provenance import host_description
from testbed.run.attempts import EpisodePlan
from testbed.run.episode import EpisodeRunner
from testbed.run.failures import UnitFailure, failure_reason, format_trace, unit_reason
from testbed.run.units import (
    EpisodeOutcome,
    WorkUnit,
    run_unit,
    unshaped_networks,
    worker_host,
)
from testbed.run.userns_unit import call_in_user_namespace

Watch = Callable[[trio.CancelScope], Awaitable[None]]

MAX_ATTEMPTS = 2
"""A unit runs at most twice (the first time, and once after its worker was lost)."""
WORKER_LOST = "worker_lost"
STARTED_TOPIC = "testbed-unit-started"
CANCEL_POLL_S = 0.5

_running = 0
_running_lock = threading.Lock()


@dataclass(frozen=True)
class UnitTask:
    """Everything a worker needs to run one unit (plain, picklable data)."""

    run_token: str
    unit_index: int
    config: dict[str, Any]
    source: str
    episodes: tuple[tuple[str, str], ...]  # (cell id, template)
    backend: str | None
    workdir: str | None
    plans: tuple[EpisodePlan, ...] = ()  # per episode: repeats still to run (units.py)

    @property
    def key(self) -> str:
        return f"testbed-unit-{self.run_token}-{self.unit_index}"


def cancel_event_name(run_token: str) -> str:
    return f"testbed-cancel-{run_token}"


def running_units() -> int:
    """Units running in this worker process right now (the engine waits for 0 on cancel)."""
    return _running


def off_loop(fn: Any) -> Any:
    """Run ``fn()`` on a fresh thread and return its result. Functions that dask runs
    in the worker's own asyncio thread (``client.run``, plugins) must not call pyroute2
    there: its blocking API runs an asyncio loop of its own."""
    result: list[Any] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=body, name="testbed-off-loop")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def worker_summary() -> dict[str, Any]:
    """What this worker can run, for the run's manifest: host, kernel, backends, CC,
    and its privilege (rule 5)."""
    if os.geteuid() != 0:
        try:
            return dict(off_loop(lambda: call_in_user_namespace(
                "testbed.run.remote:userns_summary", None)))
        except (HostError, RunFailure, OSError):
            pass  # no user namespaces here: the plain process's view (loopback only)
    return dict(off_loop(_summary))


def userns_summary(_: Any) -> dict[str, Any]:
    """The summary from inside a user namespace (called in the child, rule 5)."""
    return _summary()


def _summary() -> dict[str, Any]:
    system = host_description()
    backends = {name: dict(zip(("works", "detail"), probe_backend(name), strict=True))
                for name in AUTO_ORDER}
    try:
        cc = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    except OSError:
        cc = []
    auto = next((name for name in AUTO_ORDER if backends[name]["works"]), None)
    return {"host": system["host"], "kernel": system["kernel"], "cpus": system["cpus"],
            # how fast this worker's host runs Python, as each session records the
            # controller's (testbed.results.cpu_speed): the nodes run here, not there
            "cpu_model": system["cpu_model"], "python_probe_ms": python_probe_ms(),
            "euid": os.geteuid(), "uid": outer_uid(), "privilege": privilege(),
            "backends": backends, "backend_auto": auto,
            "congestion_control_available": cc}


def _count_attempt(task: UnitTask) -> int:
    """This start's attempt number (rule 3), also published on ``STARTED_TOPIC`` with
    this worker's address (the client tells a lost attempt from a unit that was only
    queued on a lost worker by it, testbed.run.recovery)."""
    from distributed import Lock, get_client, get_worker

    client = get_client()
    with Lock(f"{task.key}-lock"):
        seen = int(client.get_metadata([task.key, "attempts"], default=0))
        client.set_metadata([task.key, "attempts"], seen + 1)
    worker = get_worker()
    worker.log_event(STARTED_TOPIC, {"key": task.key, "attempt": seen + 1,
                                     "worker": worker.address})
    return seen + 1


def _lost(task: UnitTask, unit: WorkUnit, attempt: int) -> list[EpisodeOutcome]:
    reason = (f"{WORKER_LOST}: the worker running this unit was lost {attempt - 1} times; "
              "not run again")
    return lost_outcomes(unit, reason, worker_host())


def lost_outcomes(unit: WorkUnit, reason: str, host: str = "") -> list[EpisodeOutcome]:
    """Every pending episode of a unit aborted with ``reason`` (one outcome each, under
    its next attempt number)."""
    return [EpisodeOutcome(key, cell, template, None, reason, 0.0, "", unit.group, {}, host,
                           unit.plan(i).next_attempt, unit.plan(i).slots[0].repeat)
            for i, (key, (cell, template)) in enumerate(
                zip(unit.keys, unit.episodes, strict=True))]


@dataclass(frozen=True)
class UnitReport:
    """What a worker returns for one unit: its outcomes and its failures (rule 5)."""

    outcomes: list[EpisodeOutcome]
    failures: list[UnitFailure]


def _rebuild(task: UnitTask) -> tuple[Campaign, WorkUnit]:
    campaign = campaign_from_config(task.config, source=task.source)
    cells = {cell.id: cell for cell in campaign.cells()}
    episodes = tuple((cells[cell_id], template) for cell_id, template in task.episodes)
    return campaign, WorkUnit(episodes[0][0].group_key, episodes, task.plans,
                              unshaped=episodes[0][0].network in unshaped_networks(campaign))


def run_unit_task(task: UnitTask) -> UnitReport:
    """The dask task: run one unit on this worker (rules 1-6)."""
    global _running
    campaign, unit = _rebuild(task)
    attempt = _count_attempt(task)
    if attempt > MAX_ATTEMPTS:
        return UnitReport(_lost(task, unit, attempt), [])
    with _running_lock:
        _running += 1
    try:
        if os.geteuid() != 0 and not unit.unshaped:  # rule 6
            from distributed import Event, get_client

            event = Event(cancel_event_name(task.run_token), client=get_client())
            answer: UnitReport = call_in_user_namespace(
                "testbed.run.remote:run_unit_here", task, cancelled=event.is_set)
            return answer
        report = UnitReport([], [])
        _execute(task, campaign, unit, report,
                 lambda scope: _watch_cancel(cancel_event_name(task.run_token), scope))
        return report
    finally:
        with _running_lock:
            _running -= 1


def run_unit_here(task: UnitTask) -> UnitReport:
    """The unit in this process, SIGTERM stopping it: a user-namespace child (rule 6)."""
    campaign, unit = _rebuild(task)
    report = UnitReport([], [])
    # SIGTERM while a topology is open: it tears itself down and raises
    # KeyboardInterrupt (testbed.net.signals); the outcomes so far still go back
    with contextlib.suppress(KeyboardInterrupt):
        _execute(task, campaign, unit, report, _watch_sigterm)
    return report


def _execute(task: UnitTask, campaign: Campaign, unit: WorkUnit, report: UnitReport,
             watch: Watch) -> None:
    stage = "run"
    try:
        # The unit's temporary directories and node processes are recorded in a ledger
        # of this worker's, so `testbed clean` here removes them if the worker dies.
        with open_run_ledger(f"unit {task.key}") as ledger:
            runner = EpisodeRunner(campaign, backend=task.backend, ledger=ledger,
                                   workdir_root=Path(task.workdir) if task.workdir else None,
                                   shared_emulator=True)  # a worker's lanes: one emulator
            trio.run(_run, unit, runner, campaign, report, watch)
            stage = "teardown"
    except Exception as exc:  # rule 5: around run_unit, e.g. the ledger's own teardown
        reason = failure_reason(exc)
        done = {o.key for o in report.outcomes}
        lost = [o for o in lost_outcomes(unit, unit_reason(stage, reason), worker_host())
                if o.key not in done]
        report.outcomes.extend(lost)
        report.failures.append(UnitFailure(unit.group.id, stage, reason,
                                           tuple(o.key for o in lost), 1, worker_host(),
                                           format_trace(exc)))


async def _run(unit: WorkUnit, runner: EpisodeRunner, campaign: Any,
               report: UnitReport, watch: Watch) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, nursery.cancel_scope)
        await run_unit(unit, runner, campaign, on_start=lambda key: None,
                       on_outcome=report.outcomes.append,
                       on_failure=report.failures.append)
        nursery.cancel_scope.cancel()


async def _watch_sigterm(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            scope.cancel()
            return


async def _watch_cancel(name: str, scope: trio.CancelScope) -> None:
    from distributed import Event, get_client

    event = Event(name, client=get_client())
    while not await trio.to_thread.run_sync(event.is_set, abandon_on_cancel=True):
        await trio.sleep(CANCEL_POLL_S)
    scope.cancel()
