"""Read leases: a coordination policy written outside the testbed (worked example).

An executor that validates a plan asks each declared key's owner for its head *and a
lease* on it (the policy-defined method ``lease``). While the lease runs (``lease_ms``,
a parameter) the executor trusts that head without asking again: an action whose
declared keys are all leased and unchanged sends nothing. The owner remembers every
lease it granted in its durable policy state; when it updates a key, it first revokes
the running leases on that key (``revoke`` to each holder, concurrently, waiting for
every ack: timed, stall), so a holder never trusts a head that has changed.

On the action path: one ``lease`` request per owner of the declared keys that are not
leased (stall), the fetch of changed content, the single replan. On the owner's update
path: the revocations (stall). Safety rests on the controller running one operation
at a time (as adaptive's does): an update's revocations complete before the next
action starts. A failed revocation raises from ``on_update`` (the update fails).

Node state: the owner's leases granted, ``lease/<key>`` -> {holder: expiry (s)}, in the
durable area; the holder's leases, key -> (head, expiry), in the episode's memory.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from protocols.api import (
    ActionRequest,
    Bool,
    DerivationPolicy,
    Evidence,
    Head,
    HeadInfo,
    Int,
    IntegrityError,
    List,
    Map,
    Param,
    PolicyContext,
    PolicyEnv,
    RemoteCallError,
    Rpc,
    Str,
    Tally,
    all_or_raise,
    check_head,
    frontier_known,
    local_heads,
    register,
)

MAX_KEYS = 4096
KEYS = List(Str(max_len=200, min_len=1), max_len=MAX_KEYS, min_len=1)


def serve_lease(ctx: PolicyContext, peer: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """At the owner: the heads of ``keys`` and a lease on each for ``peer``."""
    lease_s = ctx.policy.settings["lease_ms"] / 1000.0
    heads = []
    expiry = ctx.now() + lease_s
    for key in body["keys"]:
        if ctx.roster.owners.get(key) != ctx.agent_id:
            raise RemoteCallError("not_owner", f"{ctx.agent_id} does not own {key!r}")
        head = ctx.store.head(key)
        if head is None:
            raise RemoteCallError("no_head", f"{key!r} has no head yet")
        holders = dict(ctx.state.get(f"lease/{key}", {}))
        holders[peer] = expiry
        ctx.state.put(f"lease/{key}", holders)
        heads.append(head)
    return {"heads": heads, "lease_ms": ctx.policy.settings["lease_ms"]}


def serve_revoke(ctx: PolicyContext, peer: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """At a holder: forget the leases ``peer`` (their owner) granted on ``keys``."""
    leases = ctx.memory.setdefault("leases", {})
    for key in body["keys"]:
        if ctx.roster.owners.get(key) == peer:
            leases.pop(key, None)
    return {"ack": True}


LEASE = Rpc("lease", request=Map({"keys": KEYS}),
            response=Map({"heads": List(Head(), max_len=MAX_KEYS),
                          "lease_ms": Int(1, 3_600_000)}),
            handler=serve_lease, phase="query", doc="heads of keys + a read lease on each")
REVOKE = Rpc("revoke", request=Map({"keys": KEYS}), response=Map({"ack": Bool()}),
             handler=serve_revoke, phase="fetch", doc="the owner takes its leases back")


@register
class LeasePolicy(DerivationPolicy):
    """On path: lease requests for unleased keys, fetches. Owner update: revocations."""

    name = "lease"
    display_name = "Read leases"
    parameters = (Param("lease_ms", "int", 500, lo=1, hi=3_600_000,
                        doc="how long a granted lease lets the holder skip the owner"),)
    rpcs = (LEASE, REVOKE)

    async def on_update(self, env: PolicyEnv, head: HeadInfo) -> None:
        holders = {p: t for p, t in dict(env.state.get(f"lease/{head.key}", {})).items()
                   if t > env.now() and p != env.agent_id}

        def revoker(peer: str) -> Callable[[], Awaitable[Any]]:
            return lambda: env.call(peer, REVOKE.name, {"keys": [head.key]})

        await all_or_raise(env, [revoker(p) for p in sorted(holders)])
        env.state.delete(f"lease/{head.key}")

    async def obtain_heads(self, env: PolicyEnv, request: ActionRequest,
                           captured: Mapping[str, bytes], frontier: Mapping[str, bytes],
                           tally: Tally) -> Evidence:
        known = frontier_known(env, captured, frontier)
        heads = local_heads(env, request.declared)
        leases: dict[str, tuple[HeadInfo, float]] = env.memory.setdefault("leases", {})
        now = env.now()
        by_owner: dict[str, list[str]] = {}
        for key in request.declared:
            if key in heads:
                continue
            held = leases.get(key)
            if held is not None and held[1] > now:
                heads[key] = held[0]
            else:
                by_owner.setdefault(env.roster.owner_of(key), []).append(key)

        def asker(owner: str, keys: list[str]) -> Callable[[], Awaitable[Any]]:
            return lambda: tally.call(lambda: env.call(owner, LEASE.name, {"keys": keys}))

        groups = sorted(by_owner.items())
        answers = await all_or_raise(env, [asker(o, ks) for o, ks in groups])
        for (owner, keys), answer in zip(groups, answers, strict=True):
            got = {h.key: h for h in answer["heads"]}
            if set(got) != set(keys):
                raise IntegrityError(f"lease: owner {owner!r} answered for {sorted(got)}")
            for key in keys:
                head = check_head(key, owner, got[key], known, source=f"owner {owner!r}")
                heads[key] = head
                leases[key] = (head, now + answer["lease_ms"] / 1000.0)
        return Evidence(heads)
