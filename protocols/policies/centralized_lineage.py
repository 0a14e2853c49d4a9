"""Centralized lineage: owners commit every head change to a central metadata directory;
validation asks the directory.

Off the action path but timed as stall: ``on_update`` at the owner commits the new head
to the directory and waits for its ack (one request per update). On the action path:
one ``dir_heads`` request for D(a) (keys the executor owns are read locally), a fetch
of every changed head from its owner (the directory holds metadata only), and after
the single replan the same check again (the post-replan check of appendix C.3).
Reading: a key the directory has never seen (seeded but never committed, when the node
does not call ``on_seed``) is asked of its owner instead, one request per such key.
"""

from __future__ import annotations

from collections.abc import Mapping

from protocols.env import ActionRequest, PolicyEnv
from protocols.policies._derivation import (
    DerivationPolicy,
    Evidence,
    Tally,
    check_head,
    frontier_known,
    local_heads,
    query_owners,
)
from protocols.policies.registry import register
from protocols.records import HeadInfo


@register
class CentralizedLineage(DerivationPolicy):
    """On path: one directory read per pass, fetches. Timed off path: a commit per update."""

    name = "centralized_lineage"
    display_name = "Centralized lineage"
    needs_central = True

    async def _commit(self, env: PolicyEnv, head: HeadInfo) -> None:
        if env.roster.owners.get(head.key) == env.agent_id:
            await env.central_commit([head])

    async def on_seed(self, env: PolicyEnv, head: HeadInfo) -> None:
        await self._commit(env, head)

    async def on_update(self, env: PolicyEnv, head: HeadInfo) -> None:
        await self._commit(env, head)

    async def obtain_heads(self, env: PolicyEnv, request: ActionRequest,
                           captured: Mapping[str, bytes], frontier: Mapping[str, bytes],
                           tally: Tally) -> Evidence:
        known = frontier_known(env, captured, frontier)
        heads = local_heads(env, request.declared)
        remote = [k for k in request.declared if k not in heads]
        if remote:
            directory = await tally.call(lambda: env.central_heads(remote))
            unseen = [k for k in remote if k not in directory]
            for k in remote:
                if k in directory:
                    heads[k] = check_head(k, env.roster.owner_of(k), directory[k], known,
                                          source="central directory")
            if unseen:
                heads.update(await query_owners(env, unseen, known, tally, per_key=True))
        return Evidence(heads)
