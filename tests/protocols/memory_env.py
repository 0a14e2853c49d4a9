"""An in-memory twin of a team of nodes, for pure policy tests.

Rules the twin keeps (the same contracts as ``nodes/store.py`` and ``nodes/env.py``):

1. Stores verify every record (digest, signature, author = declared owner) before
   keeping it; a different record at the same (key, owner, seq) is a ConflictError;
   an owner's head advances only to a higher sequence; synced heads never go down.
2. Every remote method of :class:`MemoryEnv` is one "RPC": a direct call into the
   peer's store, logged as one :class:`Call` (one request, one response). Failures
   are injected per peer (``down``: PeerUnavailable, ``slow``: RpcTimeout) and answers
   can be rewritten per (peer, method) with ``forge`` to play a lying peer.
3. ``fetch`` verifies the record against the requested ID and roster, as the node's
   client does. Planning and replanning are the protocol's own code
   (``protocols.planning``), so the twin builds the same plan records as a node;
   ``replan`` first runs ``during_replan`` (to change inputs meanwhile).
4. The team drives operations like the controller: ``seed``, ``update`` (then the
   owner's ``on_update``), ``unit_end``, ``plan`` (handoff to the executor), ``act``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio

from protocols.concurrency import run_concurrently
from protocols.env import ActionOutcome, ActionRequest, LocalStore
from protocols.errors import (
    ConflictError,
    IntegrityError,
    LocalProtocolError,
    OwnerRuleError,
    PeerUnavailable,
    RemoteCallError,
    RemoteProtocolError,
    RpcTimeout,
)
from protocols.heads import adopt_announced, check_commit
from protocols.identity import CENTRAL_ID, Identity, Member, Roster
from protocols.planning import current_inputs, derive_plan, replacement_plan
from protocols.policies import make_policy
from protocols.policies.base import Policy
from protocols.policies.registry import rpc_named
from protocols.policy_rpc import POLICY_FAULT, MemoryState, PolicyContext, PolicyFault, serve
from protocols.policy_schema import to_wire
from protocols.records import HeadInfo, Record, make_record, verify_record

T = TypeVar("T")


class MemoryStore:
    """A node's store as a few dicts, with the owner rules of ``nodes/store.py``."""

    def __init__(self, agent_id: str, roster: Roster) -> None:
        self.agent_id = agent_id
        self.roster = roster
        self.records: dict[bytes, Record] = {}
        self.heads: dict[str, HeadInfo] = {}
        self.synced: dict[str, HeadInfo] = {}
        self.head_log: list[HeadInfo] = []

    def get(self, record_id: bytes) -> Record | None:
        return self.records.get(record_id)

    def has(self, record_id: bytes) -> bool:
        return record_id in self.records

    def install(self, record: Record) -> bool:
        verify_record(record, self.roster)
        rid = record.id
        for other in self.records.values():
            if (other.key, other.owner, other.seq) == (record.key, record.owner, record.seq) \
                    and other.id != rid:
                raise ConflictError(f"{record.key!r} seq {record.seq} held with another ID")
        if rid in self.records:
            return False
        self.records[rid] = record
        if self.roster.owners.get(record.key) == self.agent_id:
            current = self.heads.get(record.key)
            if current is None or record.seq > current.seq:
                self.heads[record.key] = record.head
                self.head_log.append(record.head)
        return True

    def install_many(self, records: Iterable[Record]) -> int:
        return sum(self.install(record) for record in records)

    def latest(self, key: str) -> HeadInfo | None:
        versions = [r for r in self.records.values() if r.key == key]
        return max(versions, key=lambda r: r.seq).head if versions else None

    def head(self, key: str) -> HeadInfo | None:
        return self.heads.get(key)

    def synced_head(self, key: str) -> HeadInfo | None:
        return self.synced.get(key)

    def set_synced_head(self, head: HeadInfo) -> None:
        if self.roster.owners.get(head.key) != head.owner:
            raise OwnerRuleError(f"announced {head.key!r} names the wrong owner")
        current = self.synced.get(head.key)
        proven = current is not None and current.record_id in self.records
        if adopt_announced(current, head, proven=proven):
            self.synced[head.key] = head


@dataclass(frozen=True)
class Call:
    src: str
    dst: str
    method: str


@dataclass
class MemoryTeam:
    """N agents (``a0``..), keys ``k000``.. owned round-robin, optional central directory."""

    n_agents: int = 3
    n_keys: int = 4
    policy: str = "planfence"
    seed: int = 7
    owners: dict[str, str] | None = None
    calls: list[Call] = field(default_factory=list)
    down: set[str] = field(default_factory=set)
    slow: set[str] = field(default_factory=set)
    forge: dict[tuple[str, str], Callable[[Any], Any]] = field(default_factory=dict)
    during_replan: Callable[[], Awaitable[None]] | None = None

    def __post_init__(self) -> None:
        self.agents = [f"a{i}" for i in range(self.n_agents)]
        self.identities = {a: Identity.derive(a, self.seed)
                           for a in [*self.agents, CENTRAL_ID]}
        members = [Member(a, i.public_key, "127.0.0.1", 0) for a, i in self.identities.items()]
        owners = self.owners or {f"k{j:03d}": self.agents[j % self.n_agents]
                                 for j in range(self.n_keys)}
        self.roster = Roster.build(members, owners, self.agents)
        self.stores = {a: MemoryStore(a, self.roster) for a in self.agents}
        self.policies: dict[str, Policy] = {a: make_policy(self.policy) for a in self.agents}
        self.contexts = {a: PolicyContext(agent_id=a, roster=self.roster, store=self.stores[a],
                                          state=MemoryState(), policy=self.policies[a],
                                          now=trio.current_time)
                         for a in self.agents}
        self.directory: dict[str, HeadInfo] = {}
        self.replans_made: dict[str, int] = {}
        self.hook_calls: list[Call] = []
        self.reads: dict[str, dict[str, bytes]] = {a: {} for a in self.agents}

    def env(self, agent: str) -> MemoryEnv:
        return MemoryEnv(self, agent)

    def count(self, since: int = 0, method: str | None = None) -> int:
        return sum(1 for c in self.calls[since:] if method is None or c.method == method)

    # --- "RPC" plumbing -----------------------------------------------------------------
    async def rpc(self, src: str, dst: str, method: str, run: Callable[[], T]) -> T:
        self.calls.append(Call(src, dst, method))
        await trio.lowlevel.checkpoint()
        if dst in self.down:
            raise PeerUnavailable(f"{dst} is down")
        if dst in self.slow:
            raise RpcTimeout(f"{dst} did not answer in time")
        result = run()
        rewrite = self.forge.get((dst, method))
        return rewrite(result) if rewrite is not None else result

    # --- controller operations ----------------------------------------------------------
    def _write(self, owner: str, key: str, seq: int, parents: Sequence[bytes],
               content: bytes, rtype: str = "requirement") -> Record:
        record = make_record(self.identities[owner], key=key, owner=owner, seq=seq,
                             parents=parents, rtype=rtype, content=content)
        self.stores[owner].install(record)
        return record

    async def seed_all(self, *, hooks: bool = True) -> None:
        """Seed every key at its owner (seq 1) and run ``on_seed`` if ``hooks``."""
        for key, owner in sorted(self.roster.owners.items()):
            record = self._write(owner, key, 1, [], f"{key} v1".encode())
            if hooks:
                await self.policies[owner].on_seed(self.env(owner), record.head)

    async def update(self, key: str, content: bytes | None = None) -> HeadInfo:
        owner = self.roster.owner_of(key)
        store = self.stores[owner]
        head = store.head(key)
        assert head is not None, "seed first"
        record = self._write(owner, key, head.seq + 1, [head.record_id],
                             content or f"{key} v{head.seq + 1}".encode())
        await self.policies[owner].on_update(self.env(owner), record.head)
        return record.head

    async def unit_end(self, unit: int) -> None:
        for agent in self.agents:
            await self.policies[agent].at_unit_end(self.env(agent), unit)

    async def plan(self, planner: str, executor: str, action: str, keys: Sequence[str],
                   *, depth: int = 0, decision: str = "decision") -> ActionRequest:
        """The planner derives a plan from the owners' current inputs and hands plan +
        ancestry to the executor (the protocol's own code: ``protocols.planning``)."""
        plan = await derive_plan(self.env(planner), action=action, executor=executor,
                                 keys=keys, depth=depth, decision=decision)
        self.reads[planner].update(plan.inputs)  # the planner's session read its inputs
        return ActionRequest(action, (plan.root,), tuple(keys),
                             tuple(sorted(plan.inputs.items())))

    async def read(self, agent: str, keys: Sequence[str]) -> dict[str, bytes]:
        """``agent`` retrieves the owners' current versions of ``keys`` (its session reads
        them), as the node's ``read`` op does."""
        records = await current_inputs(self.env(agent), keys)
        self.reads[agent].update({r.key: r.id for r in records})
        return {r.key: r.id for r in records}

    async def act(self, executor: str, request: ActionRequest) -> ActionOutcome:
        return await self.policies[executor].validate(self.env(executor), request)

    def invalid(self, outcome: ActionOutcome) -> bool:
        """Issued while a recorded input differs from its owner's head (the controller's
        judgement from owner logs), or issued without readable inputs."""
        if not outcome.released:
            return False
        if not outcome.inputs:
            return True
        for key, rid in outcome.inputs.items():
            head = self.stores[self.roster.owner_of(key)].head(key)
            if head is None or head.record_id != rid:
                return True
        return False


class MemoryEnv:
    """:class:`protocols.env.PolicyEnv` for one agent of a :class:`MemoryTeam`."""

    def __init__(self, team: MemoryTeam, agent: str) -> None:
        self.team = team
        self.identity = team.identities[agent]
        self.roster = team.roster
        self.store: LocalStore = team.stores[agent]
        self.state = team.contexts[agent].state
        self.memory = team.contexts[agent].memory

    @property
    def agent_id(self) -> str:
        return self.identity.agent_id

    def now(self) -> float:
        return trio.current_time()

    async def concurrently(self, calls: Sequence[Callable[[], Awaitable[T]]]
                           ) -> list[T | BaseException]:
        return await run_concurrently(calls)

    def session_reads(self) -> dict[str, bytes]:
        return dict(self.team.reads[self.agent_id])

    def record_read(self, key: str, record_id: bytes) -> None:
        self.team.reads[self.agent_id][key] = record_id

    def _peer(self, peer: str) -> MemoryStore:
        store = self.team.stores.get(peer)
        if store is None:
            raise PeerUnavailable(f"{peer!r} is not a replica")
        return store

    async def owner_heads(self, owner: str, keys: Sequence[str]) -> dict[str, HeadInfo]:
        def run() -> dict[str, HeadInfo]:
            store = self._peer(owner)
            out = {}
            for key in keys:
                if self.roster.owners.get(key) != owner:
                    raise RemoteCallError("not_owner", f"{owner} does not own {key}")
                head = store.head(key)
                if head is not None:
                    out[key] = head
            return out
        return await self.team.rpc(self.agent_id, owner, "heads", run)

    async def fetch(self, peer: str, record_id: bytes) -> Record:
        def run() -> Record:
            record = self._peer(peer).get(record_id)
            if record is None:
                raise RemoteCallError("unknown_id", "no such record")
            return record
        record = await self.team.rpc(self.agent_id, peer, "fetch", run)
        verify_record(record, self.roster, expected_id=record_id)
        return record

    async def install_at(self, peer: str, records: Sequence[Record]) -> None:
        def run() -> None:
            for record in records:
                self._peer(peer).install(record)
        await self.team.rpc(self.agent_id, peer, "install", run)

    async def call(self, peer: str, method: str, body: Mapping[str, Any]) -> Any:
        """A policy-defined method, served by the peer's policy as a node serves it
        (``protocols.policy_rpc.serve``); the answer checked like the node's client."""
        rpc = rpc_named(method)
        if rpc is None:
            raise LocalProtocolError(f"call: {method!r} is not a policy-defined method")
        params = to_wire(rpc.request.check(to_wire(body), method))

        def run() -> Any:
            self._peer(peer)
            try:
                return serve(rpc, self.team.contexts[peer], self.agent_id, params)
            except PolicyFault as exc:
                raise RemoteCallError(POLICY_FAULT, str(exc)) from None
        answer = await self.team.rpc(self.agent_id, peer, method, run)
        if rpc.response is None:
            return answer
        try:
            return rpc.response.check(answer, f"{method} answer")
        except RemoteProtocolError as exc:
            raise IntegrityError(str(exc)) from None

    async def call_many(self, calls: Sequence[tuple[str, str, Mapping[str, Any]]]
                        ) -> list[Any]:
        def one(peer: str, method: str, body: Mapping[str, Any]) -> Callable[[], Awaitable[Any]]:
            return lambda: self.call(peer, method, body)
        return await self.concurrently([one(*c) for c in calls])

    async def replica_versions(self, peer: str, keys: Sequence[str]) -> dict[str, HeadInfo]:
        def run() -> dict[str, HeadInfo]:
            store = self._peer(peer)
            out = {}
            for key in keys:
                latest = store.latest(key)
                if latest is not None:
                    out[key] = latest
            return out
        return await self.team.rpc(self.agent_id, peer, "versions", run)

    async def central_commit(self, heads: Sequence[HeadInfo]) -> None:
        def run() -> None:
            for head in heads:
                if self.roster.owners.get(head.key) != self.agent_id:
                    raise RemoteCallError("not_owner", "only the owner commits")
                if check_commit(self.team.directory.get(head.key), head):
                    self.team.directory[head.key] = head
        await self.team.rpc(self.agent_id, CENTRAL_ID, "commit", run)

    async def central_heads(self, keys: Sequence[str]) -> dict[str, HeadInfo]:
        def run() -> dict[str, HeadInfo]:
            return {k: self.team.directory[k] for k in keys if k in self.team.directory}
        return await self.team.rpc(self.agent_id, CENTRAL_ID, "dir_heads", run)

    async def replan(self, request: ActionRequest, inputs: dict[str, bytes]) -> ActionRequest:
        if self.team.during_replan is not None:
            await self.team.during_replan()
        n = self.team.replans_made.get(request.action, 0) + 1
        replacement = replacement_plan(self.identity, self.store, request, inputs, n)
        self.team.replans_made[request.action] = n
        return replacement
