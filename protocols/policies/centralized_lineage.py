"""Centralized lineage: owners commit every head change to a central metadata directory;
validation asks the directory.

Off the action path but timed as stall: ``on_update`` at the owner commits the new head
to the directory and waits for its ack (one request per update). On the action path:
one ``dir_heads`` request for every declared key, a fetch of every changed head from its
owner (the directory holds metadata only), and after the single replan the same check
again (the post-replan check of appendix C.3).

Reading of the paper (section 6.1, appendix C): validation goes through the shared
service for every declared key, including keys the executor owns itself, so no action
skips the directory. ``centralized_lineage_own_local`` keeps this testbed's earlier
reading, in which an executor read the heads of keys it owns from its own store and
asked the directory only for the others (an action whose declared keys are all its
own then sends nothing). In both, a key the directory has never seen (seeded but
never committed, when the node does not call ``on_seed``) is asked of its owner
instead, one request per such key.
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
from protocols.policies.base import CommitsToDirectory
from protocols.policies.registry import register


@register
class CentralizedLineage(CommitsToDirectory, DerivationPolicy):
    """On path: one directory read per pass, fetches. Timed off path: a commit per update."""

    name = "centralized_lineage"
    display_name = "Centralized lineage"
    #: Read the heads of the executor's own keys from its store instead of the directory.
    own_keys_local = False

    async def obtain_heads(self, env: PolicyEnv, request: ActionRequest,
                           captured: Mapping[str, bytes], frontier: Mapping[str, bytes],
                           tally: Tally) -> Evidence:
        known = frontier_known(env, captured, frontier)
        heads = local_heads(env, request.declared) if self.own_keys_local else {}
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


@register
class CentralizedLineageOwnLocal(CentralizedLineage):
    """The earlier reading: the executor's own keys are read locally, the rest from the
    directory (on path: at most one directory read per pass)."""

    name = "centralized_lineage_own_local"
    display_name = "Centralized lineage (own keys local)"
    own_keys_local = True
