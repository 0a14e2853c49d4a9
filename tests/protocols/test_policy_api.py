"""The public policy API without processes: body schemas, parameters, the registry's
refusals, and policy-defined methods on the in-memory team."""

from __future__ import annotations

from typing import Any

import pytest

from protocols.api import (
    Any_,
    Bool,
    Bytes,
    Head,
    Int,
    List,
    Map,
    Optional,
    Param,
    ParamError,
    Policy,
    RemoteProtocolError,
    Rpc,
    SchemaError,
    Str,
    make_policy,
    register,
    unregister,
)
from protocols.policies.registry import normal_spec, rpc_named
from protocols.policy_params import split_spec
from protocols.policy_rpc import MemoryState, PolicyContext, PolicyFault, serve
from protocols.records import HeadInfo
from tests.protocols.memory_env import MemoryTeam

BODY = Map({"n": Int(0, 10), "tag": Str(max_len=4), "blob": Optional(Bytes(max_len=8)),
            "xs": List(Bool(), max_len=2)})


def test_a_schema_accepts_exactly_what_it_describes() -> None:
    assert BODY.check({"n": 3, "tag": "ab", "xs": [True]}, "m") == \
        {"n": 3, "tag": "ab", "xs": [True]}
    assert BODY.check({"n": 0, "tag": "", "blob": b"x", "xs": []}, "m")["blob"] == b"x"


@pytest.mark.parametrize(("body", "where"), [
    ({"n": 11, "tag": "a", "xs": []}, "m.n: expected an integer 0..10"),
    ({"n": True, "tag": "a", "xs": []}, "m.n: expected an integer"),
    ({"n": 1, "tag": "abcde", "xs": []}, "m.tag: expected a string of 0..4 bytes"),
    ({"n": 1, "tag": "a", "xs": [1]}, "m.xs[0]: expected true or false"),
    ({"n": 1, "tag": "a", "xs": [True] * 3}, "m.xs: expected a list of 0..2 items"),
    ({"n": 1, "tag": "a"}, "m: missing field 'xs'"),
    ({"n": 1, "tag": "a", "xs": [], "extra": 1}, "m: unknown field 'extra'"),
    ({"n": 1, "tag": "a", "xs": [], "blob": "str"}, "m.blob: expected 0..8 bytes"),
    ([1, 2], "m: expected a map"),
])
def test_a_bad_body_is_the_senders_protocol_error_naming_the_field(body: Any, where: str
                                                                    ) -> None:
    with pytest.raises(RemoteProtocolError, match=rf"^{where.replace('[', '.').replace(']', '.')}"):
        BODY.check(body, "m")


def test_heads_and_any_values() -> None:
    head = HeadInfo("k000", "a0", 2, b"\x01" * 32)
    assert Head().check(head.to_wire(), "h") == head
    with pytest.raises(RemoteProtocolError, match="h: malformed head"):
        Head().check({"key": "k", "owner": "a0", "seq": 1, "id": b"short"}, "h")
    assert Any_(max_len=16).check({"a": [1, 2]}, "v") == {"a": [1, 2]}
    with pytest.raises(RemoteProtocolError, match="more than 4"):
        Any_(max_len=4).check("0123456789", "v")


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Str(max_len=-1), "Str"),
    (lambda: List("int"), "not a schema"),  # type: ignore[arg-type]
    (lambda: Map({"": Int()}), "field name"),
    (lambda: Map({"a": 5}), "is not a schema"),  # type: ignore[dict-item]
    (lambda: Rpc("heads", request=Map(), handler=lambda c, p, b: {}), "built-in method"),
    (lambda: Rpc("Bad Name", request=Map(), handler=lambda c, p, b: {}), "name must match"),
    (lambda: Rpc("x", request=Int(), handler=lambda c, p, b: {}),  # type: ignore[arg-type]
     "must be a Map"),
    (lambda: Rpc("x", request=Map(), handler=lambda c, p, b: {}, phase="later"), "phase"),
    (lambda: Rpc("x", request=Map(), handler=lambda c, p, b: {}, max_request_bytes=0),
     "max_request_bytes"),
])
def test_a_bad_declaration_is_refused_in_one_line(make: Any, message: str) -> None:
    with pytest.raises(SchemaError, match=message) as info:
        make()
    assert "\n" not in str(info.value)


def test_size_limits_below_the_frame_are_measured_at_the_node() -> None:
    small = Rpc("sized", request=Map({"b": Bytes(max_len=4096)}), max_request_bytes=100,
                handler=lambda ctx, peer, body: {"n": len(body["b"])})
    ctx = PolicyContext("a0", None, None, MemoryState())  # type: ignore[arg-type]
    assert serve(small, ctx, "a1", {"b": b"x" * 50}) == {"n": 50}
    with pytest.raises(RemoteProtocolError, match="larger than 100 bytes"):
        serve(small, ctx, "a1", {"b": b"x" * 200})


def test_a_handler_failure_or_a_bad_answer_is_the_policys_fault() -> None:
    def boom(ctx: PolicyContext, peer: str, body: Any) -> Any:
        raise KeyError("oops")

    ctx = PolicyContext("a0", None, None, MemoryState())  # type: ignore[arg-type]
    rpc = Rpc("boom", request=Map(), handler=boom)
    with pytest.raises(PolicyFault, match="boom: KeyError"):
        serve(rpc, ctx, "a1", {})
    liar = Rpc("liar", request=Map(), response=Map({"ok": Bool()}),
               handler=lambda c, p, b: {"ok": 1})
    with pytest.raises(PolicyFault, match="liar: RemoteProtocolError"):
        serve(liar, ctx, "a1", {})
    with pytest.raises(RemoteProtocolError, match="boom: unknown field"):  # the peer's
        serve(rpc, ctx, "a1", {"x": 1})


# --- parameters ---------------------------------------------------------------------------
LEASE = Param("lease_ms", "int", 500, lo=1, hi=10_000)


def test_parameters_parse_and_refuse_in_one_line_naming_the_field() -> None:
    assert LEASE.coerce("250") == 250
    assert Param("on", "bool", False).coerce("true") is True
    assert Param("rank", "str", "random", choices=("random", "recency")).coerce("recency")
    for bad, allowed in (("abc", "an integer 1..10000"), ("0", "an integer 1..10000"),
                         (2.5, "an integer 1..10000")):
        with pytest.raises(ParamError, match=rf"^lease_ms: .* is not allowed; allowed: "
                                             rf"{allowed}$"):
            LEASE.coerce(bad)
    with pytest.raises(ParamError, match="rank: 'x' is not allowed; allowed: random, recency"):
        Param("rank", "str", "random", choices=("random", "recency")).coerce("x")
    with pytest.raises(ParamError, match="default"):  # the default must be allowed
        Param("n", "int", 0, lo=1)
    assert split_spec("m/4/a=1/b=x").given == (("a", "1"), ("b", "x"))
    with pytest.raises(ParamError, match="expected field=value"):
        split_spec("m/a=1/4")


@pytest.fixture
def with_param_policy() -> Any:
    @register
    class Tunable(Policy):
        name = "test_tunable"
        parameters = (LEASE, Param("mode", "str", "a", choices=("a", "b")))

    yield Tunable
    unregister("test_tunable")


def test_specs_with_parameters(with_param_policy: Any) -> None:
    policy = make_policy("test_tunable/lease_ms=800")
    assert policy.settings == {"lease_ms": 800, "mode": "a"}
    assert policy.label == "test_tunable/lease_ms=800"
    assert make_policy("test_tunable", {"mode": "b"}).settings["mode"] == "b"
    assert make_policy("test_tunable/mode=a", {"mode": "b"}).settings["mode"] == "a"
    assert normal_spec("test_tunable/mode=b/lease_ms=500") == "test_tunable/mode=b"
    for spec, message in (
            ("test_tunable/lease_ms=abc", "lease_ms: 'abc' is not allowed; allowed: an "
                                          "integer 1..10000"),
            ("test_tunable/speed=1", "speed: unknown parameter; allowed: lease_ms, mode"),
            ("test_tunable/mode=a/mode=b", "mode: given twice"),
            ("test_tunable/4", "is not allowed")):
        with pytest.raises(ValueError, match=message):
            make_policy(spec)
    # the positional form is unchanged
    assert make_policy("metadata_sync/4").label == "metadata_sync/4"
    with pytest.raises(ValueError, match="metadata_sync/K with K in 1, 2, 4, 8, 16"):
        make_policy("metadata_sync/3")


def test_registry_refuses_collisions() -> None:
    class Clash(Policy):
        name = "planfence"

    with pytest.raises(ValueError, match="'planfence' collides with a built-in policy"):
        register(Clash)

    other = Rpc("announce", request=Map(), handler=lambda c, p, b: {})

    class Announcer(Policy):
        name = "test_announcer"
        rpcs = (other,)

    with pytest.raises(ValueError, match="rpc 'announce' collides with the one of "
                                         "adaptive, metadata_sync"):
        register(Announcer)
    assert rpc_named("announce") is not other
    assert "test_announcer" not in __import__("protocols.policies").policies.policy_names()


# --- on the in-memory team ------------------------------------------------------------------
async def test_a_policy_method_runs_its_handler_with_state_at_the_peer() -> None:
    import importlib

    import tests.nodes.rpc_probe_policy as probe

    if "test_rpc_probe" not in __import__("protocols.policies").policies.policy_names():
        importlib.reload(probe)
    try:
        await _probe_on_memory_team(probe)
    finally:  # campaigns in this process see the built-in registry again
        unregister("test_rpc_probe")


async def _probe_on_memory_team(probe: Any) -> None:
    team = MemoryTeam(n_agents=3, n_keys=3, policy="test_rpc_probe/step=5")
    await team.seed_all()
    request = await team.plan("a0", "a1", "act1", ["k002"])
    mark = len(team.calls)
    outcome = await team.act("a1", request)
    assert outcome.released, outcome.block_reason
    assert [c.method for c in team.calls[mark:]] == ["probe_count", "probe_count"]
    assert team.contexts["a2"].state.get("total") == 5
    assert team.contexts["a2"].memory["calls"] == 2  # the failing call ran too
    assert team.contexts["a1"].memory["last_total"] == 5
    await team.act("a1", request)
    assert team.contexts["a2"].state.get("total") == 10
    assert probe.COUNT.phase == "query"
