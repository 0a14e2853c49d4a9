"""Per-key all-key validation: query every shared key's head, one request per key.

On the action path: one concurrent ``heads`` request per key of the whole keyspace
(keys the executor owns are read locally), fetches of changed declared heads, and the
same after the single replan. Only the declared keys are compared; every answer is
checked and any failed request blocks (the pass is all-or-nothing). Off the path:
nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from protocols.env import ActionRequest, PolicyEnv
from protocols.policies import register
from protocols.policies._derivation import (
    DerivationPolicy,
    Evidence,
    Tally,
    frontier_known,
    query_owners,
)


@register
class PerKeyAllKey(DerivationPolicy):
    """On path: |X| per-key owner queries per pass, fetches. Off path: nothing."""

    name = "per_key_all_key"
    per_key = True

    async def obtain_heads(self, env: PolicyEnv, request: ActionRequest,
                           captured: Mapping[str, bytes], frontier: Mapping[str, bytes],
                           tally: Tally) -> Evidence:
        known = frontier_known(env, captured, frontier)
        heads = await query_owners(env, env.roster.keys, known, tally, per_key=self.per_key)
        return Evidence({k: heads[k] for k in request.declared})
