"""How a campaign shows its progress: a live bar on a terminal, lines in a log.

Rules:

1. On a terminal the loop draws rich's progress bar (episodes done of all, the episode
   running, elapsed time and an ETA).
2. When the output is not a terminal (redirected to a file, a CI log, ``| tee``) a bar
   only ever writes its final state, so a long campaign would show nothing for hours.
   There :class:`LineProgress` writes one line every :data:`INTERVAL_S` seconds (and
   one at the end): episodes done of all, aborted ones, elapsed time, an ETA from this
   session's pace, and the episode running. ``TESTBED_PROGRESS_S`` sets another
   interval.
3. Both have the same methods (``add_task``, ``update``, ``advance``, ``start``,
   ``stop``) and a ``console``, so the loop does not care which it has. Both show who
   holds the host (the ``host`` field, ``testbed.host.lanes``) when the run waits for
   it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

INTERVAL_S = 60.0
INTERVAL_ENV = "TESTBED_PROGRESS_S"


class ProgressLike(Protocol):
    @property
    def console(self) -> Console: ...

    def add_task(self, description: str, /, *, total: int, completed: int,
                 host: str) -> Any: ...

    def update(self, task: Any, /, *, description: str = ..., host: str = ...) -> None: ...

    def advance(self, task: Any, /) -> None: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


def _clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class LineProgress:
    """Progress as log lines at a fixed interval (rule 2); thread-safe."""

    def __init__(self, console: Console, *, interval_s: float | None = None,
                 clock: Any = time.monotonic) -> None:
        self.console = console
        self.interval_s = interval_s if interval_s is not None else float(
            os.environ.get(INTERVAL_ENV, INTERVAL_S))
        self.clock = clock
        self.total = self.done = self.done_before = 0
        self.current = self.host = ""
        self.started = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add_task(self, description: str, *, total: int, completed: int,
                 host: str = "") -> int:
        with self._lock:
            self.total, self.done, self.done_before = total, completed, completed
            self.current, self.host = description, host
        return 0

    def update(self, task: int, *, description: str | None = None,
               host: str | None = None) -> None:
        with self._lock:
            if description is not None:
                self.current = description
            if host is not None:
                self.host = host

    def advance(self, task: int) -> None:
        with self._lock:
            self.done += 1

    def line(self) -> str:
        """The progress as one line (rule 2)."""
        with self._lock:
            elapsed = self.clock() - self.started
            ran = self.done - self.done_before
            left = self.total - self.done
            eta = _clock(elapsed / ran * left) if ran and left else ("0:00:00" if not left
                                                                     else "unknown")
            host = f"; {self.host}" if self.host and left else ""
            pct = 100.0 * self.done / self.total if self.total else 100.0
            return (f"progress: {self.done}/{self.total} episodes ({pct:.0f}%), elapsed "
                    f"{_clock(elapsed)}, ETA {eta}" + (f"; running {self.current}"
                                                       if left else "") + host)

    def _tick(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.console.print(self.line(), markup=False, highlight=False, soft_wrap=True)

    def start(self) -> None:
        self.started = self.clock()
        self._thread = threading.Thread(target=self._tick, name="progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.console.print(self.line(), markup=False, highlight=False, soft_wrap=True)


def open_progress(console: Console) -> ProgressLike:
    """A bar on a terminal, lines otherwise (rules 1 and 2)."""
    if not console.is_terminal:
        return LineProgress(console)
    bar: ProgressLike = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
        TextColumn("{task.fields[host]}"), console=console,
        transient=False, refresh_per_second=2)
    return bar
