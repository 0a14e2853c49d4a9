"""The validity verdict, from the owners' own head logs (never from what a node claims).

A released action is invalid if the recorded input of some declared key differs from
the owner's head at the instant the action was issued. Owners log every head change
with its CLOCK_MONOTONIC time, which is system wide, so logs of different processes
compare; an action's issue time comes from the same clock.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

HeadLog = dict[str, tuple[list[int], list[bytes]]]  # key -> (sorted t_ns, record ids)


def build_head_log(logs: Mapping[str, Sequence[Sequence[Any]]]) -> HeadLog:
    """Merge owners' head logs ``[key, seq, id, t_ns]`` into per-key timelines."""
    merged: dict[str, list[tuple[int, int, bytes]]] = defaultdict(list)
    for entries in logs.values():
        for key, seq, record_id, t_ns in entries:
            merged[str(key)].append((int(t_ns), int(seq), bytes(record_id)))
    timeline: HeadLog = {}
    for key, entries in merged.items():
        entries.sort()
        timeline[key] = ([t for t, _, _ in entries], [rid for _, _, rid in entries])
    return timeline


def head_at(timeline: HeadLog, key: str, t_ns: int) -> bytes | None:
    """The owner's head of ``key`` at ``t_ns`` (None before its first version)."""
    times, ids = timeline.get(key, ([], []))
    index = bisect.bisect_right(times, t_ns) - 1
    return ids[index] if index >= 0 else None


def judge_invalid(timeline: HeadLog, keys: Sequence[str], inputs: Mapping[str, bytes],
                  issue_t_ns: int) -> bool:
    """True if some declared input differs from its owner's head at issue time."""
    return any(inputs.get(key) is None or inputs[key] != head_at(timeline, key, issue_t_ns)
               for key in keys)


def effect_verdict(timeline: HeadLog, keys: Sequence[str], inputs: Mapping[str, bytes],
                   effect_t_ns: int) -> tuple[bool, int | None]:
    """Whether every declared input is still its owner's head at the recorded effect, and
    if not, when the first of them changed (the owner's log time of the change after
    the issued version; None when the input was never a head)."""
    first: int | None = None
    current = True
    for key in keys:
        rid = inputs.get(key)
        if rid is not None and rid == head_at(timeline, key, effect_t_ns):
            continue
        current = False
        times, ids = timeline.get(key, ([], []))
        if rid in ids:
            index = ids.index(rid)
            if index + 1 < len(times):
                changed = times[index + 1]
                first = changed if first is None else min(first, changed)
    return current, first


def changes_between(timeline: HeadLog, key: str, start_ns: int, end_ns: int) -> int:
    """How many times the owner's head of ``key`` changed in (start_ns, end_ns]."""
    times, _ = timeline.get(key, ([], []))
    return bisect.bisect_right(times, end_ns) - bisect.bisect_right(times, start_ns)


def action_row(action: str, keys: Sequence[str], reply: Mapping[str, Any],
               timeline: HeadLog) -> dict[str, Any]:
    """One action's result row from its ``act`` reply, judged against the owners' heads
    at its issue (the columns every episode engine writes; costs added by the caller)."""
    released = reply["outcome"] == "released"
    inputs = {str(k): bytes(v) for k, v in dict(reply.get("inputs") or {}).items()}
    invalid = released and judge_invalid(timeline, keys, inputs, int(reply["issue_t_ns"]))
    return {
        "action": action, "outcome": reply["outcome"], "invalid": invalid,
        "complete": released and not invalid, "replans": int(reply["replans"]),
        "stall_ms": float(reply["stall_ms"]), "bytes": int(reply["bytes"]),
        "connections": int(reply["connections"]),
        "block_reason": str(reply.get("block_reason") or ""),
    }
