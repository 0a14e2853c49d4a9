"""Fuzz: nothing a peer can send makes a data-plane handler fail with anything but the
peer's protocol error or an error reply (issue 11, "Peer errors always typed").

The server answers ``internal`` (and keeps the connection) only for an exception other
than RemoteProtocolError/RemoteCallError; these tests drive the real handlers over a
real SQLite store with what msgpack can carry (integers within 64 bits, floats, text,
bytes, lists and str-keyed maps), both at random and as one-field mutations of valid
requests, and check that only those two kinds come out.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodes.rpc import Handlers
from nodes.store import SqliteStore
from nodes.transport import parse_request
from protocols import wire
from protocols.errors import RemoteCallError, RemoteProtocolError
from protocols.identity import CENTRAL_ID, Identity, Member, Roster
from protocols.records import make_record

pytestmark = pytest.mark.slow

AGENTS = ["a0", "a1"]
IDS = {a: Identity.derive(a, "fuzz") for a in [*AGENTS, CENTRAL_ID]}
ROSTER = Roster.build([Member(a, i.public_key, "127.0.0.1", 1) for a, i in IDS.items()],
                      {"k000": "a0", "k001": "a1"}, AGENTS)
METHODS = ["heads", "fetch", "install", "announce", "versions", "commit", "dir_heads",
           "nope"]

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
           | st.floats(allow_nan=True) | st.text(max_size=12) | st.binary(max_size=40)
           | st.sampled_from(["k000", "k001", "a0", "a1", "probe", "plan", "review"])
           | st.just(b"\0" * 32) | st.just(b"\0" * 64))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=4)
                      | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=12)


def _valid_record(seq: int = 2) -> dict[str, Any]:
    return make_record(IDS["a1"], key="k001", owner="a1", seq=seq, parents=[],
                       rtype="requirement", content=b"x").to_wire()


def _valid_params(method: str) -> dict[str, Any]:
    head = {"key": "k001", "owner": "a1", "seq": 3, "id": b"\1" * 32}
    return {"heads": {"keys": ["k000"]}, "fetch": {"id": b"\2" * 32},
            "install": {"records": [_valid_record()]}, "announce": {"heads": [head]},
            "versions": {"keys": ["k001"]}, "commit": {"heads": [head]},
            "dir_heads": {"keys": ["k001"]}, "nope": {}}[method]


def _mutate(obj: Any, path: list[int], value: Any) -> Any:
    """Replace one leaf or field of ``obj`` (chosen by ``path``) with ``value``."""
    if not path or not isinstance(obj, (dict, list)) or not obj:
        return value
    if isinstance(obj, dict):
        key = sorted(obj)[path[0] % len(obj)]
        return {**obj, key: _mutate(obj[key], path[1:], value)}
    i = path[0] % len(obj)
    return [*obj[:i], _mutate(obj[i], path[1:], value), *obj[i + 1:]]


def _run(method: str, peer: str, params: Any) -> None:
    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            for agent in ("a0", CENTRAL_ID):
                store = SqliteStore(Path(tmp) / f"{agent}.sqlite", agent_id=agent,
                                    roster=ROSTER, durability="normal")
                store.install(make_record(IDS["a0"], key="k000", owner="a0", seq=1,
                                          parents=[], rtype="requirement", content=b"v"))
                handlers = Handlers(agent_id=agent, store=store, roster=ROSTER)
                try:
                    await handlers(peer, method, params)
                except (RemoteProtocolError, RemoteCallError):
                    pass
                finally:
                    store.close()

    trio.run(main)


FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(method=st.sampled_from(METHODS), peer=st.sampled_from(["a1", "probe", "a0"]),
       params=values)
def test_random_params_never_escape_as_internal(method: str, peer: str, params: Any) -> None:
    _run(method, peer, params)


@FUZZ
@given(method=st.sampled_from(METHODS), peer=st.sampled_from(["a1", "a0"]),
       path=st.lists(st.integers(min_value=0, max_value=7), max_size=5), value=values)
def test_mutated_valid_requests_never_escape_as_internal(method: str, peer: str,
                                                         path: list[int], value: Any) -> None:
    _run(method, peer, _mutate(_valid_params(method), path, value))


other_types = (st.lists(scalars, max_size=3) | st.dictionaries(st.text(max_size=4), scalars,
                                                               max_size=3)
               | st.integers(min_value=2**63 - 2, max_value=2**64 - 1)
               | st.integers(min_value=-(2**63), max_value=-1) | st.floats() | st.none())


@FUZZ
@given(method=st.sampled_from(["install", "announce", "commit"]),
       field_index=st.integers(min_value=0, max_value=7), value=other_types)
def test_each_field_of_a_valid_request_with_another_type(method: str, field_index: int,
                                                         value: Any) -> None:
    """Every record/head field in turn replaced by a value of another type or range."""
    params = _valid_params(method)
    items = params["records"] if method == "install" else params["heads"]
    fields = sorted(items[0])
    items[0] = {**items[0], fields[field_index % len(fields)]: value}
    _run(method, "a1", params)


@FUZZ
@given(data=st.binary(max_size=256) | values.map(
    lambda v: msgpack.packb(v, use_bin_type=True)))
def test_any_frame_body_decodes_to_plain_data_or_a_protocol_error(data: bytes) -> None:
    with contextlib.suppress(RemoteProtocolError):
        parse_request(wire.unpack(data))
