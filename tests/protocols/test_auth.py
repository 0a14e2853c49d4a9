"""Channel handshake and per-frame AEAD (protocols.auth)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols import auth, wire
from protocols.errors import LocalProtocolError, RemoteProtocolError
from protocols.identity import Identity, Member, Roster

VECTORS = Path(__file__).parent / "vectors" / "noise_kk_25519_chachapoly_blake2b.json"
AGENTS = ("agent-0", "agent-1", "agent-2")


def make_roster(identities: dict[str, Identity]) -> Roster:
    return Roster.build([Member(a, i.public_key, "127.0.0.1", 1) for a, i in identities.items()],
                        {}, list(identities))


@pytest.fixture
def team() -> dict[str, Identity]:
    return {a: Identity.derive(a, "auth-tests") for a in AGENTS}


@pytest.fixture
def roster(team: dict[str, Identity]) -> Roster:
    return make_roster(team)


def connect(team: dict[str, Identity], roster: Roster, client: str = "agent-0",
            server: str = "agent-1") -> tuple[auth.Session, auth.Session]:
    initiator = auth.ChannelInitiator(identity=team[client], roster=roster, peer_id=server)
    reply, server_session = auth.ChannelResponder(identity=team[server], roster=roster) \
        .respond(initiator.start())
    return initiator.finish(reply), server_session


# --- published test vectors ------------------------------------------------------------------

def load_vectors() -> list[dict[str, Any]]:
    vectors: list[dict[str, Any]] = json.loads(VECTORS.read_text())["vectors"]
    return vectors


@pytest.mark.parametrize("vector", load_vectors(), ids=lambda v: v["name"])
def test_cacophony_vector(vector: dict[str, Any]) -> None:
    assert vector["name"] == auth.PROTOCOL_NAME.decode()
    h = bytes.fromhex
    initiator = auth.HandshakeKK(
        initiator=True, prologue=h(vector["init_prologue"]),
        static=auth.StaticKeys.from_private(h(vector["init_static"])),
        remote_static=h(vector["init_remote_static"]),
        ephemeral_private=h(vector["init_ephemeral"]))
    responder = auth.HandshakeKK(
        initiator=False, prologue=h(vector["resp_prologue"]),
        static=auth.StaticKeys.from_private(h(vector["resp_static"])),
        remote_static=h(vector["resp_remote_static"]),
        ephemeral_private=h(vector["resp_ephemeral"]))
    messages = vector["messages"]
    for sender, receiver, msg in ((initiator, responder, messages[0]),
                                  (responder, initiator, messages[1])):
        ciphertext = sender.write_message(h(msg["payload"]))
        assert ciphertext.hex() == msg["ciphertext"]
        assert receiver.read_message(ciphertext) == h(msg["payload"])
    assert initiator.complete
    assert responder.complete
    to_resp, to_init = initiator.split("resp"), responder.split("init")
    assert to_resp.handshake_hash == to_init.handshake_hash
    for n, msg in enumerate(messages[2:]):
        sender_s, receiver_s = (to_resp, to_init) if n % 2 == 0 else (to_init, to_resp)
        ciphertext = sender_s.encrypt(h(msg["payload"]))
        assert ciphertext.hex() == msg["ciphertext"]
        assert receiver_s.decrypt(ciphertext) == h(msg["payload"])


def test_static_keys_follow_the_ed25519_identity(team: dict[str, Identity]) -> None:
    identity = team["agent-0"]
    keys = auth.StaticKeys.from_identity(identity)
    assert keys.public == auth.x25519_from_ed25519_public(identity.public_key)
    assert keys.public == auth.x25519_public(keys.private)


# --- the channel handshake ---------------------------------------------------------------------

def test_handshake_gives_matching_sessions(team: dict[str, Identity], roster: Roster) -> None:
    client, server = connect(team, roster)
    assert client.peer_id == "agent-1"
    assert server.peer_id == "agent-0"
    assert client.handshake_hash == server.handshake_hash
    for n in range(3):
        assert server.decrypt(client.encrypt(b"req %d" % n)) == b"req %d" % n
        assert client.decrypt(server.encrypt(b"resp %d" % n)) == b"resp %d" % n


def test_directions_use_different_keys(team: dict[str, Identity], roster: Roster) -> None:
    client, _server = connect(team, roster)
    reflected = client.encrypt(b"ping")
    with pytest.raises(RemoteProtocolError):
        client.decrypt(reflected)  # a frame bounced back to its sender never verifies


def test_two_handshakes_give_different_keys(team: dict[str, Identity], roster: Roster) -> None:
    first, _ = connect(team, roster)
    _, second_server = connect(team, roster)
    with pytest.raises(RemoteProtocolError):
        second_server.decrypt(first.encrypt(b"from another connection"))


def test_initiator_with_a_wrong_pinned_key_is_rejected(team: dict[str, Identity],
                                                       roster: Roster) -> None:
    wrong = dict(roster.members)
    wrong["agent-1"] = Member("agent-1", team["agent-2"].public_key, "127.0.0.1", 1)
    client_view = Roster.build(wrong.values(), {}, AGENTS)
    initiator = auth.ChannelInitiator(identity=team["agent-0"], roster=client_view,
                                      peer_id="agent-1")
    with pytest.raises(RemoteProtocolError, match="message 1"):
        auth.ChannelResponder(identity=team["agent-1"], roster=roster).respond(initiator.start())


def test_impostor_initiator_is_rejected(team: dict[str, Identity], roster: Roster) -> None:
    impostor = Identity("agent-0", Identity.derive("agent-0", "other-campaign").seed)
    initiator = auth.ChannelInitiator(identity=impostor, roster=roster, peer_id="agent-1")
    with pytest.raises(RemoteProtocolError, match="message 1"):
        auth.ChannelResponder(identity=team["agent-1"], roster=roster).respond(initiator.start())


def test_member_claiming_another_members_id_is_rejected(team: dict[str, Identity],
                                                        roster: Roster) -> None:
    liar = Identity("agent-2", team["agent-0"].seed)  # agent-0's key, agent-2's name
    initiator = auth.ChannelInitiator(identity=liar, roster=roster, peer_id="agent-1")
    with pytest.raises(RemoteProtocolError):
        auth.ChannelResponder(identity=team["agent-1"], roster=roster).respond(initiator.start())


def test_impostor_responder_cannot_answer(team: dict[str, Identity], roster: Roster) -> None:
    initiator = auth.ChannelInitiator(identity=team["agent-0"], roster=roster, peer_id="agent-1")
    impostor = Identity("agent-1", team["agent-2"].seed)  # agent-1's name, not its key
    with pytest.raises(RemoteProtocolError, match="message 1"):
        auth.ChannelResponder(identity=impostor, roster=roster).respond(initiator.start())


def test_replayed_second_message_is_rejected(team: dict[str, Identity], roster: Roster) -> None:
    """A genuine reply recorded from another handshake does not complete this one."""
    earlier = auth.ChannelInitiator(identity=team["agent-0"], roster=roster, peer_id="agent-1")
    recorded, _ = auth.ChannelResponder(identity=team["agent-1"], roster=roster) \
        .respond(earlier.start())
    victim = auth.ChannelInitiator(identity=team["agent-0"], roster=roster, peer_id="agent-1")
    victim.start()
    with pytest.raises(RemoteProtocolError, match="message 2"):
        victim.finish(recorded)


def test_unknown_peer_is_rejected(team: dict[str, Identity], roster: Roster) -> None:
    outsider = Identity.derive("mallory", "auth-tests")
    extended = make_roster({**team, "mallory": outsider})
    initiator = auth.ChannelInitiator(identity=outsider, roster=extended, peer_id="agent-1")
    with pytest.raises(RemoteProtocolError, match="unknown peer 'mallory'"):
        auth.ChannelResponder(identity=team["agent-1"], roster=roster).respond(initiator.start())


def test_responder_refuses_its_own_id(team: dict[str, Identity], roster: Roster) -> None:
    initiator = auth.ChannelInitiator(identity=team["agent-1"], roster=roster, peer_id="agent-1")
    with pytest.raises(RemoteProtocolError, match="unknown peer"):
        auth.ChannelResponder(identity=team["agent-1"], roster=roster).respond(initiator.start())


def test_initiator_needs_a_roster_member(team: dict[str, Identity], roster: Roster) -> None:
    with pytest.raises(LocalProtocolError, match="peer_id"):
        auth.ChannelInitiator(identity=team["agent-0"], roster=roster, peer_id="nobody")


def test_altered_second_message_is_rejected(team: dict[str, Identity], roster: Roster) -> None:
    initiator = auth.ChannelInitiator(identity=team["agent-0"], roster=roster, peer_id="agent-1")
    reply, _ = auth.ChannelResponder(identity=team["agent-1"], roster=roster) \
        .respond(initiator.start())
    with pytest.raises(RemoteProtocolError):
        initiator.finish(reply[:-1] + bytes([reply[-1] ^ 1]))


@settings(derandomize=True, deadline=None, max_examples=300)
@given(body=st.binary(max_size=120))
def test_responder_on_garbage_raises_only_remote_error(body: bytes) -> None:
    team = {a: Identity.derive(a, "auth-tests") for a in AGENTS}
    with pytest.raises(RemoteProtocolError):
        auth.ChannelResponder(identity=team["agent-1"], roster=make_roster(team)).respond(body)


# --- transport frames ----------------------------------------------------------------------------

def test_altered_frame_is_rejected_and_session_stays_dead(team: dict[str, Identity],
                                                          roster: Roster) -> None:
    client, server = connect(team, roster)
    good = client.encrypt(b"first")
    bad = bytearray(good)
    bad[0] ^= 0x80
    with pytest.raises(RemoteProtocolError, match="authentication"):
        server.decrypt(bytes(bad))
    with pytest.raises(RemoteProtocolError, match="unusable"):
        server.decrypt(good)  # even the genuine frame: the channel is closed for good


def test_replayed_frame_is_rejected(team: dict[str, Identity], roster: Roster) -> None:
    client, server = connect(team, roster)
    frame = client.encrypt(b"pay once")
    assert server.decrypt(frame) == b"pay once"
    with pytest.raises(RemoteProtocolError):
        server.decrypt(frame)


def test_reordered_frames_are_rejected(team: dict[str, Identity], roster: Roster) -> None:
    client, server = connect(team, roster)
    first, second = client.encrypt(b"1"), client.encrypt(b"2")
    with pytest.raises(RemoteProtocolError):
        server.decrypt(second)
    with pytest.raises(RemoteProtocolError):
        server.decrypt(first)


def test_dropped_frame_is_detected(team: dict[str, Identity], roster: Roster) -> None:
    client, server = connect(team, roster)
    client.encrypt(b"lost")
    with pytest.raises(RemoteProtocolError):
        server.decrypt(client.encrypt(b"after the gap"))


@pytest.mark.parametrize("keep", [0, 1, 15, 16, 20])
def test_truncated_frame_is_rejected(team: dict[str, Identity], roster: Roster,
                                     keep: int) -> None:
    client, server = connect(team, roster)
    frame = client.encrypt(b"a body of some length")
    with pytest.raises(RemoteProtocolError):
        server.decrypt(frame[:keep])


@settings(derandomize=True, deadline=None, max_examples=200)
@given(data=st.binary(max_size=400))
def test_no_garbage_frame_survives_decoder_and_channel(data: bytes) -> None:
    """Whatever bytes arrive, the frames they form never authenticate."""
    team = {a: Identity.derive(a, "auth-tests") for a in AGENTS}
    _, server = connect(team, make_roster(team))
    try:
        bodies = wire.FrameDecoder().feed(data)
    except RemoteProtocolError:
        return
    for body in bodies:
        with pytest.raises(RemoteProtocolError):
            server.decrypt(body)


@settings(max_examples=200, deadline=None)
@given(key=st.binary(min_size=32, max_size=32), plaintext=st.binary(max_size=2048),
       ad=st.binary(max_size=64), frames=st.integers(min_value=0, max_value=3))
def test_cipher_state_matches_libsodium_ietf_aead(key: bytes, plaintext: bytes, ad: bytes,
                                                  frames: int) -> None:
    """The transport AEAD gives libsodium's ChaCha20-Poly1305 IETF bytes, nonce n after
    n frames, and opens them again (what peers of an older build sent and expect)."""
    from nacl import bindings

    sender, receiver = auth.CipherState(key), auth.CipherState(key)
    for _ in range(frames):
        receiver.decrypt_with_ad(b"", sender.encrypt_with_ad(b"", b"x"))
    sealed = sender.encrypt_with_ad(ad, plaintext)
    nonce = bytes(4) + frames.to_bytes(8, "little")
    assert sealed == bindings.crypto_aead_chacha20poly1305_ietf_encrypt(plaintext, ad,
                                                                        nonce, key)
    assert receiver.decrypt_with_ad(ad, sealed) == plaintext
