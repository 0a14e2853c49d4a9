"""The metrics protocol of command workloads: JSON lines your program writes (pure).

Every program of a command workload gets ``TESTBED_METRICS``, the path of a file of its
own, and may append one JSON object per line to it (docs/own-programs.md):

    {"event": "action", "action": "act-003", "ok": true, "stall_ms": 41.7}
    {"event": "episode", "requests": 120, "retries": 2}

Rules:

1. ``event`` is ``action`` (one row of actions.parquet) or ``episode`` (fields of the
   episode row's ``metrics``, per program). Anything else is the program's error.
2. An action has ``ok`` (true or false; required), and may have ``action`` (a string or
   integer, unique per episode; default ``<label>/<n>``), ``stall_ms`` (a number >= 0),
   ``bytes`` (an integer >= 0), ``t_ns`` (CLOCK_MONOTONIC nanoseconds, like
   ``TESTBED_T0_NS``; becomes ``t_ms`` since replay time 0) and ``reason`` (a string).
   Other fields must be JSON scalars (string, number, true/false, null) and are kept as
   the row's ``metrics`` (a JSON object).
3. An action whose id is one of the schedule's actions gets that action's ``unit`` and
   ``planner``; ``executor`` and ``host`` are the host that reported it.
4. Blank lines are skipped; a last line without a newline (a program stopped while
   writing) is ignored. Every other fault is a :class:`MetricsError` naming the file and
   line, and the episode is aborted with it (nothing is imputed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from testbed.errors import RunFailure

EVENTS = ("action", "episode")
ACTION_KEYS = ("event", "action", "ok", "stall_ms", "bytes", "t_ns", "reason")


class MetricsError(RunFailure):
    """A program wrote a metrics line that breaks the protocol (one line, file:line)."""


def _scalar(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, str | int | bool)


def _fail(where: str, what: str) -> MetricsError:
    return MetricsError(f"metrics {where}: {what}")


def parse_lines(text: str, where: str) -> list[dict[str, Any]]:
    """The JSON objects of a metrics file (rules 1 and 4)."""
    lines = text.split("\n")
    if lines and lines[-1] != "":
        lines = lines[:-1]  # unterminated: the writer was stopped mid-line
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError as exc:
            raise _fail(f"{where}:{number}", f"not JSON ({exc})") from None
        if not isinstance(event, dict):
            raise _fail(f"{where}:{number}", "expected a JSON object, e.g. "
                        '{"event": "action", "ok": true, "stall_ms": 12.5}')
        if event.get("event") not in EVENTS:
            raise _fail(f"{where}:{number}", f"event {event.get('event')!r} is not allowed; "
                        f"allowed: {', '.join(EVENTS)}")
        for key, value in event.items():
            if not _scalar(value):
                raise _fail(f"{where}:{number}", f"field {key!r}: {value!r} is not allowed; "
                            "allowed: a string, a finite number, true, false or null")
        event["_line"] = number
        out.append(event)
    return out


def action_row(event: Mapping[str, Any], *, label: str, host: str, n: int, where: str,
               t0_ns: int | None) -> dict[str, Any]:
    """One action event as the runner's action fields (rules 2 and 3, without the
    schedule's columns)."""
    at = f"{where}:{event['_line']}"
    ok = event.get("ok")
    if not isinstance(ok, bool):
        raise _fail(at, f"ok: {ok!r} is not allowed; allowed: true or false (required)")
    action = event.get("action", f"{label}/{n}")
    if isinstance(action, bool) or not isinstance(action, str | int) or action == "":
        raise _fail(at, f"action: {action!r} is not allowed; allowed: a string or an integer")
    stall = event.get("stall_ms")
    if stall is not None and (isinstance(stall, bool) or not isinstance(stall, int | float)
                              or stall < 0):
        raise _fail(at, f"stall_ms: {stall!r} is not allowed; allowed: a number >= 0")
    size = event.get("bytes")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise _fail(at, f"bytes: {size!r} is not allowed; allowed: an integer >= 0")
    t_ns = event.get("t_ns")
    if t_ns is not None and (isinstance(t_ns, bool) or not isinstance(t_ns, int)):
        raise _fail(at, f"t_ns: {t_ns!r} is not allowed; allowed: an integer "
                    "(CLOCK_MONOTONIC nanoseconds, as TESTBED_T0_NS)")
    reason = event.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise _fail(at, f"reason: {reason!r} is not allowed; allowed: a string")
    extra = {k: v for k, v in event.items() if k not in ACTION_KEYS and k != "_line"}
    return {
        "action": str(action), "outcome": "ok" if ok else "failed", "ok": ok,
        "invalid": None, "complete": ok, "replans": None,
        "stall_ms": None if stall is None else float(stall),
        "bytes": size, "connections": None, "block_reason": reason or "",
        "rpc_timeouts": None, "host": host,
        "t_ms": None if t_ns is None or t0_ns is None else (t_ns - t0_ns) / 1e6,
        "metrics": json.dumps(extra, sort_keys=True) if extra else None,
    }


def read_metrics(files: Mapping[str, tuple[str, Path]], *, t0_ns: int | None
                 ) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Action rows and episode metrics (per label) from each program's file
    (FILES: label -> (host, path)); rule 4 for faults and duplicate action ids."""
    actions: list[dict[str, Any]] = []
    episode: dict[str, dict[str, Any]] = {}
    seen: dict[str, str] = {}
    for label, (host, path) in files.items():
        where = path.name
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue  # the program reported nothing
        except (OSError, UnicodeDecodeError) as exc:
            raise _fail(where, f"unreadable ({exc})") from None
        n = 0
        for event in parse_lines(text, where):
            if event["event"] == "episode":
                fields = {k: v for k, v in event.items() if k not in ("event", "_line")}
                episode.setdefault(label, {}).update(fields)
                continue
            n += 1
            row = action_row(event, label=label, host=host, n=n, where=where, t0_ns=t0_ns)
            if row["action"] in seen:
                raise _fail(f"{where}:{event['_line']}", f"action {row['action']!r} was "
                            f"already reported ({seen[row['action']]}); ids are unique per "
                            "episode")
            seen[row["action"]] = f"{where}:{event['_line']}"
            actions.append(row)
    return actions, episode
