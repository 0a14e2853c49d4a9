"""Errors that say whose fault it was.

``LocalProtocolError``: we (or the caller inside this process) misused an API.
``RemoteProtocolError``: a peer sent something we must reject; the connection that
carried it is closed, the node keeps serving everyone else.
``IntegrityError``: a record or head failed a digest, signature, author or owner check.
``RpcError`` and subclasses: a remote call did not produce a usable answer; every
policy turns these into a *block* (fail closed).
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base of every protocol-level error (records, wire, channel, calls, evidence)."""


class LocalProtocolError(ProtocolError):
    """This side misused the protocol (a bug or bad local input)."""


class RemoteProtocolError(ProtocolError):
    """The peer violated the protocol: malformed, oversize, forged, replayed frames."""


class IntegrityError(RemoteProtocolError):
    """A record or head failed verification (digest, signature, author, owner rule)."""


class OwnerRuleError(IntegrityError):
    """A head update broke the owner rules (wrong author, non-increasing sequence)."""


class ConflictError(OwnerRuleError):
    """Two different records claim the same (key, owner sequence)."""


class RpcError(ProtocolError):
    """A remote call failed; policies treat every RpcError as missing evidence."""


class RpcTimeout(RpcError):
    """No answer within the call's timeout."""


class PeerUnavailable(RpcError):
    """The peer could not be reached or closed the connection."""


class RemoteCallError(RpcError):
    """The peer answered with an error (e.g. unknown record ID)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
