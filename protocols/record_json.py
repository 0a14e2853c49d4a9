"""The JSON wire form of records and head entries (``wire_encoding = "json"``).

The paper's public records are JSON objects; the testbed's default is compact msgpack
maps (``protocols.records``). This module is the other codec, chosen per node process
(``protocols.records.set_wire_encoding``). Rules:

1. A JSON entry travels as one msgpack ``bin`` holding UTF-8 JSON text, never as a
   msgpack map, so a decoder tells the two forms apart by type and the frame's other
   fields (request ids, method names, key lists) keep their encoding.
2. The text is compact and canonical: keys sorted, no spaces, ASCII only. Binary
   fields are lower-case hex (record IDs, parents, signatures: the usual rendering of
   digests and keys); content is standard base64 (it may be a 320 KiB artifact).
3. Decoding accepts exactly these fields and types; anything else (bad UTF-8, bad JSON,
   wrong types, bad hex or base64, extra or missing fields) is the peer's
   :class:`RemoteProtocolError`, as for the compact form. The decoded map is then
   checked by the same ``from_wire`` rules as the compact one.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from protocols.errors import RemoteProtocolError

HEAD_FIELDS = frozenset({"key", "owner", "seq", "id"})
RECORD_FIELDS = frozenset({"key", "owner", "seq", "parents", "rtype", "content",
                           "author", "sig"})


def _text(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True).encode("ascii")


def encode_head(wire: dict[str, Any]) -> bytes:
    """A head's compact map (``HeadInfo.to_wire``) as JSON text."""
    return _text({**wire, "id": wire["id"].hex()})


def encode_record(wire: dict[str, Any]) -> bytes:
    """A record's compact map (``Record.to_wire``) as JSON text."""
    return _text({**wire, "parents": [p.hex() for p in wire["parents"]],
                  "content": base64.b64encode(wire["content"]).decode("ascii"),
                  "sig": wire["sig"].hex()})


def _object(data: bytes, fields: frozenset[str], what: str) -> dict[str, Any]:
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RemoteProtocolError(f"{what} is not JSON text") from None
    if not isinstance(obj, dict) or set(obj) != fields:
        raise RemoteProtocolError(f"{what} must be a JSON object with exactly "
                                  f"{', '.join(sorted(fields))}")
    return obj


def _hex(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise RemoteProtocolError(f"{what} must be a hex string")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise RemoteProtocolError(f"{what} must be a hex string") from None


def decode_head(data: bytes) -> dict[str, Any]:
    """JSON text -> the compact map ``HeadInfo.from_wire`` checks."""
    obj = _object(data, HEAD_FIELDS, "head")
    return {**obj, "id": _hex(obj["id"], "head id")}


def decode_record(data: bytes) -> dict[str, Any]:
    """JSON text -> the compact map ``Record.from_wire`` checks."""
    obj = _object(data, RECORD_FIELDS, "record")
    parents = obj["parents"]
    if not isinstance(parents, list):
        raise RemoteProtocolError("record parents must be a list of hex strings")
    content = obj["content"]
    if not isinstance(content, str):
        raise RemoteProtocolError("record content must be a base64 string")
    try:
        raw = base64.b64decode(content.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error):
        raise RemoteProtocolError("record content must be a base64 string") from None
    return {**obj, "parents": [_hex(p, "record parent") for p in parents],
            "content": raw, "sig": _hex(obj["sig"], "record signature")}
