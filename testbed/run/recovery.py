"""Visible recovery on a cluster: every unit a lost worker took with it, said in one line
and recorded in the run's manifest.

Rules:

1. The dask engine listens to the scheduler's ``all`` events and to the units' starts
   (``testbed.run.remote.STARTED_TOPIC``: unit, attempt, worker). A ``remove-worker``
   event whose processing tasks include a unit of this run that last started on that
   worker is a loss (a unit only queued there was not running: the scheduler just
   sends it elsewhere): one record per unit with the unit's index and episodes, the
   attempt that was lost, the worker's address and host, and the reason (the worker
   died or its connection broke, or it closed: its nanny, an operator, ``--lifetime``).
2. Each record is printed at once in one line that also says what happens next: the
   unit runs again (attempt n+1 of ``MAX_ATTEMPTS``), or it is given up and its
   episodes are recorded as aborted (``worker_lost``), as the workers enforce
   (``testbed.run.remote`` rule 3).
3. At the end of the engine's run the scheduler's event logs are read once more (starts
   first), so a loss whose events arrived late is recorded too (records are unique per
   worker and unit);
   the engine's description in the manifest then holds the records
   (``sessions[-1].execution.recoveries``) and a line counts them.
4. Handlers run on the dask client's event-loop thread; the records are kept under a
   lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from testbed.errors import UserError
from testbed.run.cluster_security import split_address
from testbed.run.remote import MAX_ATTEMPTS, STARTED_TOPIC
from testbed.run.units import WorkUnit

TOPIC = "all"
__all__ = ["STARTED_TOPIC", "TOPIC", "RecoveryLog"]


class RecoveryLog:
    """The losses of one run on a cluster (module rules)."""

    def __init__(self, token: str, say: Callable[[str], None]) -> None:
        self.prefix = f"testbed-unit-{token}-"
        self.say = say
        self.records: list[dict[str, Any]] = []
        self.units: dict[int, WorkUnit] = {}
        self.hosts: dict[str, str] = {}
        self._seen: set[tuple[str, int]] = set()
        self._started: dict[int, tuple[str, int]] = {}  # unit -> (worker, attempt)
        self._lock = threading.Lock()

    def watch(self, units: Sequence[WorkUnit], hosts: Mapping[str, Any]) -> None:
        """The run's units by index; worker address -> summary (for host names)."""
        self.units = dict(enumerate(units))
        self.hosts = {address: str(summary.get("host", ""))
                      for address, summary in hosts.items()}

    def on_started(self, event: tuple[float, Any]) -> None:
        """A unit's start (``Client.subscribe_topic`` handler for STARTED_TOPIC)."""
        _, message = event
        if not isinstance(message, dict):
            return
        index = self._index(message.get("key"))
        if index is None:
            return
        worker, attempt = str(message.get("worker", "")), int(message.get("attempt", 0))
        with self._lock:
            if attempt >= self._started.get(index, ("", 0))[1]:
                self._started[index] = (worker, attempt)

    def on_event(self, event: tuple[float, Any]) -> None:
        """A scheduler event (``Client.subscribe_topic`` handler, rule 1)."""
        _, message = event
        if not isinstance(message, dict) or message.get("action") != "remove-worker":
            return
        worker = str(message.get("worker", ""))
        expected = bool(message.get("expected"))
        for key in message.get("processing-tasks") or ():
            index = self._index(key)
            if index is not None:
                self._record(worker, index, expected)

    def catch_up(self, started: Sequence[tuple[float, Any]],
                 events: Sequence[tuple[float, Any]]) -> None:
        """The scheduler's event logs at the end of a run (rule 3)."""
        for event in started:
            self.on_started(event)
        for event in events:
            self.on_event(event)

    def _index(self, key: Any) -> int | None:
        text = str(key)
        if not text.startswith(self.prefix):
            return None
        tail = text.removeprefix(self.prefix)
        return int(tail) if tail.isdigit() else None

    def _record(self, worker: str, index: int, expected: bool) -> None:
        with self._lock:
            ran_on, attempt = self._started.get(index, ("", 0))
            if ran_on != worker or (worker, index) in self._seen:
                return  # only queued there (rule 1), or recorded already
            self._seen.add((worker, index))
            unit = self.units.get(index)
            keys = list(unit.keys) if unit is not None else []
            host = self.hosts.get(worker) or _address_host(worker)
            reason = ("the worker closed (its nanny, an operator or --lifetime)" if expected
                      else "the worker died or its connection broke")
            then = "resubmitted" if attempt < MAX_ATTEMPTS else "given up"
            record = {"unit": index, "episodes": keys, "attempt": attempt,
                      "worker": worker, "host": host, "reason": reason, "then": then}
            self.records.append(record)
        what = (f"runs again (attempt {attempt + 1} of {MAX_ATTEMPTS})" if then == "resubmitted"
                else f"given up after {attempt} attempts: its episodes are recorded as "
                     "aborted (worker_lost)")
        self.say(f"cluster: unit {index} ({len(keys)} episode(s)) lost with worker {worker} "
                 f"on {host}, attempt {attempt}: {reason}; it {what}")

    def summary(self) -> dict[str, int]:
        with self._lock:
            return {"lost": len(self.records),
                    "resubmitted": sum(r["then"] == "resubmitted" for r in self.records),
                    "given_up": sum(r["then"] == "given up" for r in self.records)}

    def summary_line(self) -> str | None:
        counts = self.summary()
        if not counts["lost"]:
            return None
        return (f"cluster: {counts['lost']} unit attempt(s) lost with their workers: "
                f"{counts['resubmitted']} resubmitted, {counts['given_up']} given up "
                "(manifest: sessions[-1].execution.recoveries)")


def _address_host(address: str) -> str:
    try:
        return split_address(address)[1]
    except UserError:
        return address
