"""The JSON Schema of a network table (``[networks.NAME]``, ``testbed schema network``):
the fields ``testbed.links.netdef`` reads, with their types and ranges, for editors.
``netdef`` checks the tables themselves (files, inheritance, the groups of rule 3);
``tests/testbed/campaign/test_schema.py`` keeps the two field lists equal."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from testbed.links.linkspec import ORDERS, QUEUE_KINDS
from testbed.links.netdef_fields import LOSS_MODELS
from testbed.links.traces import MAX_DELAY_MS

_STRING: dict[str, Any] = {"type": "string"}
_GE0: dict[str, Any] = {"type": "number", "minimum": 0}
_GT0: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0}
_BOOL: dict[str, Any] = {"type": "boolean"}


def _enum(choices: Sequence[Any]) -> dict[str, Any]:
    return {"enum": list(choices)}


def object_schema(properties: Mapping[str, Any], description: str = "") -> dict[str, Any]:
    out = {"type": "object", "additionalProperties": False, "properties": dict(properties)}
    return {**out, "description": description} if description else out


_LOSS = object_schema({
    "model": _enum(LOSS_MODELS), "pct": {"type": "number", "minimum": 0, "exclusiveMaximum": 100},
    **{k: _GE0 for k in ("p", "r", "loss_good_pct", "loss_bad_pct")}}, "a loss model")
_QUEUE = object_schema({
    "kind": _enum(QUEUE_KINDS), "packets": {"type": "integer", "minimum": 1},
    "bytes": {"type": "integer", "minimum": 1},
    **{k: _GT0 for k in ("target_ms", "interval_ms", "tupdate_ms")},
    "flows": {"type": "integer", "minimum": 1}}, "a queue")
_DELAY = {"type": "number", "minimum": 0, "maximum": MAX_DELAY_MS}
#: a link's fields, as ``testbed.links.netdef.LINK_FIELDS`` lists them
_LINK: dict[str, Any] = {
    "up_trace": _STRING, "down_trace": _STRING, "rate_kbit": _GT0,
    "up_rate_kbit": _GT0, "down_rate_kbit": _GT0, "delay_ms": _DELAY,
    "delay_trace": _STRING, "up_delay_ms": _DELAY, "down_delay_ms": _DELAY, "loss": _LOSS,
    "up_loss": _LOSS, "down_loss": _LOSS, "queue": _QUEUE, "up_queue": _QUEUE,
    "down_queue": _QUEUE, "order": _enum(ORDERS), "trace_offset_s": _GE0,
    "trace_wrap": _BOOL}
_HOST_PROPS = {"network": _STRING, **_LINK, "congestion_control": _STRING, "unshaped": _BOOL}
_NETWORK_PROPS = {"description": _STRING, "unshaped": _BOOL, "congestion_control": _STRING,
                  **_LINK, "hosts": {"type": "object", "additionalProperties": object_schema(
                      _HOST_PROPS, "one host's link (a0, a1, central or a name)")},
                  "network": _STRING}
NETWORK_SCHEMA = object_schema(_NETWORK_PROPS, "a network ([networks.NAME], docs/links.md)")
