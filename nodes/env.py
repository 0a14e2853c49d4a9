"""NodeEnv: the :class:`protocols.env.PolicyEnv` a policy runs against inside a node.

Every remote method is exactly one RPC through the node's client (``nodes.rpc``
helpers check the answers). ``replan`` replays a recorded decision: it is generation,
not coordination, so its elapsed time is accumulated in ``replan_ns`` for the node to
subtract from stall.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import msgpack
import trio

from nodes import rpc
from nodes.store import SqliteStore
from protocols.env import ActionRequest, LocalStore
from protocols.errors import IntegrityError
from protocols.identity import Identity, Roster
from protocols.records import HeadInfo, Record, make_record

T = TypeVar("T")


def decision_content(action: str, inputs: Sequence[Record], decision: str | bytes) -> bytes:
    """The content of a plan record: the action, the replayed decision, and a digest of
    the inputs' content (so a replacement plan differs exactly when its inputs do)."""
    digest = hashlib.blake2b(digest_size=16)
    for record in sorted(inputs, key=lambda r: r.key):
        digest.update(record.key.encode() + b"\0" + record.id + record.content)
    return msgpack.packb({"action": action, "decision": decision,
                          "inputs": digest.digest()}, use_bin_type=True)


async def run_concurrently(calls: Sequence[Callable[[], Awaitable[T]]]
                           ) -> list[T | BaseException]:
    """Run independent calls at once; each result, or the exception it raised, in order.

    This is ``PolicyEnv.concurrently`` for every trio-based environment (the node's and
    the tests' in-memory twin).
    """
    results: list[T | BaseException] = [RuntimeError("not run")] * len(calls)

    async def run_one(i: int, call: Callable[[], Awaitable[T]]) -> None:
        try:
            results[i] = await call()
        except Exception as exc:  # reported to the policy, which fails closed
            results[i] = exc

    if len(calls) == 1:  # nothing to overlap: skip the nursery's task switches
        await run_one(0, calls[0])
        return results
    async with trio.open_nursery() as nursery:
        for i, call in enumerate(calls):
            nursery.start_soon(run_one, i, call)
    return results


class NodeEnv:
    """PolicyEnv over a node's store and RPC client."""

    def __init__(self, *, identity: Identity, roster: Roster, store: SqliteStore,
                 client: rpc.RpcCaller) -> None:
        self.identity = identity
        self.roster = roster
        self.store: LocalStore = store
        self.client = client
        self.replan_ns = 0  # generation time to exclude from stall (reset per operation)
        self._replans: dict[str, int] = {}  # action -> replacement plans made so far

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

    # --- data plane --------------------------------------------------------------
    async def owner_heads(self, owner: str, keys: Sequence[str]) -> dict[str, HeadInfo]:
        return await rpc.call_heads(self.client, self.roster, owner, keys)

    async def fetch(self, peer: str, record_id: bytes) -> Record:
        return await rpc.call_fetch(self.client, self.roster, peer, record_id)

    async def install_at(self, peer: str, records: Sequence[Record]) -> None:
        await rpc.call_install(self.client, peer, records)

    async def announce(self, peer: str, heads: Sequence[HeadInfo]) -> None:
        await rpc.call_announce(self.client, peer, heads)

    async def replica_versions(self, peer: str, keys: Sequence[str]) -> dict[str, HeadInfo]:
        return await rpc.call_versions(self.client, self.roster, peer, keys)

    async def central_commit(self, heads: Sequence[HeadInfo]) -> None:
        await rpc.call_commit(self.client, heads)

    async def central_heads(self, keys: Sequence[str]) -> dict[str, HeadInfo]:
        return await rpc.call_dir_heads(self.client, self.roster, keys)

    # --- workflow replay -----------------------------------------------------------
    async def replan(self, request: ActionRequest, inputs: dict[str, bytes]) -> ActionRequest:
        started = time.monotonic_ns()
        try:
            records = []
            for key, rid in sorted(inputs.items()):
                record = self.store.get(rid)
                if record is None or record.key != key:
                    raise IntegrityError(f"replan input {key!r} is not installed locally")
                records.append(record)
            n = self._replans.get(request.action, 0) + 1
            plan = make_record(
                self.identity, key=f"plan/{request.action}/r{n}", owner=self.agent_id, seq=0,
                parents=[r.id for r in records], rtype="plan",
                content=decision_content(request.action, records, "replay"))
            self.store.install(plan)
            self._replans[request.action] = n
            return ActionRequest(request.action, (plan.id,), request.declared)
        finally:
            self.replan_ns += time.monotonic_ns() - started
