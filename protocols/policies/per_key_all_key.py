"""Per-key all-key validation: query every shared key's head, one request per key.

On the action path: one concurrent ``heads`` request per key of the whole keyspace
(keys the executor owns are read locally), fetches of changed declared heads, and the
same after the single replan. Only the declared keys are compared; every answer is
checked and any failed request blocks (the pass is all-or-nothing). Off the path:
nothing.
"""

from __future__ import annotations

from protocols.env import ActionRequest, PolicyEnv
from protocols.policies._derivation import OwnerQueryPolicy
from protocols.policies.registry import register


@register
class PerKeyAllKey(OwnerQueryPolicy):
    """On path: |X| per-key owner queries per pass, fetches. Off path: nothing."""

    name = "per_key_all_key"
    display_name = "Per-key all-key validation"
    per_key = True

    def query_scope(self, env: PolicyEnv, request: ActionRequest) -> list[str]:
        return list(env.roster.keys)
