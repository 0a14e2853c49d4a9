"""Body schemas of policy-defined RPCs: what a request or answer may look like (pure).

Rules:

1. A schema is a tree of :class:`Int`, :class:`Float`, :class:`Bool`, :class:`Str`,
   :class:`Bytes`, :class:`List`, :class:`Map`, :class:`Optional`, :class:`Head` and
   :class:`Any_` nodes. Every string, byte string and list has a maximum length, so
   every schema has an upper bound on its msgpack size (:meth:`Schema.max_bytes`):
   the size limit of a method is a property of its schema, checked once when the
   policy registers, never re-encoded per request.
2. ``check(value, where)`` accepts exactly what the schema describes and returns it
   (``Head`` returns a :class:`HeadInfo`); anything else raises
   :class:`RemoteProtocolError` naming the path of the first bad field. At a node this
   is the peer's fault (its connection closes, as for every built-in method); in a
   caller it is the caller's own fault (the env raises it as ``LocalProtocolError``).
3. A :class:`Map` has exactly its required fields and any of its optional ones;
   unknown fields are refused (the built-in methods' rule 1).
4. ``Any_`` (any plain msgpack value, bounded by ``max_bytes``) is the escape hatch;
   its bound is declared, not measured, and the node checks it by re-encoding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from protocols.errors import RemoteProtocolError
from protocols.records import RECORD_ID_BYTES, HeadInfo
from protocols.wire import MAX_ARRAY_ITEMS, MAX_FRAME_BYTES, MAX_MAP_ITEMS, MAX_STR_BYTES, pack

_HEADER = 9  # the largest msgpack header (str32/bin32/array32/map32, float64, int64)
_KEY_CHARS = 64


class SchemaError(ValueError):
    """A policy declared a schema that cannot be checked (its author's mistake)."""


class Schema:
    """One node of a body schema."""

    def check(self, value: Any, where: str) -> Any:
        raise NotImplementedError

    def max_bytes(self) -> int:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


def _bad(where: str, what: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"{where}: {what}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Int(Schema):
    lo: int = 0
    hi: int = 2**63 - 1

    def __post_init__(self) -> None:
        if not (_is_int(self.lo) and _is_int(self.hi) and -2**63 <= self.lo <= self.hi < 2**64):
            raise SchemaError(f"Int({self.lo!r}, {self.hi!r}): need -2**63 <= lo <= hi < 2**64")

    def check(self, value: Any, where: str) -> Any:
        if not _is_int(value) or not self.lo <= value <= self.hi:
            raise _bad(where, f"expected an integer {self.lo}..{self.hi}")
        return value

    def max_bytes(self) -> int:
        return 9

    def describe(self) -> str:
        return f"int {self.lo}..{self.hi}"


@dataclass(frozen=True)
class Float(Schema):
    lo: float = -math.inf
    hi: float = math.inf

    def check(self, value: Any, where: str) -> Any:
        if not isinstance(value, float) or not math.isfinite(value) \
                or not self.lo <= value <= self.hi:
            raise _bad(where, f"expected a finite float {self.lo}..{self.hi}")
        return value

    def max_bytes(self) -> int:
        return 9

    def describe(self) -> str:
        return "float"


@dataclass(frozen=True)
class Bool(Schema):
    def check(self, value: Any, where: str) -> Any:
        if not isinstance(value, bool):
            raise _bad(where, "expected true or false")
        return value

    def max_bytes(self) -> int:
        return 1

    def describe(self) -> str:
        return "bool"


@dataclass(frozen=True)
class Str(Schema):
    max_len: int = 256
    min_len: int = 0

    def __post_init__(self) -> None:
        if not (_is_int(self.max_len) and 0 <= self.min_len <= self.max_len <= MAX_STR_BYTES):
            raise SchemaError(f"Str(max_len={self.max_len!r}): need 0 <= min_len <= max_len "
                              f"<= {MAX_STR_BYTES}")

    def check(self, value: Any, where: str) -> Any:
        if not isinstance(value, str) or not self.min_len <= len(value.encode()) <= self.max_len:
            raise _bad(where, f"expected a string of {self.min_len}..{self.max_len} bytes")
        return value

    def max_bytes(self) -> int:
        return _HEADER + self.max_len

    def describe(self) -> str:
        return f"str <= {self.max_len}"


@dataclass(frozen=True)
class Bytes(Schema):
    max_len: int = 1024
    min_len: int = 0

    def __post_init__(self) -> None:
        if not (_is_int(self.max_len) and 0 <= self.min_len <= self.max_len <= MAX_FRAME_BYTES):
            raise SchemaError(f"Bytes(max_len={self.max_len!r}): need 0 <= min_len <= "
                              f"max_len <= {MAX_FRAME_BYTES}")

    def check(self, value: Any, where: str) -> Any:
        if not isinstance(value, bytes) or not self.min_len <= len(value) <= self.max_len:
            raise _bad(where, f"expected {self.min_len}..{self.max_len} bytes")
        return value

    def max_bytes(self) -> int:
        return _HEADER + self.max_len

    def describe(self) -> str:
        return f"bytes <= {self.max_len}"


@dataclass(frozen=True)
class Head(Schema):
    """A head envelope (``HeadInfo`` on the wire); checked values are ``HeadInfo``."""

    def check(self, value: Any, where: str) -> Any:
        try:
            return HeadInfo.from_wire(value)
        except RemoteProtocolError as exc:
            raise _bad(where, str(exc)) from None

    def max_bytes(self) -> int:
        compact = 4 * _HEADER + 3 + 200 + 64 + 9 + RECORD_ID_BYTES
        # JSON text (protocols.record_json) in a bin: hex ID, characters escaped as
        # \uXXXX pairs at worst, a 20-digit sequence and the fixed punctuation.
        json_text = _HEADER + 40 + 2 * RECORD_ID_BYTES + 12 * (200 + 64) + 20
        return max(compact, json_text)

    def describe(self) -> str:
        return "head"


@dataclass(frozen=True)
class List(Schema):
    item: Schema
    max_len: int = 64
    min_len: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.item, Schema):
            raise SchemaError(f"List item {self.item!r} is not a schema")
        if not (_is_int(self.max_len) and 0 <= self.min_len <= self.max_len <= MAX_ARRAY_ITEMS):
            raise SchemaError(f"List(max_len={self.max_len!r}): need 0 <= min_len <= max_len "
                              f"<= {MAX_ARRAY_ITEMS}")

    def check(self, value: Any, where: str) -> Any:
        if not isinstance(value, list) or not self.min_len <= len(value) <= self.max_len:
            raise _bad(where, f"expected a list of {self.min_len}..{self.max_len} items")
        item = self.item
        try:  # the path of a bad item is spelled out only when there is one
            return [item.check(v, where) for v in value]
        except RemoteProtocolError:
            for i, v in enumerate(value):
                item.check(v, f"{where}[{i}]")
            raise

    def max_bytes(self) -> int:
        return _HEADER + self.max_len * self.item.max_bytes()

    def describe(self) -> str:
        return f"[{self.item.describe()}] <= {self.max_len}"


@dataclass(frozen=True)
class Optional(Schema):
    """A Map field that may be left out (only inside a :class:`Map`)."""

    inner: Schema

    def __post_init__(self) -> None:
        if not isinstance(self.inner, Schema) or isinstance(self.inner, Optional):
            raise SchemaError("Optional needs a schema that is not Optional")

    def check(self, value: Any, where: str) -> Any:
        return self.inner.check(value, where)

    def max_bytes(self) -> int:
        return self.inner.max_bytes()

    def describe(self) -> str:
        return f"{self.inner.describe()}?"


@dataclass(frozen=True)
class Any_(Schema):
    """Any plain msgpack value of at most ``max_len`` encoded bytes."""

    max_len: int = 1024

    def __post_init__(self) -> None:
        if not (_is_int(self.max_len) and 0 < self.max_len <= MAX_FRAME_BYTES):
            raise SchemaError(f"Any_(max_len={self.max_len!r}): need 1..{MAX_FRAME_BYTES}")

    def check(self, value: Any, where: str) -> Any:
        try:
            size = len(pack(value))
        except (RemoteProtocolError, TypeError, ValueError, OverflowError):
            raise _bad(where, "not a plain msgpack value") from None
        if size > self.max_len:
            raise _bad(where, f"{size} bytes encoded, more than {self.max_len}")
        return value

    def max_bytes(self) -> int:
        return self.max_len

    def describe(self) -> str:
        return f"any <= {self.max_len} B"


@dataclass(frozen=True)
class Map(Schema):
    """A map with exactly these string fields (``Optional`` ones may be left out)."""

    fields: Mapping[str, Schema] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.fields, Mapping) or len(self.fields) > MAX_MAP_ITEMS:
            raise SchemaError(f"Map fields must be a mapping of at most {MAX_MAP_ITEMS}")
        for name, schema in self.fields.items():
            if not (isinstance(name, str) and 0 < len(name) <= _KEY_CHARS):
                raise SchemaError(f"Map field name {name!r}: need 1..{_KEY_CHARS} characters")
            if not isinstance(schema, Schema):
                raise SchemaError(f"Map field {name!r}: {schema!r} is not a schema")
        object.__setattr__(self, "fields", dict(self.fields))

    def check(self, value: Any, where: str) -> Any:
        if not isinstance(value, Mapping):
            raise _bad(where, "expected a map")
        unknown = [k for k in value if k not in self.fields]
        if unknown:
            raise _bad(where, f"unknown field {str(unknown[0])[:_KEY_CHARS]!r}; allowed: "
                              f"{', '.join(self.fields)}")
        out: dict[str, Any] = {}
        for name, schema in self.fields.items():
            if name not in value:
                if isinstance(schema, Optional):
                    continue
                raise _bad(where, f"missing field {name!r}")
            try:  # the path of a bad field is spelled out only when there is one
                out[name] = schema.check(value[name], where)
            except RemoteProtocolError:
                schema.check(value[name], f"{where}.{name}")
                raise
        return out

    def max_bytes(self) -> int:
        return _HEADER + sum(_HEADER + len(n.encode()) + s.max_bytes()
                             for n, s in self.fields.items())

    def describe(self) -> str:
        return "{" + ", ".join(f"{n}: {s.describe()}" for n, s in self.fields.items()) + "}"


def to_wire(value: Any) -> Any:
    """A checked value back in wire form (``HeadInfo`` as its map, recursively)."""
    if isinstance(value, HeadInfo):
        return value.to_wire()
    if isinstance(value, list):
        return [to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: to_wire(v) for k, v in value.items()}
    return value
