"""The field parsers of network tables (``testbed.links.netdef``): numbers, integers,
loss and queue tables, each a one-line :class:`ProfileError` naming the field by its
path when wrong; and the loss and queue tables written back.

Loss: ``{ model = "none" | "iid" (pct) | "gilbert" (p, r, loss_good_pct,
loss_bad_pct) }``. Queue: ``{ kind, packets, bytes }`` plus the kind's own settings
(:data:`QUEUE_SETTINGS`): CoDel's and fq_codel's ``target_ms`` / ``interval_ms``, PIE's
``target_ms`` / ``tupdate_ms``, fq_codel's ``flows``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from testbed.links.linkspec import (
    CODEL_INTERVAL_MS,
    CODEL_TARGET_MS,
    DEFAULT_QUEUE_PACKETS,
    FQ_CODEL_FLOWS,
    MIN_QUEUE_BYTES,
    PIE_TARGET_MS,
    PIE_TUPDATE_MS,
    QUEUE_KINDS,
    GilbertLoss,
    ProfileError,
    QueueSpec,
)

LOSS_MODELS = ("none", "iid", "gilbert")
#: queue kind -> the settings its table may give besides kind, packets and bytes
QUEUE_SETTINGS: dict[str, tuple[str, ...]] = {
    "droptail": (), "drophead": (), "codel": ("target_ms", "interval_ms"),
    "pie": ("target_ms", "tupdate_ms"), "fq_codel": ("target_ms", "interval_ms", "flows")}


def fail(where: str, value: Any, allowed: str) -> ProfileError:
    shown = repr(value) if not isinstance(value, int | float) or isinstance(value, bool) \
        else f"{value:g}"
    return ProfileError(f"{where}: {shown} is not allowed; allowed: {allowed}")


def number(table: Mapping[str, Any], key: str, where: str, *, low: float,
            high: float | None = None, low_open: bool = False, default: float | None = None,
            ) -> float | None:
    if key not in table:
        return default
    value = table[key]
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (high is None or value <= high)
    if not ok:
        lo = f"{'>' if low_open else '>='} {low:g}"
        hi = "" if high is None else f" and <= {high:g}"
        raise fail(f"{where}.{key}", value, f"a number {lo}{hi}")
    return float(value)


def integer(table: Mapping[str, Any], key: str, where: str, *, low: int,
             what: str) -> int | None:
    if key not in table:
        return None
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise fail(f"{where}.{key}", value, f"an integer >= {low} ({what})")
    return int(value)


def unknown(table: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise ProfileError(f"{where}: unknown field {key!r}; allowed: {', '.join(allowed)}")


def as_table(value: Any, where: str, example: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ProfileError(f"{where}: expected a table, e.g. {example}")
    return value


def loss(value: Any, where: str) -> dict[str, Any]:
    table = as_table(value, where, '{ model = "iid", pct = 1.0 }')
    model = table.get("model")
    if model not in LOSS_MODELS:
        raise fail(f"{where}.model", model, ", ".join(LOSS_MODELS))
    if model == "none":
        unknown(table, ("model",), where)
        return {"loss_pct": 0.0, "gilbert": None}
    if model == "iid":
        unknown(table, ("model", "pct"), where)
        if "pct" not in table:
            raise ProfileError(f"{where}.pct: missing; give the loss in percent (0 <= pct < 100)")
        pct = table["pct"]
        if isinstance(pct, bool) or not isinstance(pct, int | float) or not 0 <= pct < 100:
            raise fail(f"{where}.pct", pct, "a number >= 0 and < 100 (percent)")
        return {"loss_pct": float(pct), "gilbert": None}
    unknown(table, ("model", "p", "r", "loss_good_pct", "loss_bad_pct"), where)
    values: dict[str, float] = {}
    for key in ("p", "r"):
        if key not in table:
            raise ProfileError(f"{where}.{key}: missing; a gilbert model needs p (good -> "
                               "bad) and r (bad -> good), probabilities per packet")
        got = number(table, key, where, low=0.0, high=1.0, low_open=True)
        assert got is not None
        values[key] = got
    for key, default in (("loss_good_pct", 0.0), ("loss_bad_pct", 100.0)):
        got = number(table, key, where, low=0.0, high=100.0, default=default)
        assert got is not None
        values[key] = got
    return {"loss_pct": 0.0, "gilbert": GilbertLoss(**values)}


def queue(value: Any, where: str) -> QueueSpec:
    table = as_table(value, where, '{ kind = "droptail", packets = 100 }')
    kind = table.get("kind", "droptail")
    if kind not in QUEUE_KINDS:
        raise fail(f"{where}.kind", kind, ", ".join(QUEUE_KINDS))
    allowed = ("kind", "packets", "bytes", *QUEUE_SETTINGS[kind])
    unknown(table, allowed, where)
    packets = integer(table, "packets", where, low=1, what="packets the queue holds")
    size = integer(table, "bytes", where, low=MIN_QUEUE_BYTES,
                    what="bytes the queue holds; one full packet must fit")
    out: dict[str, Any] = {"kind": kind, "bytes": size,
                           "packets": DEFAULT_QUEUE_PACKETS if packets is None else packets}
    target = number(table, "target_ms", where, low=0.0, high=10_000.0, low_open=True,
                     default=PIE_TARGET_MS if kind == "pie" else CODEL_TARGET_MS)
    assert target is not None
    if kind in ("codel", "fq_codel"):
        out.update(target_ms=target, interval_ms=number(
            table, "interval_ms", where, low=target, high=100_000.0,
            default=CODEL_INTERVAL_MS))
    elif kind == "pie":
        out.update(target_ms=target, tupdate_ms=number(
            table, "tupdate_ms", where, low=0.0, high=10_000.0, low_open=True,
            default=PIE_TUPDATE_MS))
    if kind == "fq_codel":
        flows = integer(table, "flows", where, low=1, what="fq_codel's flow queues")
        out["flows"] = FQ_CODEL_FLOWS if flows is None else flows
    try:
        return QueueSpec(**out)
    except ProfileError as exc:
        raise ProfileError(f"{where}.{str(exc).removeprefix('queue.')}") from None


def common_queue(queue: QueueSpec) -> dict[str, Any]:
    """The common queue as LinkSpec's flat fields."""
    return {"queue_kind": queue.kind, "queue_packets": queue.packets,
            "queue_bytes": queue.bytes, "codel_target_ms": queue.target_ms,
            "codel_interval_ms": queue.interval_ms, "queue_tupdate_ms": queue.tupdate_ms,
            "queue_flows": queue.flows}


def loss_data(pct: float, gilbert: GilbertLoss | None) -> dict[str, Any] | None:
    if gilbert is not None:
        return {"model": "gilbert", "p": gilbert.p, "r": gilbert.r,
                "loss_good_pct": gilbert.loss_good_pct, "loss_bad_pct": gilbert.loss_bad_pct}
    return {"model": "iid", "pct": pct} if pct > 0 else None


def queue_data(queue: QueueSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": queue.kind, "packets": queue.packets}
    if queue.bytes is not None:
        out["bytes"] = queue.bytes
    for key in QUEUE_SETTINGS[queue.kind]:
        out[key] = getattr(queue, key)
    return out
