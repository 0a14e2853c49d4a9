"""Histories in a run directory: one folder per episode, one JSON-lines file per host.

Layout: ``<run>/history/<episode>/<host>.jsonl`` (the episode key with ``/`` as ``~``;
a second or later attempt of an episode, ``--repeats`` or a rerun, adds ``@<attempt>``),
each file written atomically before the episode's shards, so a committed episode has
its history. ``testbed history check RUN`` writes ``<run>/history/anomalies.jsonl``
(derived, rewritten by every check; the histories themselves are never changed).
The format and the checker are pure (``protocols.history``, ``protocols.history_check``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from protocols.history import (
    HistoryError,
    HostHistory,
    event_line,
    header_line,
    parse_history,
)
from protocols.history_check import CheckResult, check_history
from testbed.results.atomic import TMP_MARK
from testbed.results.schema import HISTORY_EPISODE_FIELDS

HISTORY_DIR = "history"
SUFFIX = ".jsonl"
ANOMALIES = "anomalies.jsonl"


ATTEMPT_MARK = "@"


def history_dir(run: Path, key: str, attempt: int = 1) -> Path:
    name = key.replace("/", "~") + (f"{ATTEMPT_MARK}{attempt}" if attempt > 1 else "")
    return run / HISTORY_DIR / name


def _write_atomic(final: Path, text: str) -> None:
    tmp = final.with_name(f".{final.name}{TMP_MARK}{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def history_text(host: str, events: Sequence[Mapping[str, Any]], t0_ns: int | None = None
                 ) -> str:
    return header_line(host, t0_ns) + "".join(event_line(e) for e in events)


def history_texts(hosts: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, str]:
    """Each host's events (plain dicts) as the text of its file."""
    return {host: history_text(host, events) for host, events in hosts.items()}


def write_history(run: Path, key: str, files: Mapping[str, str], attempt: int = 1) -> Path:
    """Write one episode's history files (name -> text); returns the episode's folder."""
    folder = history_dir(run, key, attempt)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        _write_atomic(folder / f"{name}{SUFFIX}", text)
    return folder


def parse_texts(files: Mapping[str, str]) -> list[HostHistory]:
    """History files in memory, through the same parser (messages name ``name:line``)."""
    return [parse_history(text, f"{name}{SUFFIX}") for name, text in files.items()]


def read_episode(folder: Path, *, relative_to: Path | None = None) -> list[HostHistory]:
    """Every host file of one episode's folder (messages name the file and line)."""
    out = []
    for path in sorted(folder.glob(f"*{SUFFIX}")):
        if path.name.startswith("."):
            continue
        name = str(path.relative_to(relative_to)) if relative_to is not None else str(path)
        out.append(parse_history(path.read_text(errors="replace"), name))
    return out


def episode_folders(run: Path) -> Iterator[tuple[str, Path]]:
    """(episode key, folder) of every episode with a history, in key order (a later
    attempt's key ends in ``@<attempt>``)."""
    root = run / HISTORY_DIR
    if not root.is_dir():
        return
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        yield folder.name.replace("~", "/"), folder


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def history_columns(result: CheckResult) -> dict[str, Any]:
    """The episode columns of :data:`HISTORY_EPISODE_FIELDS` (null where none stale)."""
    anomalies = result.anomalies
    lates = [v.late_ns / 1e6 for v in anomalies if v.late_ns is not None]
    columns = {
        "stale_actions": len(anomalies),
        "stale_in_window_actions": sum(1 for v in anomalies if v.status == "stale_in_window"),
        "fresh_memory_stale_plan": sum(1 for v in anomalies if v.fresh_memory_stale_plan),
        "stale_late_p50_ms": _quantile(lates, 0.5) if lates else None,
        "stale_late_max_ms": max(lates) if lates else None,
    }
    assert tuple(columns) == HISTORY_EPISODE_FIELDS
    return columns


def check_episode(files: Mapping[str, str]) -> CheckResult:
    return check_history(parse_texts(files))


def read_program_histories(paths: Mapping[str, tuple[str, Path]], *, relative_to: Path
                           ) -> tuple[dict[str, str], CheckResult | None]:
    """The histories programs wrote (label -> (host, path); a missing file is a program
    that wrote none) and their verdicts; HistoryError when one breaks the format, names
    another host in its header, or cannot be judged."""
    texts: dict[str, str] = {}
    parsed: list[HostHistory] = []
    for label, (host, path) in paths.items():
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        name = str(path.relative_to(relative_to)) if path.is_relative_to(relative_to) \
            else str(path)
        history = parse_history(text, name)
        if history.host != host:
            raise HistoryError(f"{name}:1: header host {history.host!r}, but the program "
                               f"runs on {host!r}")
        texts[label] = text
        parsed.append(history)
    return texts, (check_history(parsed) if parsed else None)


def anomaly_record(episode: str, verdict: Any) -> dict[str, Any]:
    """One line of the anomalies file: the verdict of a non-current action, explained."""
    return {
        "episode": episode, "action": verdict.action, "host": verdict.host,
        "plan": verdict.plan, "t_ns": verdict.t_ns, "status": verdict.status,
        "fresh_memory_stale_plan": verdict.fresh_memory_stale_plan,
        "late_ns": verdict.late_ns,
        "window": list(verdict.window) if verdict.window else None,
        "inputs": [{"key": s.key, "used": s.used, "newer": s.newer,
                    "newer_t_ns": s.newer_t_ns, "newer_by": s.newer_by,
                    "current": s.current, "late_ns": s.late_ns,
                    "held_newer": s.held_newer, "in_window": s.in_window}
                   for s in verdict.stale],
    }


def write_anomalies(run: Path, records: Sequence[Mapping[str, Any]]) -> Path:
    final = run / HISTORY_DIR / ANOMALIES
    final.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(final, "".join(event_line(r) for r in records))
    return final
