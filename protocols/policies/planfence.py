"""PlanFence (paper, section 4 and Algorithm 1): scoped, per-key owner queries at action time.

On the action path: one concurrent ``heads`` request per declared key to that key's
owner, the fetch of every changed head, and the same again after the single replan.
Off the path: nothing (no hook does work).
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
class PlanFence(DerivationPolicy):
    """On path: d per-key owner queries per pass, fetches. Off path: nothing."""

    name = "planfence"
    #: One request per declared key (False: one per owner over the declared keys).
    per_key = True

    async def obtain_heads(self, env: PolicyEnv, request: ActionRequest,
                           captured: Mapping[str, bytes], frontier: Mapping[str, bytes],
                           tally: Tally) -> Evidence:
        known = frontier_known(env, captured, frontier)
        heads = await query_owners(env, list(request.declared), known, tally,
                                   per_key=self.per_key)
        return Evidence(heads)
