"""Channel authentication: Noise_KK_25519_ChaChaPoly_BLAKE2b, sans-I/O.

Why KK: every agent already knows every other agent's pinned key (the roster), so
both static keys are pre-messages and the handshake is one round trip
(``-> e, es, ss`` then ``<- e, ee, se``). The primitives come from PyNaCl/libsodium
(X25519, ChaCha20-Poly1305 IETF) and hashlib (BLAKE2b, HMAC); the state machine
follows the Noise specification (revision 34) and is checked against the
cacophony test vectors in ``tests/protocols/vectors/``.

Rules this module enforces:

1. Static X25519 keys are the agents' Ed25519 roster keys, converted (one pinned
   key per agent authenticates both records and connections).
2. The first handshake frame carries the initiator's agent id in clear, ahead of the
   Noise message; the responder looks that id up in the roster (unknown ids are
   refused before any crypto) and both sides put *both* ids into the Noise
   prologue, so a handshake for another pair of agents never verifies.
3. The initiator must name the responder and use its pinned key; only the holder of
   that key can produce a second message that verifies, and only the holder of the
   initiator's key can produce a first message that verifies.
4. After the handshake each direction has its own key and an implicit 64-bit
   counter nonce: a forged, altered, replayed, reordered or truncated ciphertext
   fails authentication. Any failure raises :class:`RemoteProtocolError` and leaves
   the session unusable (a channel is never resynchronised).
5. Deviation from Noise: transport messages may exceed 65535 bytes (our frame cap is
   1 MiB, see ``protocols.wire``); the AEAD has no such limit.
6. Handshake frames are accepted only at their exact sizes (frame 1: 2 + len(id) + 48
   bytes, frame 2: 48 bytes); before the handshake a transport reads no more than
   :data:`HANDSHAKE1_MAX_BYTES` (the responder) or :data:`HANDSHAKE2_BYTES`.
7. Handshake message 1 can be replayed by anyone who saw it (the responder answers
   every time); the replayer completes a handshake it cannot use (it lacks the
   initiator's keys), and the transport closes such a connection when no
   authenticated frame follows (``nodes.limits``). Keys pinned per episode make a
   message 1 of another episode fail to verify.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from dataclasses import dataclass

import msgpack
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from nacl import bindings, exceptions

from protocols.errors import LocalProtocolError, RemoteProtocolError
from protocols.identity import Identity, Roster

PROTOCOL_NAME = b"Noise_KK_25519_ChaChaPoly_BLAKE2b"
PROLOGUE_LABEL = b"planfence-testbed/channel/v1"
HELLO_VERSION = 1
MAX_AGENT_ID_BYTES = 64
DH_BYTES = 32
HASH_BYTES = 64
KEY_BYTES = 32
TAG_BYTES = 16
_MAX_NONCE = 2**64 - 1  # reserved by Noise; never used for a message
#: A handshake message with an empty payload: ephemeral key + tag.
NOISE_MESSAGE_BYTES = DH_BYTES + TAG_BYTES
#: Handshake frame bodies have exact sizes (rule 6): frame 1 = 2 + len(id) + 48 bytes.
HANDSHAKE1_MAX_BYTES = 2 + MAX_AGENT_ID_BYTES + NOISE_MESSAGE_BYTES
HANDSHAKE2_BYTES = NOISE_MESSAGE_BYTES


# --- primitives -----------------------------------------------------------------------

def _hash(data: bytes) -> bytes:
    return hashlib.blake2b(data).digest()


def _hmac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.blake2b).digest()


def _hkdf2(chaining_key: bytes, ikm: bytes) -> tuple[bytes, bytes]:
    temp = _hmac(chaining_key, ikm)
    out1 = _hmac(temp, b"\x01")
    out2 = _hmac(temp, out1 + b"\x02")
    return out1, out2


def _nonce(n: int) -> bytes:
    return b"\x00\x00\x00\x00" + n.to_bytes(8, "little")


def _dh(private: bytes, public: bytes) -> bytes:
    try:
        return bytes(bindings.crypto_scalarmult(private, public))
    except (exceptions.CryptoError, ValueError, TypeError):
        raise RemoteProtocolError("X25519 failed (low-order or malformed public key)") \
            from None


@functools.lru_cache(maxsize=4096)
def _static_dh(private: bytes, public: bytes) -> bytes:
    """``ss`` depends only on the two pinned keys, so each pair computes it once."""
    return _dh(private, public)


def x25519_public(private: bytes) -> bytes:
    return bytes(bindings.crypto_scalarmult_base(private))


@functools.lru_cache(maxsize=4096)
def x25519_from_ed25519_public(ed25519_public: bytes) -> bytes:
    """The X25519 public key matching a pinned Ed25519 verify key (cached)."""
    try:
        return bytes(bindings.crypto_sign_ed25519_pk_to_curve25519(ed25519_public))
    except (exceptions.CryptoError, ValueError, TypeError):
        raise LocalProtocolError("pinned roster key is not a valid Ed25519 point") from None


@dataclass(frozen=True)
class StaticKeys:
    """An agent's X25519 static key pair, derived once from its Ed25519 identity."""

    private: bytes
    public: bytes

    @classmethod
    def from_private(cls, private: bytes) -> StaticKeys:
        return cls(private, x25519_public(private))

    @classmethod
    def from_identity(cls, identity: Identity) -> StaticKeys:
        return _static_from_seed(identity.seed)


@functools.lru_cache(maxsize=64)
def _static_from_seed(seed: bytes) -> StaticKeys:
    _, secret = bindings.crypto_sign_seed_keypair(seed)
    return StaticKeys.from_private(bytes(bindings.crypto_sign_ed25519_sk_to_curve25519(secret)))


# --- Noise objects ----------------------------------------------------------------------

class CipherState:
    """A key and its implicit counter; one per direction after the handshake.

    The AEAD is ChaCha20-Poly1305 (IETF, RFC 8439) from ``cryptography``: the same bytes
    as libsodium's ``crypto_aead_chacha20poly1305_ietf`` (checked in
    tests/protocols/test_auth.py), at a third of the per-frame cost of the PyNaCl
    binding.
    """

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key
        self._aead = None if key is None else ChaCha20Poly1305(key)
        self._n = 0
        self._failed = False

    @property
    def has_key(self) -> bool:
        return self._key is not None

    def encrypt_with_ad(self, ad: bytes, plaintext: bytes) -> bytes:
        if self._aead is None:
            return plaintext
        if self._failed:
            raise LocalProtocolError("cipher state used after a failure")
        if self._n >= _MAX_NONCE:
            raise LocalProtocolError("nonce space exhausted; open a new channel")
        out = self._aead.encrypt(_nonce(self._n), plaintext, ad)
        self._n += 1
        return out

    def decrypt_with_ad(self, ad: bytes, ciphertext: bytes) -> bytes:
        if self._aead is None:
            return ciphertext
        if self._failed:
            raise RemoteProtocolError("channel unusable after an authentication failure")
        if self._n >= _MAX_NONCE:
            self._failed = True
            raise RemoteProtocolError("nonce space exhausted")
        if len(ciphertext) < TAG_BYTES:
            self._failed = True
            raise RemoteProtocolError("ciphertext shorter than its tag (truncated)")
        try:
            out = self._aead.decrypt(_nonce(self._n), ciphertext, ad)
        except InvalidTag:
            self._failed = True
            raise RemoteProtocolError(
                f"frame {self._n} failed authentication (forged, altered, replayed, "
                "reordered or truncated)") from None
        self._n += 1
        return out


class SymmetricState:
    def __init__(self, protocol_name: bytes) -> None:
        if len(protocol_name) <= HASH_BYTES:
            self.h = protocol_name.ljust(HASH_BYTES, b"\x00")
        else:
            self.h = _hash(protocol_name)
        self.ck = self.h
        self.cipher = CipherState()

    def mix_key(self, ikm: bytes) -> None:
        self.ck, temp_k = _hkdf2(self.ck, ikm)
        self.cipher = CipherState(temp_k[:KEY_BYTES])

    def mix_hash(self, data: bytes) -> None:
        self.h = _hash(self.h + data)

    def encrypt_and_hash(self, plaintext: bytes) -> bytes:
        ciphertext = self.cipher.encrypt_with_ad(self.h, plaintext)
        self.mix_hash(ciphertext)
        return ciphertext

    def decrypt_and_hash(self, ciphertext: bytes) -> bytes:
        plaintext = self.cipher.decrypt_with_ad(self.h, ciphertext)
        self.mix_hash(ciphertext)
        return plaintext

    def split(self) -> tuple[CipherState, CipherState]:
        k1, k2 = _hkdf2(self.ck, b"")
        return CipherState(k1[:KEY_BYTES]), CipherState(k2[:KEY_BYTES])


class Session:
    """Transport phase: one cipher per direction; any failure is final."""

    def __init__(self, peer_id: str, send: CipherState, recv: CipherState,
                 handshake_hash: bytes) -> None:
        self.peer_id = peer_id
        self.handshake_hash = handshake_hash
        self._send = send
        self._recv = recv
        self._broken = False

    def encrypt(self, plaintext: bytes) -> bytes:
        return self._send.encrypt_with_ad(b"", plaintext)

    def decrypt(self, ciphertext: bytes) -> bytes:
        if self._broken:
            raise RemoteProtocolError("channel unusable after an authentication failure")
        try:
            return self._recv.decrypt_with_ad(b"", ciphertext)
        except RemoteProtocolError:
            self._broken = True
            raise


class HandshakeKK:
    """The KK handshake state machine with explicit keys (vectors inject ephemerals)."""

    def __init__(self, *, initiator: bool, prologue: bytes, static: StaticKeys,
                 remote_static: bytes, ephemeral_private: bytes | None = None) -> None:
        self.initiator = initiator
        self._s = static
        self._rs = remote_static
        self._e = StaticKeys.from_private(ephemeral_private) if ephemeral_private else None
        self._re: bytes | None = None
        self._ss = SymmetricState(PROTOCOL_NAME)
        self._ss.mix_hash(prologue)
        init_pub, resp_pub = (static.public, remote_static) if initiator \
            else (remote_static, static.public)
        self._ss.mix_hash(init_pub)
        self._ss.mix_hash(resp_pub)
        self._step = 0
        self._failed = False

    def _fresh_ephemeral(self) -> StaticKeys:
        if self._e is None:
            self._e = StaticKeys.from_private(bytes(bindings.randombytes(DH_BYTES)))
        return self._e

    def _expect(self, step: int, writing: bool) -> None:
        ours = (step == 0) == self.initiator
        if self._failed or self._step != step or ours != writing:
            raise LocalProtocolError(f"handshake message {step + 1} out of order")

    def write_message(self, payload: bytes = b"") -> bytes:
        step = self._step
        self._expect(step, writing=True)
        ss = self._ss
        e = self._fresh_ephemeral()
        ss.mix_hash(e.public)
        if step == 0:  # -> e, es, ss
            ss.mix_key(_dh(e.private, self._rs))
            ss.mix_key(_static_dh(self._s.private, self._rs))
        else:  # <- e, ee, se
            assert self._re is not None
            ss.mix_key(_dh(e.private, self._re))
            ss.mix_key(_dh(e.private, self._rs))
        out = e.public + ss.encrypt_and_hash(payload)
        self._step += 1
        return out

    def read_message(self, message: bytes) -> bytes:
        step = self._step
        self._expect(step, writing=False)
        if len(message) < DH_BYTES + TAG_BYTES:
            self._failed = True
            raise RemoteProtocolError(f"handshake message {step + 1} too short")
        ss = self._ss
        re = message[:DH_BYTES]
        self._re = re
        ss.mix_hash(re)
        try:
            if step == 0:  # responder reads -> e, es, ss
                ss.mix_key(_dh(self._s.private, re))
                ss.mix_key(_static_dh(self._s.private, self._rs))
            else:  # initiator reads <- e, ee, se
                e = self._fresh_ephemeral()
                ss.mix_key(_dh(e.private, re))
                ss.mix_key(_dh(self._s.private, re))
            payload = ss.decrypt_and_hash(message[DH_BYTES:])
        except RemoteProtocolError as exc:
            self._failed = True
            raise RemoteProtocolError(f"handshake message {step + 1} rejected: {exc}") \
                from None
        self._step += 1
        return payload

    @property
    def complete(self) -> bool:
        return self._step == 2

    def split(self, peer_id: str) -> Session:
        if not self.complete:
            raise LocalProtocolError("handshake not complete")
        c1, c2 = self._ss.split()
        send, recv = (c1, c2) if self.initiator else (c2, c1)
        return Session(peer_id, send, recv, self._ss.h)


# --- the testbed's channel handshake ------------------------------------------------------

def channel_prologue(initiator_id: str, responder_id: str) -> bytes:
    """Both agent ids, length-delimited (msgpack), behind a version label."""
    return PROLOGUE_LABEL + msgpack.packb([initiator_id, responder_id], use_bin_type=True)


class ChannelInitiator:
    """Client side: ``first = hs.start()``; ``session = hs.finish(second)``."""

    def __init__(self, *, identity: Identity, roster: Roster, peer_id: str,
                 ephemeral_private: bytes | None = None) -> None:
        member = roster.members.get(peer_id)
        if member is None:
            raise LocalProtocolError(f"peer_id {peer_id!r} is not a roster member")
        local = identity.agent_id.encode()
        if not 0 < len(local) <= MAX_AGENT_ID_BYTES:
            raise LocalProtocolError(f"agent_id must be 1..{MAX_AGENT_ID_BYTES} bytes")
        self.peer_id = peer_id
        self._hello = bytes([HELLO_VERSION, len(local)]) + local
        self._hs = HandshakeKK(
            initiator=True, prologue=channel_prologue(identity.agent_id, peer_id),
            static=StaticKeys.from_identity(identity),
            remote_static=x25519_from_ed25519_public(member.public_key),
            ephemeral_private=ephemeral_private)

    def start(self) -> bytes:
        """Body of the first handshake frame: hello (our id) + Noise message 1."""
        return self._hello + self._hs.write_message()

    def finish(self, body: bytes) -> Session:
        """Consume the responder's frame body; raises RemoteProtocolError on failure."""
        if len(body) != HANDSHAKE2_BYTES:
            raise RemoteProtocolError(f"handshake message 2 of {len(body)} bytes; "
                                      f"expected {HANDSHAKE2_BYTES}")
        self._hs.read_message(body)
        return self._hs.split(self.peer_id)


class ChannelResponder:
    """Server side: ``reply, session = ChannelResponder(...).respond(first_body)``."""

    def __init__(self, *, identity: Identity, roster: Roster,
                 ephemeral_private: bytes | None = None) -> None:
        self._identity = identity
        self._roster = roster
        self._ephemeral = ephemeral_private
        self.peer_id: str | None = None

    def respond(self, body: bytes) -> tuple[bytes, Session]:
        if len(body) < 2 or body[0] != HELLO_VERSION:
            raise RemoteProtocolError("handshake hello has a bad version byte")
        id_len = body[1]
        if not 0 < id_len <= MAX_AGENT_ID_BYTES:
            raise RemoteProtocolError("handshake hello has a bad agent id length")
        if len(body) != 2 + id_len + NOISE_MESSAGE_BYTES:
            raise RemoteProtocolError(f"handshake message 1 of {len(body)} bytes; expected "
                                      f"{2 + id_len + NOISE_MESSAGE_BYTES}")
        try:
            peer_id = body[2:2 + id_len].decode()
        except UnicodeDecodeError:
            raise RemoteProtocolError("handshake hello agent id is not UTF-8") from None
        member = self._roster.members.get(peer_id)
        if member is None or peer_id == self._identity.agent_id:
            raise RemoteProtocolError(f"handshake from unknown peer {peer_id!r}")
        self.peer_id = peer_id
        try:
            remote_static = x25519_from_ed25519_public(member.public_key)
        except LocalProtocolError as exc:
            raise RemoteProtocolError(f"peer {peer_id!r}: {exc}") from None
        hs = HandshakeKK(
            initiator=False, prologue=channel_prologue(peer_id, self._identity.agent_id),
            static=StaticKeys.from_identity(self._identity), remote_static=remote_static,
            ephemeral_private=self._ephemeral)
        hs.read_message(body[2 + id_len:])
        reply = hs.write_message()
        return reply, hs.split(peer_id)
