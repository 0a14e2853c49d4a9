"""The data plane's frame bytes, exactly as the transport writes them (no I/O).

A frame is the 4-byte length prefix and its body (``protocols.wire``). The channel
handshake sends two unsealed bodies: hello (version, id length, id) + Noise message 1,
then Noise message 2 (``protocols.auth`` rule 6). Every later body is a msgpack map
(``nodes.transport.pack_body``: requests ``{"i", "m", "p"}``, answers ``{"i", "r"}`` or
``{"i", "e"}``) sealed with a 16-byte tag. The bodies are packed here with the
transport's own encoder, so the sizes are the testbed's, byte for byte.
"""

from __future__ import annotations

from typing import Any

from nodes.transport import error_body, pack_body
from protocols.auth import HANDSHAKE2_BYTES, NOISE_MESSAGE_BYTES, TAG_BYTES
from protocols.wire import PREFIX_BYTES


def handshake1_bytes(initiator_id: str) -> int:
    """Frame 1 of the channel handshake sent by INITIATOR_ID."""
    return PREFIX_BYTES + 2 + len(initiator_id.encode()) + NOISE_MESSAGE_BYTES


HANDSHAKE2_FRAME_BYTES = PREFIX_BYTES + HANDSHAKE2_BYTES


def sealed_bytes(body: bytes) -> int:
    return PREFIX_BYTES + len(body) + TAG_BYTES


def request_bytes(rid: int, method: str, params: dict[str, Any]) -> int:
    return sealed_bytes(pack_body({"i": rid, "m": method, "p": params}))


def answer_bytes(rid: int, result: Any) -> int:
    return sealed_bytes(pack_body({"i": rid, "r": result}))


def error_bytes(rid: int, code: str, message: str) -> int:
    return sealed_bytes(error_body(rid, code, message))
