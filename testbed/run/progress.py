"""How a campaign shows its progress: a live bar on a terminal, lines in a log.

Rules:

1. On a terminal the loop draws rich's progress bar on one line: the episode running,
   a bar, episodes done of all, the rate, elapsed time and an ETA. The count, rate and
   times keep their width; the episode's key (and who holds the host, when the run waits
   for it) get what is left, shortened in the middle so a key keeps its policy's start
   and its template (an 80-column terminal leaves about 30 characters).
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

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column
from rich.text import Text

INTERVAL_S = 60.0
INTERVAL_ENV = "TESTBED_PROGRESS_S"
#: The bar's own width (rule 1): what is left goes to the episode's key.
BAR_WIDTH = 10
#: Episodes take seconds to minutes: the rate and ETA look back this far.
SPEED_WINDOW_S = 600.0


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


def shorten_middle(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: its start and (longer) end around an
    ellipsis, so an episode key keeps its policy's start and its template."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:max(width, 0)]
    head = (width - 1) * 2 // 5
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


class _Shortened:
    """An episode key, and who holds the host when the run waits, in the width given
    (rule 1): the host note takes at most half, both are shortened in the middle."""

    def __init__(self, text: str, note: str = "") -> None:
        self.text, self.note = text, note

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        text = Text(no_wrap=True, overflow="crop", end="")
        if self.note:
            note = shorten_middle(self.note, max(width // 2, width - len(self.text) - 1))
            text.append(shorten_middle(self.text, width - len(note) - 1), style="bold")
            text.append(" " + note)
        else:
            text.append(shorten_middle(self.text, width), style="bold")
        yield text

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(1, len(self.text) + (len(self.note) + 1 if self.note else 0))


class EpisodeColumn(ProgressColumn):
    """The episode running and the ``host`` field, in the width left (rule 1)."""

    def __init__(self) -> None:
        super().__init__(table_column=Column(ratio=1, no_wrap=True, overflow="crop"))

    def render(self, task: Task) -> _Shortened:
        return _Shortened(task.description, str(task.fields.get("host", "")))


class RateColumn(ProgressColumn):
    """Episodes per minute (per hour when slower than one a minute)."""

    def render(self, task: Task) -> Text:
        speed = task.speed
        if not speed:
            return Text("–/min", style="progress.data.speed")
        text = f"{speed * 60:.1f}/min" if speed * 60 >= 1 else f"{speed * 3600:.1f}/h"
        return Text(text, style="progress.data.speed")


def progress_bar(console: Console, **options: Any) -> Progress:
    """The terminal's one-line bar (rule 1); ``options`` go to rich's Progress."""
    return Progress(
        EpisodeColumn(), BarColumn(bar_width=BAR_WIDTH), MofNCompleteColumn(),
        RateColumn(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
        console=console, transient=False, refresh_per_second=2,
        expand=True, speed_estimate_period=SPEED_WINDOW_S, **options)


def open_progress(console: Console) -> ProgressLike:
    """A bar on a terminal, lines otherwise (rules 1 and 2)."""
    if not console.is_terminal:
        return LineProgress(console)
    bar: ProgressLike = progress_bar(console)
    return bar
