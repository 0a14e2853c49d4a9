"""Majority-replica validation: quorum replication of shared records.

Write quorum: on ``on_update`` the owner pushes the new record (content included) with
one ``install`` request to each of the floor(N/2) agents that follow it in roster
order, concurrently, and waits for every ack; with the owner that is a majority of the
N agents. Timed as stall (a quorum write), not on the action path.

Read quorum: on the action path the executor reads its own newest versions and sends
one ``versions`` request for D(a) to each of the floor(N/2) agents that follow it in
roster order, concurrently: floor(N/2)+1 agents, a majority. Any read majority meets
any write majority, so the highest sequence seen is the latest completed write, which
is H. A changed head is fetched from an agent that reported it; the single replan is
followed by a second quorum read. Keys the executor owns are read from its own head.

Readings: two different IDs at one sequence are conflicting evidence; a failed push
raises from ``on_update`` (the write did not reach a quorum); a failed read blocks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from protocols.env import ActionRequest, PolicyEnv
from protocols.errors import ConflictError, IntegrityError
from protocols.frontier import EvidenceError
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


def quorum_peers(agents: tuple[str, ...], me: str) -> list[str]:
    """The floor(N/2) agents after ``me`` in roster order (wrapping): with ``me``, a majority."""
    if me not in agents:
        return []
    start = agents.index(me)
    ring = [agents[(start + i) % len(agents)] for i in range(1, len(agents))]
    return ring[: len(agents) // 2]


@register
class MajorityReplica(DerivationPolicy):
    """On path: floor(N/2) replica reads per pass, fetches. Timed off path: quorum writes."""

    name = "majority_replica"
    display_name = "Majority-replica validation"

    async def on_update(self, env: PolicyEnv, head: HeadInfo) -> None:
        if env.roster.owners.get(head.key) != env.agent_id:
            return
        record = env.store.get(head.record_id)
        if record is None:
            raise EvidenceError(f"owner does not hold its own head of {head.key!r}")

        def pusher(peer: str) -> Callable[[], Awaitable[None]]:
            return lambda: env.install_at(peer, [record])

        await all_or_raise(env, [pusher(p)
                                 for p in quorum_peers(env.roster.agents, env.agent_id)])

    async def obtain_heads(self, env: PolicyEnv, request: ActionRequest,
                           captured: Mapping[str, bytes], frontier: Mapping[str, bytes],
                           tally: Tally) -> Evidence:
        known = frontier_known(env, captured, frontier)
        heads = local_heads(env, request.declared)
        remote = [k for k in request.declared if k not in heads]
        sources: dict[str, str] = {}
        if not remote:
            return Evidence(heads)
        peers = quorum_peers(env.roster.agents, env.agent_id)

        def reader(peer: str) -> Callable[[], Awaitable[dict[str, HeadInfo]]]:
            return lambda: tally.call(lambda: env.replica_versions(peer, remote))

        answers = dict(zip(peers, await all_or_raise(env, [reader(p) for p in peers]),
                           strict=True))
        for key in remote:
            owner = env.roster.owner_of(key)
            best = env.store.latest(key)
            best_from = env.agent_id
            for peer, answer in answers.items():
                held = answer.get(key)
                if held is None:
                    continue
                if held.key != key or held.owner != owner:
                    raise IntegrityError(f"replica {peer!r} answered for "
                                         f"{held.key!r}/{held.owner!r}")
                if best is not None and held.seq == best.seq \
                        and held.record_id != best.record_id:
                    raise ConflictError(f"replicas disagree on {key!r} seq {held.seq}")
                if best is None or held.seq > best.seq:
                    best, best_from = held, peer
            heads[key] = check_head(key, owner, best, known, source="read quorum")
            if best_from != env.agent_id:
                sources[key] = best_from
        return Evidence(heads, sources)
