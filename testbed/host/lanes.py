"""The host's lane budget: concurrent ``testbed run`` processes on one host share it.

Rules of this module:

1. The budget is a number of lanes (topologies running episodes at once) for the whole
   host; by default :data:`LANES_PER_CPU` per CPU (``default_budget``), what
   ``testbed bench lanes`` found one host serves without losing fidelity (16 lanes on
   2 cores, docs/benchmarks.md). A run may set another (``--host-lanes N``,
   ``TESTBED_HOST_LANES``); each run grants itself lanes only within its own figure.
2. The state is a directory, ``<run state dir>/lanes/`` (``/run/planfence-testbed/lanes``
   for root; ``TESTBED_LANES_DIR`` overrides it): one file per run, ``<id>.json``
   (``id`` is the run's ledger prefix), saying who it is (pid and start time, campaign,
   results directory), its budget, the lanes it holds, whether it holds the loopback
   exclusivity, and what it waits for. Files are read and written only under an
   exclusive ``flock`` on ``lock`` in that directory.
3. A run is known by pid *and* start time (``testbed.host.processes``): a file whose
   process is gone belongs to a dead run (SIGKILLed, say) and is removed by the next
   run that looks, so a killed holder releases the host at once.
4. A lane is granted when no other run holds or waits for the loopback exclusivity,
   fewer than the budget's lanes are held on the host, and the run holds fewer than its
   fair share (the budget divided among the runs that hold or want lanes) or nobody
   else waits. So a second campaign shares the host with the first at the first's unit
   boundaries instead of starving it or being starved.
5. The loopback exclusivity (a loopback cell measures CPU time) is granted when no
   other run holds a lane or the exclusivity; while a run waits for it no other run is
   granted a new lane, so the others drain at their unit boundaries. A run never waits
   for the exclusivity while it holds lanes itself (the engine runs loopback units
   before or between its lanes, never beside them), so two runs cannot deadlock.
6. Waiting polls every :data:`POLL_S`; ``on_status`` hears, in one line, who holds
   the host whenever that changes (the progress line and ``testbed doctor`` show it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import trio

from testbed.errors import UserError
from testbed.host.processes import process_start_ticks, same_process

LANES_PER_CPU = 8
POLL_S = 0.25
LOCK_POLL_S = 0.005
BUDGET_ENV = "TESTBED_HOST_LANES"
DIR_ENV = "TESTBED_LANES_DIR"


def default_budget() -> int:
    """The host's lane budget unless a run sets another (rule 1)."""
    text = os.environ.get(BUDGET_ENV)
    if text:
        return check_budget(text, f"{BUDGET_ENV}")
    return LANES_PER_CPU * (os.cpu_count() or 1)


def check_budget(text: str, field: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UserError(f"{field}: {text!r} is not allowed; allowed: an integer >= 1")
    return value


def lanes_dir() -> Path:
    """Where the host's lane state lives (rule 2)."""
    override = os.environ.get(DIR_ENV)
    if override:
        return Path(override)
    from testbed.host.ledger import run_state_dir

    return run_state_dir() / "lanes"


@dataclass
class Holder:
    """One run's line in the lane state (rule 2)."""

    id: str
    pid: int
    start_ticks: int | None
    campaign: str = ""
    label: str = ""
    budget: int = 0
    held: int = 0
    loopback: bool = False
    waiting: int = 0
    waiting_loopback: bool = False
    since: float = 0.0

    def alive(self) -> bool:
        return same_process(self.pid, self.start_ticks)

    def describe(self) -> str:
        what = "loopback (exclusive)" if self.loopback else f"{self.held} lane(s)"
        wants = []
        if self.waiting:
            wants.append(f"{self.waiting} lane(s)")
        if self.waiting_loopback:
            wants.append("loopback")
        waiting = f", waiting for {' and '.join(wants)}" if wants else ""
        return (f"run {self.id} (campaign {self.campaign or '?'}, pid {self.pid}): "
                f"{what}{waiting}")


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """The state's exclusive lock; a short critical section, taken without blocking the
    event loop for long (non-blocking tries, a few ms apart)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    raise
                time.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)


def _read_all(directory: Path) -> list[Holder]:
    """Every live run's line; the files of dead runs are removed (rule 3). Call under
    the lock."""
    out = []
    for path in sorted(directory.glob("tb*.json")):
        try:
            holder = Holder(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue  # not a line this version can read: leave it alone
        if holder.alive():
            out.append(holder)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return out


def holders(directory: Path | None = None) -> list[Holder]:
    """The live runs in the host's lane state (what ``testbed doctor`` shows)."""
    where = directory or lanes_dir()
    if not where.is_dir():
        return []
    with _locked(where):
        return _read_all(where)


def host_summary(directory: Path | None = None, budget: int | None = None) -> str:
    """One line: the budget and who holds the host (``testbed doctor``)."""
    where = directory or lanes_dir()
    runs = holders(where)
    held = sum(h.held for h in runs)
    head = f"budget {budget or default_budget()} lanes ({LANES_PER_CPU} per CPU); {where}"
    if not runs:
        return f"{head}; free (no run holds lanes)"
    return f"{head}; {held} lane(s) held: " + "; ".join(h.describe() for h in runs)


class HostLanes:
    """This run's side of the host's lane budget (see the module rules)."""

    def __init__(self, ident: str, *, budget: int | None = None,
                 directory: Path | None = None, campaign: str = "", label: str = "",
                 on_status: Callable[[str], None] | None = None) -> None:
        pid = os.getpid()
        self.directory = directory or lanes_dir()
        self.budget = budget or default_budget()
        self.me = Holder(id=ident, pid=pid, start_ticks=process_start_ticks(pid),
                         campaign=campaign, label=label, budget=self.budget,
                         since=time.time())
        self.on_status = on_status
        self._last_status = ""
        self._open = False

    # --- the state file ----------------------------------------------------------

    @property
    def path(self) -> Path:
        return self.directory / f"{self.me.id}.json"

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self.me)))
        tmp.replace(self.path)

    def open(self) -> None:
        with _locked(self.directory):
            self._write()
        self._open = True

    def close(self) -> None:
        if not self._open:
            return
        with _locked(self.directory), contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._open = False

    def __enter__(self) -> HostLanes:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- granting (rules 4 and 5) ------------------------------------------------

    def _try(self, loopback: bool) -> tuple[bool, list[Holder]]:
        with _locked(self.directory):
            others = [h for h in _read_all(self.directory) if h.id != self.me.id]
            granted = (self._exclusive_free(others) if loopback
                       else self._lane_free(others))
            if granted:
                if loopback:
                    self.me.loopback = True
                else:
                    self.me.held += 1
            self._write()
        return granted, others

    def _exclusive_free(self, others: list[Holder]) -> bool:
        return not any(h.held or h.loopback for h in others)

    def _lane_free(self, others: list[Holder]) -> bool:
        if any(h.loopback or h.waiting_loopback for h in others):
            return False
        if self.me.held + sum(h.held for h in others) >= self.budget:
            return False
        wanting = 1 + sum(1 for h in others if h.held or h.waiting)
        share = max(1, self.budget // wanting)
        return self.me.held < share or not any(h.waiting for h in others)

    def _report(self, waiting_for: str, others: list[Holder]) -> None:
        if waiting_for:
            busy = [h for h in others if h.held or h.loopback]
            whom = "; ".join(h.describe() for h in busy) or "its turn"
            text = f"host: waiting for {waiting_for}: {whom}"
        else:
            held = self.me.held + sum(h.held for h in others)
            text = ("host: loopback, exclusive" if self.me.loopback
                    else f"host: {held}/{self.budget} lanes"
                         + (f", {len(others)} other run(s)" if others else ""))
        if text != self._last_status:
            self._last_status = text
            if self.on_status is not None:
                self.on_status(text)

    async def _acquire(self, loopback: bool) -> None:
        if loopback:
            self.me.waiting_loopback = True
        else:
            self.me.waiting += 1
        try:
            while True:
                granted, others = self._try(loopback)
                if granted:
                    self._report("", others)
                    return
                self._report("the loopback exclusivity" if loopback else "a lane", others)
                await trio.sleep(POLL_S)
        finally:
            if loopback:
                self.me.waiting_loopback = False
            else:
                self.me.waiting -= 1
            with _locked(self.directory):
                self._write()

    def _release(self, loopback: bool) -> None:
        with _locked(self.directory):
            if loopback:
                self.me.loopback = False
            else:
                self.me.held -= 1
            self._write()

    @contextlib.asynccontextmanager
    async def lane(self) -> AsyncIterator[None]:
        """Hold one lane of the host while the body runs."""
        await self._acquire(loopback=False)
        try:
            yield
        finally:
            self._release(loopback=False)

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Hold the whole host (no other run's episodes) while the body runs."""
        await self._acquire(loopback=True)
        try:
            yield
        finally:
            self._release(loopback=True)

    def statistics(self) -> dict[str, Any]:
        return {"budget": self.budget, "held": self.me.held, "loopback": self.me.loopback,
                "directory": str(self.directory)}
