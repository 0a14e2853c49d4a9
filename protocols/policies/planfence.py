"""PlanFence (paper, section 4 and Algorithm 1): scoped, per-key owner queries at action time.

On the action path: one concurrent ``heads`` request per declared key to that key's
owner, the fetch of every changed head, and the same again after the single replan.
Off the path: nothing (no hook does work).
"""

from __future__ import annotations

from protocols.env import ActionRequest, PolicyEnv
from protocols.policies._derivation import OwnerQueryPolicy
from protocols.policies.registry import register


@register
class PlanFence(OwnerQueryPolicy):
    """On path: d per-key owner queries per pass, fetches. Off path: nothing."""

    name = "planfence"
    display_name = "PlanFence"
    per_key = True

    def query_scope(self, env: PolicyEnv, request: ActionRequest) -> list[str]:
        return list(request.declared)
