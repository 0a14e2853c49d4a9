"""Frame codec and msgpack limits (protocols.wire)."""

from __future__ import annotations

import itertools

import msgpack
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols import wire
from protocols.errors import LocalProtocolError, RemoteProtocolError
from protocols.identity import Identity
from protocols.records import make_record


def frames_of(bodies: list[bytes]) -> bytes:
    return b"".join(wire.encode_frame(b) for b in bodies)


# --- framing -------------------------------------------------------------------------------

def test_encode_frame_prefix_is_big_endian_length() -> None:
    assert wire.encode_frame(b"abc") == b"\x00\x00\x00\x03abc"


@pytest.mark.parametrize("size", [0, wire.MAX_FRAME_BYTES + 1])
def test_encode_frame_refuses_empty_or_oversize(size: int) -> None:
    with pytest.raises(LocalProtocolError):
        wire.encode_frame(b"x" * size)


def test_decoder_accepts_frame_of_exactly_the_cap() -> None:
    body = b"\x5a" * wire.MAX_FRAME_BYTES
    assert wire.FrameDecoder().feed(wire.encode_frame(body)) == [body]


def test_decoder_rejects_oversize_prefix_before_any_body_byte() -> None:
    decoder = wire.FrameDecoder()
    prefix = (wire.MAX_FRAME_BYTES + 1).to_bytes(4, "big")
    assert decoder.feed(prefix[:3]) == []
    with pytest.raises(RemoteProtocolError, match="prefix"):
        decoder.feed(prefix[3:])  # no body byte sent yet


def test_decoder_rejects_zero_prefix() -> None:
    with pytest.raises(RemoteProtocolError, match="prefix 0"):
        wire.FrameDecoder().feed(b"\x00\x00\x00\x00")


def test_decoder_is_unusable_after_an_error() -> None:
    decoder = wire.FrameDecoder()
    with pytest.raises(RemoteProtocolError):
        decoder.feed(b"\xff\xff\xff\xff")
    with pytest.raises(RemoteProtocolError, match="unusable"):
        decoder.feed(wire.encode_frame(b"fine"))


def test_decoder_close_inside_a_frame_is_truncation() -> None:
    decoder = wire.FrameDecoder()
    decoder.feed(wire.encode_frame(b"hello")[:-1])
    with pytest.raises(RemoteProtocolError, match="ended inside a frame"):
        decoder.close()


def test_decoder_close_at_boundary_is_clean() -> None:
    decoder = wire.FrameDecoder()
    assert decoder.feed(wire.encode_frame(b"hello")) == [b"hello"]
    decoder.close()


def test_custom_cap_is_honoured() -> None:
    decoder = wire.FrameDecoder(max_frame_bytes=8)
    assert decoder.feed(wire.encode_frame(b"12345678")) == [b"12345678"]
    with pytest.raises(RemoteProtocolError):
        decoder.feed(wire.encode_frame(b"123456789"))


@settings(derandomize=True, deadline=None)
@given(bodies=st.lists(st.binary(min_size=1, max_size=300), max_size=20),
       cuts=st.lists(st.integers(min_value=0, max_value=7000), max_size=12))
def test_decoder_reassembles_any_chunking(bodies: list[bytes], cuts: list[int]) -> None:
    stream = frames_of(bodies)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    decoder = wire.FrameDecoder()
    out: list[bytes] = []
    for start, end in itertools.pairwise(points):
        out.extend(decoder.feed(stream[start:end]))
    decoder.close()
    assert out == bodies
    assert decoder.buffered_bytes == 0


@settings(derandomize=True, deadline=None, max_examples=300)
@given(chunks=st.lists(st.binary(max_size=64), max_size=20))
def test_decoder_on_garbage_returns_frames_or_raises_remote_error(chunks: list[bytes]) -> None:
    decoder = wire.FrameDecoder(max_frame_bytes=64)
    total = 0
    try:
        for chunk in chunks:
            for body in decoder.feed(chunk):
                assert 0 < len(body) <= 64
                total += wire.PREFIX_BYTES + len(body)
        decoder.close()
    except RemoteProtocolError:
        return
    assert total == sum(len(c) for c in chunks)  # a clean end means every byte was framed


async def test_read_frame_over_a_stream() -> None:
    send, receive = trio.testing.memory_stream_one_way_pair()
    decoder = wire.FrameDecoder()
    await send.send_all(frames_of([b"one", b"two"]) + wire.encode_frame(b"three")[:5])
    assert await wire.read_frame(receive, decoder) == b"one"
    assert await wire.read_frame(receive, decoder) == b"two"
    await send.send_all(wire.encode_frame(b"three")[5:])
    assert await wire.read_frame(receive, decoder) == b"three"
    await send.aclose()
    assert await wire.read_frame(receive, decoder) is None


async def test_read_frame_reports_truncated_stream() -> None:
    send, receive = trio.testing.memory_stream_one_way_pair()
    await send.send_all(wire.encode_frame(b"three")[:6])
    await send.aclose()
    with pytest.raises(RemoteProtocolError, match="ended inside a frame"):
        await wire.read_frame(receive, wire.FrameDecoder())


# --- msgpack bodies --------------------------------------------------------------------------

def test_pack_unpack_round_trip() -> None:
    obj = {"i": 7, "m": "heads", "p": {"keys": ["k000", "k001"], "id": b"\x01" * 32,
                                        "x": None, "f": 1.5, "t": True}}
    assert wire.unpack(wire.pack(obj)) == obj


def test_artifact_record_fits_in_one_frame() -> None:
    record = make_record(Identity.derive("agent-0", 1), key="art/1", owner="agent-0", seq=1,
                         parents=[b"\x00" * 32] * 4, rtype="artifact",
                         content=bytes(320 * 1024))
    body = wire.pack({"i": 1, "m": "install", "p": {"records": [record.to_wire()]}})
    frame = wire.encode_frame(body)
    assert wire.FrameDecoder().feed(frame) == [body]
    assert wire.unpack(body)["p"]["records"][0]["content"] == record.content


def test_pack_refuses_unencodable_and_oversize() -> None:
    with pytest.raises(LocalProtocolError):
        wire.pack({"x": object()})
    with pytest.raises(LocalProtocolError):
        wire.pack(b"x" * wire.MAX_FRAME_BYTES)


@pytest.mark.parametrize(("body", "why"), [
    (b"\xc1", "reserved byte"),
    (b"\x92\x01", "truncated array"),
    (msgpack.packb(1) + msgpack.packb(2), "trailing data"),
    (msgpack.packb({1: "int key"}), "int key at top"),
    (msgpack.packb({"a": [{b"k": 1}]}, use_bin_type=True), "bytes key nested"),
    (msgpack.packb({"a": {(1, 2): 1}}), "array key nested"),
    (msgpack.packb(msgpack.ExtType(5, b"x")), "ext type"),
    (b"\xd6\xff\x00\x00\x00\x01", "timestamp ext"),
    (b"\xa2\xff\xfe", "invalid utf-8"),
    (msgpack.packb("s" * (wire.MAX_STR_BYTES + 1)), "string too long"),
    (msgpack.packb([0] * (wire.MAX_ARRAY_ITEMS + 1)), "array too long"),
    (msgpack.packb({f"k{i}": 0 for i in range(wire.MAX_MAP_ITEMS + 1)}), "map too long"),
    (b"\x91" * (wire.MAX_DEPTH + 1) + b"\x00", "too deep"),
    (b"\xdd\xff\xff\xff\xff", "huge declared array"),
    (b"\xc6\x7f\xff\xff\xff", "huge declared bin"),
])
def test_unpack_rejects(body: bytes, why: str) -> None:
    with pytest.raises(RemoteProtocolError):
        wire.unpack(body)


def test_unpack_accepts_limits_exactly() -> None:
    obj = {"s": "s" * wire.MAX_STR_BYTES, "a": [0] * wire.MAX_ARRAY_ITEMS}
    assert wire.unpack(wire.pack(obj)) == obj
    nested: object = 0
    for _ in range(wire.MAX_DEPTH):
        nested = [nested]
    assert wire.unpack(wire.pack(nested)) == nested


def test_unpack_rejects_body_over_the_cap() -> None:
    with pytest.raises(RemoteProtocolError):
        wire.unpack(b"\xc0" * (wire.MAX_FRAME_BYTES + 1))


_PLAIN = (type(None), bool, int, float, str, bytes, list, dict)


def _all_plain(obj: object) -> bool:
    if isinstance(obj, list):
        return all(_all_plain(x) for x in obj)
    if isinstance(obj, dict):
        return all(isinstance(k, str) and _all_plain(v) for k, v in obj.items())
    return isinstance(obj, _PLAIN)


@settings(derandomize=True, deadline=None, max_examples=500)
@given(body=st.binary(max_size=200))
def test_unpack_garbage_is_plain_data_or_remote_error(body: bytes) -> None:
    try:
        obj = wire.unpack(body)
    except RemoteProtocolError:
        return
    assert _all_plain(obj)


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30)


@settings(derandomize=True, deadline=None)
@given(obj=json_like)
def test_pack_unpack_round_trip_property(obj: object) -> None:
    assert wire.unpack(wire.pack(obj)) == obj
