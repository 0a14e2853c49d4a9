"""The history format: what a system did, one JSON object per line, one file per host.

Rules (docs/history.md is the reference; version :data:`HISTORY_VERSION`):

1. A file's first line is the header ``{"history": 1, "host": NAME}`` (optionally
   ``"t0_ns"``, replay time 0). Every other line is one event with ``"type"`` and
   ``"t_ns"``: CLOCK_MONOTONIC nanoseconds, the clock every host of a run shares.
2. Event types and their fields (any other field is free-form and kept in ``extra``):
   ``write`` key, version, owner (a new version committed at ``t_ns``); ``read`` and
   ``install`` key, version (the host now holds that version); ``derive`` plan, inputs
   (``{key: version}``, the exact versions the plan was derived from); ``check``
   action, start_t_ns (a validation of ``action`` that ran from ``start_t_ns`` to
   ``t_ns``); ``act`` action, plan, optional keys (the action was issued at ``t_ns``
   executing ``plan``; ``keys`` are its declared inputs, by default the plan's).
   Optional: ``rpc`` peer, method, start_t_ns (a call this host sent to ``peer`` at
   ``start_t_ns`` whose answer returned at ``t_ns``; ``served_t_ns``, when known, is
   when the peer answered it). The checker ignores ``rpc``; timelines draw it.
3. Within one file ``t_ns`` never decreases. A line that is not a JSON object, an
   unknown type, a missing or ill-typed field, a time that goes back: one
   :class:`HistoryError` naming the file and line.
4. A last line without its newline that does not parse is a truncated tail: the
   complete lines before it are kept and the truncation is reported
   (:attr:`HostHistory.truncated`), so a program killed mid-write loses one event.

Pure: text in, events out; reading files is ``testbed.history``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

HISTORY_VERSION = 1
EVENT_TYPES = ("write", "read", "install", "derive", "check", "act", "rpc")
#: Fields each event type requires, with their JSON types (rule 2).
REQUIRED: Mapping[str, Mapping[str, type]] = {
    "write": {"key": str, "version": str, "owner": str},
    "read": {"key": str, "version": str},
    "install": {"key": str, "version": str},
    "derive": {"plan": str, "inputs": dict},
    "check": {"action": str, "start_t_ns": int},
    "act": {"action": str, "plan": str},
    "rpc": {"peer": str, "method": str, "start_t_ns": int},
}
_COMMON = ("type", "t_ns")
_KNOWN = {kind: frozenset({*_COMMON, *fields, "keys"}) for kind, fields in REQUIRED.items()}


class HistoryError(ValueError):
    """A history that breaks the format: one line naming where (``file:line: ...``)."""


_EMPTY: Mapping[str, Any] = MappingProxyType({})


class Event(NamedTuple):
    """One line of a host's history. ``where`` is ``file:line`` for messages.

    A named tuple, not a dataclass: a history can hold millions of events, and a tuple
    is built several times faster."""

    type: str
    t_ns: int
    host: str
    where: str
    key: str = ""
    version: str = ""
    owner: str = ""
    action: str = ""
    plan: str = ""
    start_t_ns: int = 0
    inputs: Mapping[str, str] = _EMPTY
    keys: tuple[str, ...] | None = None
    extra: Mapping[str, Any] = _EMPTY
    peer: str = ""
    method: str = ""


@dataclass(frozen=True)
class HostHistory:
    host: str
    events: tuple[Event, ...]
    t0_ns: int | None = None
    #: ``file:line: ...`` when the last line was cut off mid-write (rule 4).
    truncated: str = ""


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _header(obj: object, where: str) -> tuple[str, int | None]:
    if not isinstance(obj, dict) or "history" not in obj:
        raise HistoryError(f"{where}: the first line must be the header "
                           f'{{"history": {HISTORY_VERSION}, "host": NAME}}')
    if obj["history"] != HISTORY_VERSION:
        raise HistoryError(f"{where}: history version {obj['history']!r} is not supported; "
                           f"supported: {HISTORY_VERSION}")
    host, t0 = obj.get("host"), obj.get("t0_ns")
    if not isinstance(host, str) or not host:
        raise HistoryError(f"{where}: header field host must be a non-empty string")
    if t0 is not None and not _int(t0):
        raise HistoryError(f"{where}: header field t0_ns must be an integer (nanoseconds)")
    return host, t0


def parse_event(obj: object, host: str, where: str) -> Event:
    """One event line (rule 2), already decoded from JSON."""
    if not isinstance(obj, dict):
        raise HistoryError(f"{where}: expected a JSON object")
    kind = obj.get("type")
    if not isinstance(kind, str) or kind not in REQUIRED:
        raise HistoryError(f"{where}: unknown event type {kind!r}; allowed: "
                           f"{', '.join(EVENT_TYPES)}")
    if not _int(obj.get("t_ns")):
        raise HistoryError(f"{where}: {kind}: t_ns must be an integer (CLOCK_MONOTONIC ns)")
    fields: dict[str, Any] = {}
    for name, kind_type in REQUIRED[kind].items():
        value = obj.get(name)
        ok = _int(value) if kind_type is int else isinstance(value, kind_type)
        if not ok or (kind_type is str and not value):
            what = {str: "a non-empty string", int: "an integer", dict: "an object"}[kind_type]
            raise HistoryError(f"{where}: {kind}: field {name} must be {what}")
        fields[name] = value
    if kind == "derive":
        inputs = fields["inputs"]
        if not all(isinstance(k, str) and k and isinstance(v, str) and v
                   for k, v in inputs.items()):
            raise HistoryError(f"{where}: derive: inputs must map keys to version strings")
        fields["inputs"] = dict(inputs)
    if kind in ("check", "rpc") and fields["start_t_ns"] > obj["t_ns"]:
        raise HistoryError(f"{where}: {kind}: start_t_ns is after its end t_ns")
    if kind == "act" and "keys" in obj:
        keys = obj["keys"]
        if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
            raise HistoryError(f"{where}: act: field keys must be a list of key names")
        fields["keys"] = tuple(keys)
    known = _KNOWN[kind]
    extra = _EMPTY
    if len(obj) > len(REQUIRED[kind]) + 2 + ("keys" in fields):
        extra = {k: v for k, v in obj.items() if k not in known}
    return Event(type=kind, t_ns=obj["t_ns"], host=host, where=where, extra=extra, **fields)


def parse_history(text: str, name: str) -> HostHistory:
    """One host's history file (rules 1, 3, 4); ``name`` prefixes every message."""
    lines = text.split("\n")
    complete = text.endswith("\n")
    if complete:
        lines.pop()
    if not lines or not lines[0].strip():
        raise HistoryError(f"{name}:1: empty history (expected the header line)")
    host, t0 = "", None
    events: list[Event] = []
    last_t = None
    truncated = ""
    for number, line in enumerate(lines, start=1):
        where = f"{name}:{number}"
        try:
            obj = json.loads(line)
        except ValueError:
            if number == len(lines) and not complete and number > 1:
                truncated = f"{where}: truncated mid-line; the {len(events)} events before it " \
                            "were kept"
                break
            raise HistoryError(f"{where}: not a JSON object") from None
        if number == 1:
            host, t0 = _header(obj, where)
            continue
        event = parse_event(obj, host, where)
        if last_t is not None and event.t_ns < last_t:
            raise HistoryError(f"{where}: t_ns {event.t_ns} goes back in time (the line "
                               f"before has {last_t}); a host's events must be in time order")
        last_t = event.t_ns
        events.append(event)
    return HostHistory(host, tuple(events), t0, truncated)


def event_line(event: Mapping[str, Any]) -> str:
    """One event (a plain dict) as its line, the way writers should emit it."""
    return json.dumps(event, sort_keys=True, separators=(",", ":")) + "\n"


def header_line(host: str, t0_ns: int | None = None) -> str:
    head: dict[str, Any] = {"history": HISTORY_VERSION, "host": host}
    if t0_ns is not None:
        head["t0_ns"] = t0_ns
    return event_line(head)
