"""Planning and replanning: how plan records are derived and handed off (pure protocol).

Rules (docs/architecture.md, "Records and identities"):

1. A planner derives a plan for ``action`` from the owners' current heads of the
   declared keys: keys it owns are read from its own store, the others asked of their
   owners (one ``heads`` request per owner, concurrently); every input record it does
   not hold is fetched from its owner, verified and installed.
2. Depth 0: the plan's parents are the inputs (sorted by key). Depth 1: a review
   record ``review/<action>`` has the inputs as parents and the plan has the review.
   ``plan/<action>`` and ``review/<action>`` start at seq 0 and increase when the same
   action is planned again.
3. Content of a plan (or review) = msgpack ``{action, decision, inputs}`` where
   ``inputs`` is a BLAKE2b-128 digest of the inputs' key, id and content, so two
   plans differ exactly when their decision or their inputs do.
4. Handoff: the planner installs the chain (inputs, review, plan; parents first) at
   the executor, in batches that keep each ``install`` frame well under the frame cap
   (artifact records are up to 320 KiB).
5. A replan at the executor replays the recorded decision: a new plan record
   ``plan/<action>/r<n>`` owned by the executor whose exact parents are the refreshed
   inputs (``n`` counts that executor's replacement plans of the action), with
   decision ``"replay"``.

Everything goes through :class:`protocols.env.PolicyEnv` and its store: the node
process and the in-memory twin run this same code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial

import msgpack

from protocols.env import ActionRequest, LocalStore, PolicyEnv
from protocols.errors import IntegrityError, LocalProtocolError
from protocols.identity import Identity
from protocols.records import (
    MAX_CONTENT_BYTES,
    MAX_RECORDS_PER_INSTALL,
    HeadInfo,
    Record,
    make_record,
)

INSTALL_BATCH_BYTES = 640 * 1024
"""Record bytes one handoff ``install`` carries at most (the frame cap is 1 MiB)."""


class PlanningError(LocalProtocolError):
    """A plan cannot be derived as asked (a key without a head, a record that cannot be
    built); the message names the field."""


@dataclass(frozen=True)
class DerivedPlan:
    """A plan as the planner wrote it: its root, its inputs, the chain handed off."""

    root: bytes
    inputs: dict[str, bytes]
    chain: tuple[Record, ...]


def plan_content(action: str, inputs: Sequence[Record], decision: str | bytes) -> bytes:
    """The content of a plan or review record (rule 3)."""
    digest = hashlib.blake2b(digest_size=16)
    for record in sorted(inputs, key=lambda r: r.key):
        digest.update(record.key.encode() + b"\0" + record.id + record.content)
    return msgpack.packb({"action": action, "decision": decision,
                          "inputs": digest.digest()}, use_bin_type=True)


def install_batches(records: Sequence[Record]) -> list[list[Record]]:
    """Split a handoff so each install frame stays well under the frame cap; order
    (parents first) is kept (rule 4)."""
    batches: list[list[Record]] = [[]]
    size = 0
    for record in records:
        cost = len(record.content) + 256 + 32 * len(record.parents)
        if batches[-1] and (size + cost > INSTALL_BATCH_BYTES
                            or len(batches[-1]) >= MAX_RECORDS_PER_INSTALL):
            batches.append([])
            size = 0
        batches[-1].append(record)
        size += cost
    return batches


def own_record(identity: Identity, *, key: str, seq: int, parents: Sequence[bytes],
               rtype: str, content: bytes) -> Record:
    """A record authored and owned by ``identity``; bad fields are a PlanningError."""
    if len(content) > MAX_CONTENT_BYTES:
        raise PlanningError(f"content: {len(content)} bytes, at most {MAX_CONTENT_BYTES}")
    try:
        return make_record(identity, key=key, owner=identity.agent_id, seq=seq,
                           parents=parents, rtype=rtype, content=content)
    except (ValueError, TypeError) as exc:
        raise PlanningError(f"record: cannot build ({exc})") from None


def next_version(identity: Identity, store: LocalStore, key: str, parents: Sequence[bytes],
                 rtype: str, content: bytes) -> Record:
    """The next version of one of this agent's own derived keys (rule 2)."""
    latest = store.latest(key)
    return own_record(identity, key=key, seq=0 if latest is None else latest.seq + 1,
                      parents=parents, rtype=rtype, content=content)


async def current_inputs(env: PolicyEnv, keys: Sequence[str]) -> list[Record]:
    """The owners' current records of ``keys``, installed locally (rule 1)."""
    me = env.agent_id
    by_owner: dict[str, list[str]] = {}
    for key in keys:
        by_owner.setdefault(env.roster.owner_of(key), []).append(key)
    heads: dict[str, HeadInfo] = {}
    remote = [owner for owner in by_owner if owner != me]
    answers = await env.concurrently(
        [partial(env.owner_heads, owner, by_owner[owner]) for owner in remote])
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
        heads.update(answer)
    for key in by_owner.get(me, []):
        own = env.store.head(key)
        if own is None:
            raise PlanningError(f"keys: {key!r} has no head at its owner {me!r}")
        heads[key] = own
    inputs: list[Record] = []
    for key in keys:
        head = heads.get(key)
        if head is None:
            raise IntegrityError(f"owner {env.roster.owner_of(key)!r} returned no head "
                                 f"for {key!r}")
        record = env.store.get(head.record_id)
        if record is None:
            record = await env.fetch(head.owner, head.record_id)
            env.store.install(record)
        inputs.append(record)
    return inputs


async def derive_plan(env: PolicyEnv, *, action: str, executor: str, keys: Sequence[str],
                      depth: int, decision: str | bytes,
                      decide: Callable[[Sequence[Record]], Awaitable[str | bytes]] | None = None,
                      ) -> DerivedPlan:
    """Derive a plan at the planner and hand it off to the executor (rules 1-4).

    ``decide`` (a live planner's role call) makes the decision from exactly the inputs
    read, in place of the recorded ``decision``."""
    if depth not in (0, 1):
        raise PlanningError(f"depth: {depth!r} not one of 0, 1")
    inputs = await current_inputs(env, keys)
    if decide is not None:
        decision = await decide(inputs)
    chain: list[Record] = list(inputs)
    parents = [r.id for r in sorted(inputs, key=lambda r: r.key)]
    if depth == 1:
        review = next_version(env.identity, env.store, f"review/{action}", parents, "review",
                              plan_content(action, inputs, "review"))
        chain.append(review)
        parents = [review.id]
    plan = next_version(env.identity, env.store, f"plan/{action}", parents, "plan",
                        plan_content(action, inputs, decision))
    chain.append(plan)
    env.store.install_many(chain[len(inputs):])
    if executor != env.agent_id:
        for batch in install_batches(chain):
            await env.install_at(executor, batch)
    return DerivedPlan(plan.id, {r.key: r.id for r in inputs}, tuple(chain))


def replacement_plan(identity: Identity, store: LocalStore, request: ActionRequest,
                     inputs: dict[str, bytes], n: int) -> ActionRequest:
    """Replay the recorded decision from locally installed ``inputs`` (rule 5)."""
    records = []
    for key, rid in sorted(inputs.items()):
        record = store.get(rid)
        if record is None or record.key != key:
            raise IntegrityError(f"replan input {key!r} is not installed locally")
        records.append(record)
    plan = make_record(identity, key=f"plan/{request.action}/r{n}", owner=identity.agent_id,
                       seq=0, parents=[r.id for r in records], rtype="plan",
                       content=plan_content(request.action, records, "replay"))
    store.install(plan)
    return ActionRequest(request.action, (plan.id,), request.declared,
                         critical=request.critical)
