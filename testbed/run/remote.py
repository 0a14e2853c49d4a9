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
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from testbed.campaign.parse import campaign_from_config
from testbed.host.ledger import open_run_ledger
from testbed.links.backends import AUTO_ORDER, probe_backend
from testbed.results.provenance import host_description
from testbed.run.attempts import EpisodePlan
from testbed.run.episode import EpisodeRunner
from testbed.run.failures import UnitFailure, failure_reason, format_trace, unit_reason
from testbed.run.units import EpisodeOutcome, WorkUnit, run_unit, worker_host

MAX_ATTEMPTS = 2
"""A unit runs at most twice (the first time, and once after its worker was lost)."""
WORKER_LOST = "worker_lost"
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
    """What this worker can run, for the run's manifest: host, kernel, backends, CC."""
    return dict(off_loop(_summary))


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
            "euid": os.geteuid(), "backends": backends, "backend_auto": auto,
            "congestion_control_available": cc}


def _count_attempt(task: UnitTask) -> int:
    from distributed import Lock, get_client

    client = get_client()
    with Lock(f"{task.key}-lock"):
        seen = int(client.get_metadata([task.key, "attempts"], default=0))
        client.set_metadata([task.key, "attempts"], seen + 1)
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


def run_unit_task(task: UnitTask) -> UnitReport:
    """The dask task: run one unit on this worker (rules 1-5)."""
    global _running
    campaign = campaign_from_config(task.config, source=task.source)
    cells = {cell.id: cell for cell in campaign.cells()}
    episodes = tuple((cells[cell_id], template) for cell_id, template in task.episodes)
    unit = WorkUnit(episodes[0][0].group_key, episodes, task.plans)
    attempt = _count_attempt(task)
    if attempt > MAX_ATTEMPTS:
        return UnitReport(_lost(task, unit, attempt), [])
    report = UnitReport([], [])
    stage = "run"
    with _running_lock:
        _running += 1
    try:
        # The unit's temporary directories and node processes are recorded in a ledger
        # of this worker's, so `testbed clean` here removes them if the worker dies.
        with open_run_ledger(f"unit {task.key}") as ledger:
            runner = EpisodeRunner(campaign, backend=task.backend, ledger=ledger,
                                   workdir_root=Path(task.workdir) if task.workdir else None,
                                   shared_emulator=True)  # a worker's lanes: one emulator
            trio.run(_run, unit, runner, campaign, report,
                     cancel_event_name(task.run_token))
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
    finally:
        with _running_lock:
            _running -= 1
    return report


async def _run(unit: WorkUnit, runner: EpisodeRunner, campaign: Any,
               report: UnitReport, cancel_name: str) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_cancel, cancel_name, nursery.cancel_scope)
        await run_unit(unit, runner, campaign, on_start=lambda key: None,
                       on_outcome=report.outcomes.append,
                       on_failure=report.failures.append)
        nursery.cancel_scope.cancel()


async def _watch_cancel(name: str, scope: trio.CancelScope) -> None:
    from distributed import Event, get_client

    event = Event(name, client=get_client())
    while not await trio.to_thread.run_sync(event.is_set, abandon_on_cancel=True):
        await trio.sleep(CANCEL_POLL_S)
    scope.cancel()
