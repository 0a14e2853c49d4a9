"""NodeEnv: the :class:`protocols.env.PolicyEnv` a policy runs against inside a node.

Every remote method is exactly one RPC through the node's client (``nodes.rpc``
helpers check the answers); each is accounted to the operation's rounds and phases
(``nodes.meter``) unless the node answers itself. ``replan`` replays a recorded decision
(:func:`protocols.planning.replacement_plan`), after ``replan_delay_s`` (a synthetic
generation time the controller may set for one operation, appendix F): it is
generation, not coordination, so its elapsed time is accumulated in ``replan_ns`` for
the node to subtract from stall. The session's read set (``session_reads``) lives as
long as this env, one episode.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import trio

from nodes import rpc
from nodes.meter import RoundMeter
from nodes.store import SqliteStore
from nodes.transport import Counters
from protocols.concurrency import run_concurrently
from protocols.env import ActionRequest, LocalStore, PolicyState
from protocols.errors import LocalProtocolError
from protocols.identity import CENTRAL_ID, Identity, Roster
from protocols.planning import replacement_plan
from protocols.policies.registry import rpc_named
from protocols.policy_rpc import MemoryState
from protocols.records import HeadInfo, Record

T = TypeVar("T")


class NodeEnv:
    """PolicyEnv over a node's store and RPC client."""

    def __init__(self, *, identity: Identity, roster: Roster, store: SqliteStore,
                 client: rpc.RpcCaller, counters: Counters | None = None,
                 state: PolicyState | None = None, memory: dict[str, Any] | None = None,
                 ) -> None:
        self.identity = identity
        self.roster = roster
        self.store: LocalStore = store
        self.client = client
        self.replan_ns = 0  # generation time to exclude from stall (reset per operation)
        self.replan_delay_s = 0.0  # synthetic generation time of a replan (per operation)
        self.meter = RoundMeter(counters or Counters())
        self._replans: dict[str, int] = {}  # action -> replacement plans made so far
        self._reads: dict[str, bytes] = {}
        #: The policy's areas (the node shares them with the policy's handlers).
        self.state: PolicyState = state if state is not None else MemoryState()
        self.memory: dict[str, Any] = {} if memory is None else memory

    @property
    def replans_made(self) -> int:
        """Replacement plans this env has produced (all actions)."""
        return sum(self._replans.values())

    @property
    def agent_id(self) -> str:
        return self.identity.agent_id

    def now(self) -> float:
        return time.monotonic()

    async def concurrently(self, calls: Sequence[Callable[[], Awaitable[T]]]
                           ) -> list[T | BaseException]:
        return await run_concurrently(calls)

    async def _call(self, peer: str, method: str, call: Callable[[], Awaitable[T]], *,
                    head_read: bool | None = None) -> T:
        if peer == self.agent_id:  # answered by our own handlers: no round
            return await call()
        return await self.meter.measure(method, call, head_read=head_read)

    # --- data plane --------------------------------------------------------------
    async def owner_heads(self, owner: str, keys: Sequence[str]) -> dict[str, HeadInfo]:
        return await self._call(owner, "heads", lambda: rpc.call_heads(
            self.client, self.roster, owner, keys))

    async def fetch(self, peer: str, record_id: bytes) -> Record:
        return await self._call(peer, "fetch", lambda: rpc.call_fetch(
            self.client, self.roster, peer, record_id))

    async def install_at(self, peer: str, records: Sequence[Record]) -> None:
        await self._call(peer, "install", lambda: rpc.call_install(self.client, peer, records))

    # --- policy-defined methods ---------------------------------------------------------
    async def call(self, peer: str, method: str, body: Mapping[str, Any]) -> Any:
        declared = rpc_named(method)
        if declared is None:
            raise LocalProtocolError(f"call: {method!r} is not a policy-defined method")
        return await self._call(peer, method, lambda: rpc.call_policy(
            self.client, peer, declared, body), head_read=declared.phase == "query")

    async def call_many(self, calls: Sequence[tuple[str, str, Mapping[str, Any]]]
                        ) -> list[Any]:
        def one(peer: str, method: str, body: Mapping[str, Any]
                ) -> Callable[[], Awaitable[Any]]:
            return lambda: self.call(peer, method, body)

        return await self.concurrently([one(*c) for c in calls])

    async def replica_versions(self, peer: str, keys: Sequence[str]) -> dict[str, HeadInfo]:
        return await self._call(peer, "versions", lambda: rpc.call_versions(
            self.client, self.roster, peer, keys))

    async def central_commit(self, heads: Sequence[HeadInfo]) -> None:
        await self._call(CENTRAL_ID, "commit", lambda: rpc.call_commit(self.client, heads))

    async def central_heads(self, keys: Sequence[str]) -> dict[str, HeadInfo]:
        return await self._call(CENTRAL_ID, "dir_heads", lambda: rpc.call_dir_heads(
            self.client, self.roster, keys))

    # --- the session -----------------------------------------------------------------
    def session_reads(self) -> Mapping[str, bytes]:
        return dict(self._reads)

    def record_read(self, key: str, record_id: bytes) -> None:
        self._reads[key] = record_id

    # --- workflow replay -----------------------------------------------------------
    async def replan(self, request: ActionRequest, inputs: dict[str, bytes]) -> ActionRequest:
        started = time.monotonic_ns()
        self.meter.replanned = True
        try:
            if self.replan_delay_s > 0:
                await trio.sleep(self.replan_delay_s)
            n = self._replans.get(request.action, 0) + 1
            replacement = replacement_plan(self.identity, self.store, request, inputs, n)
            self._replans[request.action] = n
            return replacement
        finally:
            self.replan_ns += time.monotonic_ns() - started
