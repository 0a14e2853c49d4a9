"""Mahimahi capacity traces: loading, replay arithmetic, and the shipped catalogue.

Rules of the format (as mm-link reads it):

- one non-negative integer per line, in milliseconds from the start of the trace;
- each line is one chance to move one 1500-byte packet across the bottleneck, so a
  stamp repeated n times means n packets may leave in that millisecond;
- stamps never decrease, and the last stamp (the period) is greater than zero;
- replay wraps around: after the last stamp the whole list repeats, shifted by the
  period, forever.

Replay may start anywhere in the trace (the *offset*); times returned by
`Trace.opportunities` are measured from the replay start, not from the trace start.

A *trace reference* (what a network definition writes as ``up_trace``) is either the
name of a shipped trace (``ATT-LTE-driving.up``, looked up in :func:`trace_dir`) or an
absolute path to a file of the user's own; :func:`load_trace_ref` loads either, and
:func:`file_digest` gives the size and SHA-256 a run's manifest records.

Delay traces (``delay_trace``; a format of this testbed, Mahimahi has none) hold one
``<ms> <delay_ms>`` pair per line, ``#`` starting a comment: from replay time ``ms``
on, each crossing of the link takes ``delay_ms`` (a step function). The first pair is
at 0 ms, times increase, and the last delay holds after the last pair.

Only this module knows the formats; everything else works with `Trace` and
`DelayTrace` objects.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from testbed.errors import UserError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]
# numpy is imported where stamps are read or replayed, not with the module: reading the
# network registry (every testbed exec and shell) needs no trace arrays for fixed links

__all__ = [
    "MAX_DELAY_MS",
    "MTU_BYTES",
    "TRACE_DIR",
    "DelayTrace",
    "Direction",
    "Trace",
    "TraceError",
    "file_digest",
    "kbit_per_opportunity_ms",
    "load_delay_trace",
    "load_named",
    "load_trace",
    "load_trace_ref",
    "resolve_trace_ref",
    "trace_catalogue",
    "trace_dir",
]

Direction = Literal["up", "down"]

MTU_BYTES = 1500
"""Bytes one delivery opportunity may carry (Mahimahi's fixed packet size)."""

_BITS_PER_OPPORTUNITY = MTU_BYTES * 8
# One opportunity per millisecond is 12000 bit/ms = 12000 kbit/s = 12 Mbit/s.

TRACE_ENV = "TESTBED_TRACE_DIR"
_SUFFIXES: dict[str, Direction] = {".up": "up", ".down": "down"}

MAX_DELAY_MS = 10_000.0
"""Largest one-way delay per crossing a link (or a delay trace) may ask for."""

class TraceError(UserError):
    """A trace file or trace name is unusable; the message names the file and line."""


def kbit_per_opportunity_ms(opportunities: float, window_ms: float) -> float:
    """Capacity in kbit/s of `opportunities` delivery chances spread over `window_ms`."""
    return opportunities * _BITS_PER_OPPORTUNITY / window_ms


@dataclass(frozen=True, eq=False)
class Trace:
    """One direction of a capacity trace, ready to replay.

    `stamps_ms` is read-only, sorted, non-negative; `period_ms` is its last element.
    """

    name: str
    direction: Direction
    stamps_ms: IntArray
    period_ms: int

    def __post_init__(self) -> None:
        import numpy as np

        stamps = self.stamps_ms
        if stamps.ndim != 1 or stamps.size == 0:
            raise TraceError(f"trace {self.name}: needs at least one stamp")
        if int(stamps[0]) < 0 or bool(np.any(np.diff(stamps) < 0)):
            raise TraceError(f"trace {self.name}: stamps must be non-negative and sorted")
        if self.period_ms != int(stamps[-1]) or self.period_ms <= 0:
            raise TraceError(
                f"trace {self.name}: period_ms must equal the last stamp and be > 0"
            )
        stamps.setflags(write=False)

    @property
    def length_s(self) -> float:
        """Duration of one pass through the trace (before it wraps)."""
        return self.period_ms / 1000.0

    def mean_rate_kbit(self) -> float:
        """Long-run capacity: every stamp is one 1500-byte packet per period."""
        return kbit_per_opportunity_ms(self.stamps_ms.size, self.period_ms)

    def longest_outage_ms(self) -> int:
        """Longest gap between consecutive opportunities, counting the wrap-around gap."""
        import numpy as np

        unrolled = np.append(self.stamps_ms, self.period_ms + self.stamps_ms[0])
        return int(np.max(np.diff(unrolled)))

    def outage_total_ms(self, min_gap_ms: int = 1000) -> int:
        """Sum of gaps of at least `min_gap_ms` in one period (zero-capacity stretches)."""
        import numpy as np

        unrolled = np.append(self.stamps_ms, self.period_ms + self.stamps_ms[0])
        gaps = np.diff(unrolled)
        return int(gaps[gaps >= min_gap_ms].sum())

    def opportunities(
        self, start_ms: float, end_ms: float, offset_ms: float = 0.0
    ) -> FloatArray:
        """Delivery opportunities in [start_ms, end_ms) of replay time, sorted.

        Replay time 0 is trace time `offset_ms` (taken modulo the period); the trace is
        unrolled periodically from trace time 0, so an offset inside the first period
        sees exactly the stamps an mm-link started there would see.
        """
        import numpy as np

        if not (math.isfinite(start_ms) and math.isfinite(end_ms) and math.isfinite(offset_ms)):
            raise ValueError("opportunities: start_ms, end_ms and offset_ms must be finite")
        if start_ms < 0:
            raise ValueError(f"opportunities: start_ms must be >= 0, got {start_ms}")
        if offset_ms < 0:
            raise ValueError(f"opportunities: offset_ms must be >= 0, got {offset_ms}")
        if end_ms <= start_ms:
            return np.empty(0, dtype=np.float64)
        period = self.period_ms
        offset = math.fmod(offset_ms, period)
        lo = offset + start_ms  # window in unrolled trace time
        hi = offset + end_ms
        # Stamps lie in [0, period], so cycle k covers [k*period, (k+1)*period].
        k_first = max(0, math.floor(lo / period) - 1)
        k_last = math.floor(hi / period)
        cycles = np.arange(k_first, k_last + 1, dtype=np.int64) * period
        unrolled = (cycles[:, None] + self.stamps_ms[None, :]).ravel()
        lo_i = int(np.searchsorted(unrolled, lo, side="left"))
        hi_i = int(np.searchsorted(unrolled, hi, side="left"))
        out: FloatArray = unrolled[lo_i:hi_i].astype(np.float64) - offset
        return out

    def capacity_series_kbit(self, bin_ms: int) -> FloatArray:
        """Capacity (kbit/s) of one period in consecutive bins of `bin_ms`.

        Bin i covers trace time [i*bin_ms, (i+1)*bin_ms); the last bin is shorter when
        the period is not a multiple of `bin_ms` and its rate uses its real width. The
        stamp equal to the period is counted in the last bin.
        """
        import numpy as np

        if bin_ms <= 0:
            raise ValueError(f"capacity_series_kbit: bin_ms must be > 0, got {bin_ms}")
        n_bins = max(1, math.ceil(self.period_ms / bin_ms))
        index = np.minimum(self.stamps_ms // bin_ms, n_bins - 1)
        counts = np.bincount(index, minlength=n_bins).astype(np.float64)
        widths = np.full(n_bins, float(bin_ms))
        widths[-1] = self.period_ms - bin_ms * (n_bins - 1)
        widths[widths <= 0] = float(bin_ms)
        rates: FloatArray = counts * _BITS_PER_OPPORTUNITY / widths
        return rates


def _direction_of(path: Path) -> Direction:
    direction = _SUFFIXES.get(path.suffix)
    if direction is None:
        raise TraceError(
            f"{path}: cannot tell the direction; name the file *.up or *.down "
            "or pass direction='up'|'down'"
        )
    return direction


def _parse_stamps(path: Path, text: str) -> IntArray:
    values: list[int] = []
    previous = -1
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            stamp = int(line, 10)
        except ValueError:
            raise TraceError(
                f"{path}:{lineno}: expected an integer millisecond stamp, got {line[:40]!r}"
            ) from None
        if stamp < 0:
            raise TraceError(f"{path}:{lineno}: stamp {stamp} is negative")
        if stamp < previous:
            raise TraceError(
                f"{path}:{lineno}: stamp {stamp} is smaller than the previous {previous} "
                "(stamps must not decrease)"
            )
        previous = stamp
        values.append(stamp)
    if not values:
        raise TraceError(f"{path}: trace is empty (no stamps)")
    if values[-1] == 0:
        raise TraceError(f"{path}: last stamp is 0; a trace must last longer than 0 ms")
    import numpy as np

    return np.asarray(values, dtype=np.int64)


def load_trace(path: Path | str, *, direction: Direction | None = None) -> Trace:
    """Read a Mahimahi trace file; direction comes from the .up/.down suffix if not given."""
    path = Path(path)
    if direction is None:
        direction = _direction_of(path)
    elif direction not in ("up", "down"):
        raise TraceError(f"direction: {direction!r} is not one of 'up', 'down'")
    try:
        text = path.read_text(encoding="ascii")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not a text trace ({exc.reason})") from None
    stamps = _parse_stamps(path, text)
    return Trace(name=path.name, direction=direction, stamps_ms=stamps, period_ms=int(stamps[-1]))


def trace_dir() -> Path:
    """Folder holding the traces: $TESTBED_TRACE_DIR if set, else the repository's traces/."""
    override = os.environ.get(TRACE_ENV)
    return Path(override) if override else TRACE_DIR


def _shipped_dir() -> Path:
    """Where the shipped traces are: ``testbed/traces`` in an installed wheel, else the
    source checkout's top-level ``traces/`` (their source, which the wheel is built from)."""
    installed = Path(__file__).resolve().parents[1] / "traces"
    if installed.is_dir():
        return installed
    return Path(__file__).resolve().parents[2] / "traces"


TRACE_DIR: Path = _shipped_dir()
"""The shipped traces (see :func:`_shipped_dir`)."""


def trace_catalogue(directory: Path | None = None) -> dict[str, Path]:
    """Traces available by name; the name is the file name, e.g. 'ATT-LTE-driving.up'."""
    folder = directory if directory is not None else trace_dir()
    if not folder.is_dir():
        return {}
    return {
        p.name: p
        for p in sorted(folder.iterdir())
        if p.is_file() and p.suffix in _SUFFIXES
    }


def load_named(name: str) -> Trace:
    """Load a catalogue trace by name (cached per folder and name)."""
    return _load_cached(str(trace_dir()), name)


@functools.lru_cache(maxsize=32)
def _load_cached(folder: str, name: str) -> Trace:
    catalogue = trace_catalogue(Path(folder))
    path = catalogue.get(name)
    if path is None:
        allowed = ", ".join(catalogue) or "(none found)"
        raise TraceError(f"trace: unknown name {name!r} in {folder}; allowed: {allowed}")
    return load_trace(path)


# ---------------------------------------------------------------- trace references


def resolve_trace_ref(ref: str) -> Path:
    """The file a trace reference names: an absolute path as is, else a shipped name."""
    path = Path(ref)
    if path.is_absolute():
        if not path.is_file():
            raise TraceError(f"trace: {ref} does not exist (or is not a file)")
        return path
    catalogue = trace_catalogue()
    found = catalogue.get(ref)
    if found is None:
        allowed = ", ".join(catalogue) or "(none found)"
        raise TraceError(f"trace: unknown name {ref!r} in {trace_dir()}; allowed: {allowed}")
    return found


def load_trace_ref(ref: str, direction: Direction) -> Trace:
    """Load a trace reference (see the module rules) as one direction of a link.

    Shipped names go through :func:`load_named`; files are cached by path, size and
    modification time, so an edited file is read again.
    """
    if not Path(ref).is_absolute():
        trace = load_named(ref)
        if trace.direction != direction:
            return Trace(name=trace.name, direction=direction, stamps_ms=trace.stamps_ms,
                         period_ms=trace.period_ms)
        return trace
    path = resolve_trace_ref(ref)
    stat = path.stat()
    return _load_file_cached(str(path), direction, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _load_file_cached(path: str, direction: Direction, size: int, mtime_ns: int) -> Trace:
    return load_trace(path, direction=direction)


def file_digest(path: Path | str) -> tuple[int, str]:
    """(size in bytes, SHA-256 hex) of a file, for provenance and --resume checks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


# ---------------------------------------------------------------- delay traces


@dataclass(frozen=True)
class DelayTrace:
    """A step function of one-way delay: ``steps[i] = (from_ms, delay_ms)``, sorted."""

    name: str
    steps: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if not self.steps or self.steps[0][0] != 0:
            raise TraceError(f"delay trace {self.name}: the first step must be at 0 ms")

    def delay_at(self, t_ms: float) -> float:
        """One-way delay at trace time T_MS (the last step holds forever)."""
        times = [t for t, _ in self.steps]
        index = max(0, bisect_right(times, t_ms) - 1)
        return self.steps[index][1]

    @property
    def min_ms(self) -> float:
        return min(d for _, d in self.steps)

    @property
    def max_ms(self) -> float:
        return max(d for _, d in self.steps)


def load_delay_trace(path: Path | str) -> DelayTrace:
    """Read a delay trace file (module rules); errors name the file and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="ascii")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not a text delay trace ({exc.reason})") from None
    steps: list[tuple[float, float]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError
            t_ms, delay_ms = float(parts[0]), float(parts[1])
        except ValueError:
            raise TraceError(f"{path}:{lineno}: expected '<ms> <delay_ms>', got "
                             f"{line[:40]!r}") from None
        if not (math.isfinite(t_ms) and t_ms >= 0):
            raise TraceError(f"{path}:{lineno}: time {parts[0]} is not a number >= 0")
        if not (math.isfinite(delay_ms) and 0 <= delay_ms <= MAX_DELAY_MS):
            raise TraceError(f"{path}:{lineno}: delay {parts[1]} is not allowed; allowed: "
                             f"0..{MAX_DELAY_MS:g} ms")
        if steps and t_ms <= steps[-1][0]:
            raise TraceError(f"{path}:{lineno}: time {parts[0]} is not after the previous "
                             f"{steps[-1][0]:g} (times must increase)")
        if not steps and t_ms != 0:
            raise TraceError(f"{path}:{lineno}: the first step must be at 0 ms, got {parts[0]}")
        steps.append((t_ms, delay_ms))
    if not steps:
        raise TraceError(f"{path}: delay trace is empty (no '<ms> <delay_ms>' line)")
    return DelayTrace(name=path.name, steps=tuple(steps))
