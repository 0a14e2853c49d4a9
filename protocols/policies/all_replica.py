"""All-replica dependency validation: ask every other replica which versions of D(a) it holds.

On the action path: one ``versions`` request (naming the declared keys) to each of the
N-1 other agents, concurrently; fetches of changed heads from their owners; the same
after the single replan. Off the path: nothing.

Reading: the owner's answer is authoritative and is H (an executor that owns a key
reads its own head). The other replicas' answers are cross-checks: a replica holding
an owner-signed version with a higher sequence than the owner's head, or a different
ID at the owner's sequence, is conflicting evidence and blocks. Every replica must
answer (a read-all); any failed request blocks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from protocols.env import ActionRequest, PolicyEnv
from protocols.errors import ConflictError
from protocols.policies._derivation import (
    DerivationPolicy,
    Evidence,
    Tally,
    all_or_raise,
    check_head,
    frontier_known,
    local_heads,
)
from protocols.policies.registry import register
from protocols.records import HeadInfo


@register
class AllReplica(DerivationPolicy):
    """On path: N-1 replica reads per pass, fetches. Off path: nothing."""

    name = "all_replica"
    display_name = "All-replica dependency validation"

    async def obtain_heads(self, env: PolicyEnv, request: ActionRequest,
                           captured: Mapping[str, bytes], frontier: Mapping[str, bytes],
                           tally: Tally) -> Evidence:
        keys = list(request.declared)
        peers = env.roster.peers_of(env.agent_id)

        def asker(peer: str) -> Callable[[], Awaitable[dict[str, HeadInfo]]]:
            return lambda: tally.call(lambda: env.replica_versions(peer, keys))

        answers = dict(zip(peers, await all_or_raise(env, [asker(p) for p in peers]),
                           strict=True))
        known = frontier_known(env, captured, frontier)
        heads = local_heads(env, keys)
        for key in keys:
            owner = env.roster.owner_of(key)
            if key not in heads:
                heads[key] = check_head(key, owner, answers.get(owner, {}).get(key), known,
                                        source=f"owner {owner!r}")
            head = heads[key]
            for peer, answer in answers.items():
                held = answer.get(key)
                if peer == owner or held is None:
                    continue
                if held.key != key or held.owner != owner or held.seq > head.seq or (
                        held.seq == head.seq and held.record_id != head.record_id):
                    raise ConflictError(f"replica {peer!r} reports {key!r} seq {held.seq}, "
                                        f"inconsistent with the owner's seq {head.seq}")
        return Evidence(heads)
