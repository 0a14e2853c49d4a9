"""Policy-defined RPCs and policy state at a node (pure: no sockets, no files).

Rules:

1. A policy declares its methods as :class:`Rpc` (wire name, request body schema,
   optional answer schema, the node-side handler, the phase its rounds count in). The
   wire name is the request's ``m``, so a policy method costs exactly the bytes of a
   built-in method with the same body. Names are global: a name of a built-in method
   (:data:`BUILTIN_METHODS`) or a different declaration under a taken name is refused
   when the policy registers; one :class:`Rpc` object may be shared by several
   policies (metadata sync and adaptive share ``announce``).
2. A node serves the methods of its current policy (every member of an episode runs
   the same one). :func:`serve` checks the body against the schema (a bad body is the
   peer's :class:`RemoteProtocolError`: its connection closes), runs the handler, and
   checks its answer. A handler may answer with an error reply by raising
   :class:`RemoteCallError` and may close the peer's connection by raising
   :class:`RemoteProtocolError`; anything else it raises, or an answer outside its
   schema, is the policy's own fault: :class:`PolicyFault`, answered with error code
   ``policy_fault`` on that request alone (the connection and the node go on).
3. Handlers are synchronous (the node answers inline, as for built-in methods; the
   store is SQLite). They see a :class:`PolicyContext`: the agent, roster, store, the
   policy's durable key-value area (``state``, in the node's store, reset with the
   episode) and its in-memory area (``memory``, one dict per episode). The env that
   runs the policy's hooks exposes the same two areas.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from protocols.env import LocalStore, PolicyState
from protocols.errors import RemoteCallError, RemoteProtocolError
from protocols.identity import Roster
from protocols.policy_schema import Map, SchemaError, to_wire
from protocols.wire import MAX_FRAME_BYTES, pack, unpack

#: Methods every node serves itself; a policy may not declare these names.
BUILTIN_METHODS = frozenset({"heads", "fetch", "install", "versions", "commit", "dir_heads"})
#: The phases a round may count in (``nodes.meter``): head reads or transfers.
PHASES = ("query", "fetch")
POLICY_FAULT = "policy_fault"
_METHOD_RE = re.compile(r"^[a-z][a-z0-9_.]{0,31}$")
#: Room in a frame around a body: the request envelope, the AEAD tag, the prefix.
_ENVELOPE_BYTES = 64
MAX_STATE_KEY_CHARS = 200
MAX_STATE_VALUE_BYTES = 64 * 1024


class PolicyFault(Exception):
    """A policy's handler failed or answered outside its schema (the policy's bug)."""


class MemoryState:
    """:class:`PolicyState` in a dict (the pure tests' twin; same checks)."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(check_state_key(key), default)

    def put(self, key: str, value: Any) -> None:
        encoded = pack(value)
        if len(encoded) > MAX_STATE_VALUE_BYTES:
            raise ValueError(f"state value of {key!r}: {len(encoded)} bytes, more than "
                             f"{MAX_STATE_VALUE_BYTES}")
        self.data[check_state_key(key)] = unpack(encoded)

    def delete(self, key: str) -> None:
        self.data.pop(check_state_key(key), None)

    def items(self, prefix: str = "") -> list[tuple[str, Any]]:
        return sorted((k, v) for k, v in self.data.items() if k.startswith(prefix))


def check_state_key(key: str) -> str:
    if not isinstance(key, str) or not 0 < len(key) <= MAX_STATE_KEY_CHARS:
        raise ValueError(f"state key {key!r}: need 1..{MAX_STATE_KEY_CHARS} characters")
    return key


@dataclass
class PolicyContext:
    """What a policy's handlers (and, as ``env.state``/``env.memory``, its hooks) see."""

    agent_id: str
    roster: Roster
    store: LocalStore
    state: PolicyState
    memory: dict[str, Any] = field(default_factory=dict)
    policy: Any = None  # the node's current policy object
    #: Monotonic seconds (the node's clock; time is an input here, rule 3).
    now: Callable[[], float] = field(default=lambda: 0.0)


Handler = Callable[[PolicyContext, str, Mapping[str, Any]], Any]


@dataclass(frozen=True, eq=False)
class Rpc:
    """One policy-defined method.

    ``handler`` is a function ``(ctx, peer, body) -> answer`` or the name of a method of
    the policy class with that signature (after ``self``). ``request`` must be a
    :class:`Map` (a request's params are a map); ``response`` too, or None for "any
    plain value" (then only the frame limit applies). ``phase``: ``query`` rounds count
    as head reads (query, or revalidation after a replan), ``fetch`` as transfers.
    """

    name: str
    request: Map
    handler: str | Handler
    response: Map | None = None
    phase: str = "fetch"
    doc: str = ""
    #: Largest request body (msgpack bytes) a node accepts; the frame limit by default.
    max_request_bytes: int = MAX_FRAME_BYTES - _ENVELOPE_BYTES

    def __post_init__(self) -> None:
        check_rpc(self)

    @property
    def size_checked(self) -> bool:
        """Whether a node must measure a body: its schema allows more than the limit,
        and the limit is below what the transport already enforces per frame."""
        return (self.max_request_bytes < MAX_FRAME_BYTES - _ENVELOPE_BYTES
                and self.request.max_bytes() > self.max_request_bytes)

    def describe(self) -> str:
        answer = "any" if self.response is None else self.response.describe()
        return f"{self.name}({self.request.describe()}) -> {answer} [{self.phase}]"


def check_rpc(rpc: Rpc) -> None:
    """Refuse a declaration that cannot be served (SchemaError, one line)."""
    if not isinstance(rpc.name, str) or not _METHOD_RE.match(rpc.name):
        raise SchemaError(f"rpc {rpc.name!r}: name must match [a-z][a-z0-9_.]{{0,31}}")
    if rpc.name in BUILTIN_METHODS:
        raise SchemaError(f"rpc {rpc.name!r}: collides with a built-in method")
    if not isinstance(rpc.request, Map):
        raise SchemaError(f"rpc {rpc.name!r}: request must be a Map schema")
    if rpc.response is not None and not isinstance(rpc.response, Map):
        raise SchemaError(f"rpc {rpc.name!r}: response must be a Map schema or None")
    if rpc.phase not in PHASES:
        raise SchemaError(f"rpc {rpc.name!r}: phase {rpc.phase!r} not one of {PHASES}")
    if not (callable(rpc.handler) or (isinstance(rpc.handler, str)
                                      and rpc.handler.isidentifier())):
        raise SchemaError(f"rpc {rpc.name!r}: handler must be callable or a method name")
    limit = rpc.max_request_bytes
    if not (isinstance(limit, int) and 0 < limit <= MAX_FRAME_BYTES - _ENVELOPE_BYTES):
        raise SchemaError(f"rpc {rpc.name!r}: max_request_bytes {limit!r} not in "
                          f"1..{MAX_FRAME_BYTES - _ENVELOPE_BYTES}")


def handler_of(rpc: Rpc, policy: object) -> Handler:
    if callable(rpc.handler):
        return rpc.handler
    bound = getattr(policy, rpc.handler, None)
    if not callable(bound):
        raise SchemaError(f"rpc {rpc.name!r}: {type(policy).__name__} has no method "
                          f"{rpc.handler!r}")
    return bound  # type: ignore[no-any-return]


def serve(rpc: Rpc, ctx: PolicyContext, peer: str, params: Any) -> Any:
    """Answer one request for ``rpc`` (rule 2); returns the answer in wire form."""
    if rpc.size_checked and len(pack(params)) > rpc.max_request_bytes:
        raise RemoteProtocolError(f"{rpc.name}: body larger than {rpc.max_request_bytes} "
                                  f"bytes")
    body = rpc.request.check(params, rpc.name)  # RemoteProtocolError: the peer's fault
    try:
        answer = handler_of(rpc, ctx.policy)(ctx, peer, body)
    except (RemoteCallError, RemoteProtocolError):
        raise
    except Exception as exc:
        raise PolicyFault(f"{rpc.name}: {type(exc).__name__}: {exc}") from exc
    wire = to_wire(answer)
    if rpc.response is not None:
        try:
            rpc.response.check(wire, f"{rpc.name} answer")
        except RemoteProtocolError as exc:
            raise PolicyFault(f"{rpc.name}: RemoteProtocolError: {exc}") from None
    return wire
