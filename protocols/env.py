"""What a policy may do: the interface between policy logic and the node.

Policies in ``protocols/policies`` are written only against :class:`PolicyEnv` and
:class:`LocalStore`. The node process implements them over its SQLite store and
real authenticated RPCs (``nodes/env.py``); the pure tests use an in-memory twin
(``tests/protocols/memory_env.py``); planning and replanning
(``protocols/planning.py``) run on the same two. Policies never touch sockets, clocks or files.

Every remote method performs exactly one RPC (one request frame, one response
frame) and raises :class:`protocols.errors.RpcError` (timeout, unavailable, remote
error) or :class:`protocols.errors.IntegrityError` (bad answer). Responses are
already decoded and type-checked; records returned by ``fetch`` are verified
against the requested ID and the roster before they are returned.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from protocols.identity import Identity, Roster
from protocols.records import HeadInfo, Record

T = TypeVar("T")


class LocalStore(Protocol):
    """The agent's durable store, as policies see it (synchronous, local)."""

    def get(self, record_id: bytes) -> Record | None: ...

    def has(self, record_id: bytes) -> bool: ...

    def install(self, record: Record) -> bool:
        """Verify and store a record; advance the head if this node owns its key.

        Returns True if newly stored. Raises IntegrityError/OwnerRuleError/ConflictError.
        """
        ...

    def install_many(self, records: Iterable[Record]) -> int:
        """Install several records at once (one durable commit); how many were new."""
        ...

    def latest(self, key: str) -> HeadInfo | None:
        """The newest version of ``key`` in this store (what the wrapper captures as C_a)."""
        ...

    def head(self, key: str) -> HeadInfo | None:
        """The owner's head of ``key``; only meaningful on the owner (else None)."""
        ...

    def synced_head(self, key: str) -> HeadInfo | None:
        """The head most recently learned from an announcement (metadata sync)."""
        ...

    def set_synced_head(self, head: HeadInfo) -> None: ...


class PolicyState(Protocol):
    """A policy's small durable key-value area at one node (reset with the episode).

    Keys are strings of 1..200 characters; values plain msgpack values of at most 64 KiB
    encoded (``protocols.policy_rpc``). Every ``put``/``delete`` is one commit at the
    node's durability setting.
    """

    def get(self, key: str, default: Any = None) -> Any: ...

    def put(self, key: str, value: Any) -> None: ...

    def delete(self, key: str) -> None: ...

    def items(self, prefix: str = "") -> list[tuple[str, Any]]: ...


class PolicyEnv(Protocol):
    """An agent's view of the team during one operation."""

    identity: Identity
    roster: Roster
    store: LocalStore
    #: The policy's durable key-value area at this node (what its handlers see too).
    state: PolicyState
    #: The policy's in-memory area at this node for the episode (shared with handlers).
    memory: dict[str, Any]

    @property
    def agent_id(self) -> str: ...

    def now(self) -> float:
        """Monotonic seconds (for timing attributions only)."""
        ...

    async def concurrently(self, calls: Sequence[Callable[[], Awaitable[T]]]
                           ) -> list[T | BaseException]:
        """Run independent calls at once; results (or the exception each raised) in order."""
        ...

    # --- owner-side data plane ---------------------------------------------------
    async def owner_heads(self, owner: str, keys: Sequence[str]) -> dict[str, HeadInfo]:
        """One request to ``owner`` for the current heads of ``keys`` (one or many)."""
        ...

    async def fetch(self, peer: str, record_id: bytes) -> Record:
        """Fetch one exact record from ``peer``; verified against the ID and roster."""
        ...

    async def install_at(self, peer: str, records: Sequence[Record]) -> None:
        """Ask ``peer`` to verify and install ``records`` (plan handoff, replication)."""
        ...

    async def replica_versions(self, peer: str, keys: Sequence[str]) -> dict[str, HeadInfo]:
        """Ask a replica for the newest versions it holds of ``keys`` (may omit keys)."""
        ...

    # --- policy-defined methods (protocols.policy_rpc) --------------------------------
    async def call(self, peer: str, method: str, body: Mapping[str, Any]) -> Any:
        """One request of a policy-defined ``method`` to ``peer``; its answer, checked
        against the method's answer schema (a bad one: ``IntegrityError``). A body
        outside the request schema is our own fault (``LocalProtocolError``)."""
        ...

    async def call_many(self, calls: Sequence[tuple[str, str, Mapping[str, Any]]]
                        ) -> list[Any]:
        """Several ``(peer, method, body)`` calls at once; each answer (or the exception
        its call raised) in order."""
        ...

    # --- central metadata directory (centralized lineage) ---------------------------
    async def central_commit(self, heads: Sequence[HeadInfo]) -> None: ...

    async def central_heads(self, keys: Sequence[str]) -> dict[str, HeadInfo]: ...

    # --- the session (what this agent has observed) ----------------------------------
    def session_reads(self) -> Mapping[str, bytes]:
        """The versions this agent's session has read, latest per key (key -> record ID).

        A session read set in the sense of a native validator's observation log: the
        inputs this agent read when it planned, retrieved or replanned during the
        episode. It is not the captured C(x) (the newest local version): a record
        installed by someone else's handoff is held, not read.
        """
        ...

    def record_read(self, key: str, record_id: bytes) -> None:
        """Note that this agent's session read ``record_id`` as the version of ``key``."""
        ...

    # --- the workflow (replay) ------------------------------------------------------
    async def replan(self, request: ActionRequest, inputs: dict[str, bytes]) -> ActionRequest:
        """Produce a replacement plan from locally installed ``inputs`` (key -> record ID).

        Replays the recorded decision (no model call): the executor stores a new signed
        plan record whose exact parents are ``inputs`` and returns the request with the
        replacement root. Its time is generation, not coordination: the node excludes it
        from stall.
        """
        ...


@dataclass(frozen=True)
class ActionRequest:
    """A protected action at its executor: the plan roots and the declared keys.

    ``supplied`` is a version set (key, record ID) the application hands over with the
    plan, when it carries one across the handoff (the declared version set of a native
    validator); PlanFence and the baselines never read it. ``critical`` is the declared
    key the workload marks as the action's critical input ("" when it marks none; read
    only by ``planfence_budget``'s ``critical_first`` ranking). A replacement plan keeps
    both the declared keys and the critical input.
    """

    action: str
    roots: tuple[bytes, ...]
    declared: tuple[str, ...]
    supplied: tuple[tuple[str, bytes], ...] = ()
    critical: str = ""


@dataclass
class ActionOutcome:
    """What a policy decided for one protected action.

    ``issued_roots`` are the roots of the plan that was released (after a replan,
    the replacement's roots); ``inputs`` the frontier F of that plan per declared key
    (or, for policies without a derivation check, the plan's recorded inputs as far
    as they could be read). ``block_reason`` is set when ``released`` is False.
    """

    released: bool
    replans: int
    issued_roots: tuple[bytes, ...]
    inputs: dict[str, bytes]
    block_reason: str = ""
    messages: int = 0
