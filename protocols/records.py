"""Immutable public records, their canonical encoding, IDs and signatures.

Rules this module enforces:

1. A record's ID is BLAKE2b-256 (personalised) over the canonical msgpack encoding
   of every field but the signature, so an ID binds key, owner, sequence, exact
   parents, type, content and author. Two records with equal IDs are equal.
2. The author signs the ID with Ed25519; verification checks the ID recomputed from
   the fields, the signature under the author's pinned key, and that the author is
   the key's declared owner (single writer per key).
3. Decoding from the wire accepts exactly the documented field types and sizes;
   anything else is a :class:`RemoteProtocolError`, never a crash.
4. A :class:`HeadInfo` is the metadata envelope of a record (what owners return
   for head queries and what announcements carry): no content, but the ID, so a
   consumer can fetch the exact record and verify it against the ID it was told.
5. On the wire a record or head entry is a compact msgpack map (``"msgpack"``, the
   default) or JSON text (``"json"``, ``protocols.record_json``). The encoding a node
   sends is one setting of its process (:func:`set_wire_encoding`, from ``configure``);
   ``to_wire`` may name one explicitly. ``from_wire`` accepts either form. IDs and
   signatures never depend on it: they are over the canonical msgpack (rule 1).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
from nacl.exceptions import BadSignatureError

from protocols import record_json
from protocols.errors import IntegrityError, OwnerRuleError, RemoteProtocolError
from protocols.identity import Identity, Roster

RECORD_ID_BYTES = 32
MAX_CONTENT_BYTES = 384 * 1024  # artifacts are 256-320 KiB; compact records <= 4 KiB
MAX_PARENTS = 256
MAX_RECORDS_PER_INSTALL = 64  # records one `install` call may carry
MAX_KEY_CHARS = 200
MAX_SEQ = 2**63 - 1  # SQLite INTEGER; a larger sequence is the peer's protocol error
RECORD_TYPES = frozenset({"requirement", "review", "plan", "decision", "artifact", "action"})
_ID_PERSON = b"pf-record-v1"
_FORMAT_VERSION = 1
WIRE_ENCODINGS: tuple[str, ...] = ("msgpack", "json")
_wire = {"encoding": "msgpack"}  # this process's setting (rule 5)


def set_wire_encoding(encoding: str) -> None:
    """How this process sends records and head entries from now on (rule 5)."""
    if encoding not in WIRE_ENCODINGS:
        raise ValueError(f"wire_encoding: {encoding!r} is not one of "
                         f"{', '.join(WIRE_ENCODINGS)}")
    _wire["encoding"] = encoding


def wire_encoding() -> str:
    return _wire["encoding"]


def _digest(encoded: bytes) -> bytes:
    return hashlib.blake2b(encoded, digest_size=RECORD_ID_BYTES, person=_ID_PERSON).digest()


@dataclass(frozen=True)
class Record:
    key: str
    owner: str
    seq: int
    parents: tuple[bytes, ...]
    rtype: str
    content: bytes
    author: str
    signature: bytes = b""

    def canonical(self) -> bytes:
        """Canonical encoding of every field but the signature (the signed bytes)."""
        body = [_FORMAT_VERSION, self.key, self.owner, self.seq, list(self.parents),
                self.rtype, self.content, self.author]
        return msgpack.packb(body, use_bin_type=True)

    @property
    def id(self) -> bytes:
        cached = self.__dict__.get("_id")
        if cached is None:
            cached = _digest(self.canonical())
            object.__setattr__(self, "_id", cached)
        return cached

    @property
    def head(self) -> HeadInfo:
        return HeadInfo(self.key, self.owner, self.seq, self.id)

    def to_wire(self, encoding: str | None = None) -> Any:
        """The wire form (rule 5): a map, or JSON text under ``"json"``."""
        wire = {"key": self.key, "owner": self.owner, "seq": self.seq,
                "parents": list(self.parents), "rtype": self.rtype,
                "content": self.content, "author": self.author, "sig": self.signature}
        if (encoding or _wire["encoding"]) == "json":
            return record_json.encode_record(wire)
        return wire

    @classmethod
    def from_wire(cls, d: object) -> Record:
        """Decode a peer-supplied record, checking types and sizes (not signatures)."""
        if isinstance(d, bytes):
            d = record_json.decode_record(d)
        if not isinstance(d, Mapping):
            raise RemoteProtocolError("record is not a map")
        try:
            key, owner, seq = d["key"], d["owner"], d["seq"]
            parents, rtype, content = d["parents"], d["rtype"], d["content"]
            author, sig = d["author"], d["sig"]
        except KeyError as exc:
            raise RemoteProtocolError(f"record lacks field {exc.args[0]!r}") from None
        if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS:
            raise RemoteProtocolError("record key must be a non-empty string")
        if not isinstance(owner, str) or not isinstance(author, str):
            raise RemoteProtocolError("record owner/author must be strings")
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= MAX_SEQ:
            raise RemoteProtocolError("record seq must be a non-negative integer")
        if not isinstance(parents, (list, tuple)) or len(parents) > MAX_PARENTS or not all(
                isinstance(p, bytes) and len(p) == RECORD_ID_BYTES for p in parents):
            raise RemoteProtocolError("record parents must be a list of 32-byte IDs")
        if not isinstance(rtype, str) or rtype not in RECORD_TYPES:
            raise RemoteProtocolError(f"unknown record type {str(rtype)[:80]!r}")
        if not isinstance(content, bytes) or len(content) > MAX_CONTENT_BYTES:
            raise RemoteProtocolError("record content must be bytes within the size cap")
        if not isinstance(sig, bytes) or len(sig) != 64:
            raise RemoteProtocolError("record signature must be 64 bytes")
        return cls(key, owner, seq, tuple(parents), rtype, content, author, sig)


@dataclass(frozen=True)
class HeadInfo:
    """Metadata envelope of a record: enough to compare and to fetch, no content."""

    key: str
    owner: str
    seq: int
    record_id: bytes

    def to_wire(self, encoding: str | None = None) -> Any:
        """The wire form (rule 5): a map, or JSON text under ``"json"``."""
        wire = {"key": self.key, "owner": self.owner, "seq": self.seq, "id": self.record_id}
        if (encoding or _wire["encoding"]) == "json":
            return record_json.encode_head(wire)
        return wire

    @classmethod
    def from_wire(cls, d: object) -> HeadInfo:
        if isinstance(d, bytes):
            d = record_json.decode_head(d)
        if not isinstance(d, Mapping):
            raise RemoteProtocolError("head is not a map")
        key, owner, seq, rid = d.get("key"), d.get("owner"), d.get("seq"), d.get("id")
        if not (isinstance(key, str) and 0 < len(key) <= MAX_KEY_CHARS
                and isinstance(owner, str) and isinstance(seq, int)
                and not isinstance(seq, bool) and 0 <= seq <= MAX_SEQ
                and isinstance(rid, bytes) and len(rid) == RECORD_ID_BYTES):
            raise RemoteProtocolError("malformed head envelope")
        return cls(key, owner, seq, rid)


def make_record(identity: Identity, *, key: str, owner: str, seq: int,
                parents: Sequence[bytes], rtype: str, content: bytes) -> Record:
    """Create and sign a record authored by ``identity``."""
    unsigned = Record(key, owner, seq, tuple(parents), rtype, content, identity.agent_id)
    return Record(key, owner, seq, tuple(parents), rtype, content, identity.agent_id,
                  identity.sign(unsigned.id))


def verify_record(record: Record, roster: Roster, *, expected_id: bytes | None = None) -> None:
    """Check digest binding, author signature and the single-writer rule.

    Raises :class:`IntegrityError` (or :class:`OwnerRuleError`) on any failure.
    """
    rid = record.id
    if expected_id is not None and rid != expected_id:
        raise IntegrityError("record digest does not match the requested ID")
    # A record is immutable and a roster is never changed in place, so a signature this
    # record object passed under this roster object passes again: remember it (like the
    # digest), so a fetched record is not verified twice on its way into the store.
    if record.__dict__.get("_signature_verified_by") is not roster:
        try:
            verify_key = roster.verify_key(record.author)
        except KeyError:
            raise IntegrityError(f"record author {record.author!r} is not in the "
                                 f"roster") from None
        try:
            verify_key.verify(rid, record.signature)
        except BadSignatureError:
            raise IntegrityError("record signature does not verify") from None
        object.__setattr__(record, "_signature_verified_by", roster)
    declared = roster.owners.get(record.key)
    if declared is not None and declared != record.owner:
        raise OwnerRuleError(f"record names owner {record.owner!r} but {record.key!r} "
                             f"belongs to {declared!r}")
    if record.author != record.owner:
        raise OwnerRuleError(f"record of {record.key!r} authored by {record.author!r}, "
                             f"not its owner {record.owner!r}")
