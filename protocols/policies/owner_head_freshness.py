"""Owner-head freshness (unsafe control): refresh memory from the owners, then act.

On the action path: one concurrent ``heads`` request per declared key to its owner
(own keys read locally) and a fetch of every head that differs from the local copy,
which is installed. The inherited plan is then released without any derivation check,
so a plan derived from a superseded input is issued with fresh memory beside it.
Reading: a failed query or fetch blocks (the control cannot establish even observation
currency). Off the path: nothing.
"""

from __future__ import annotations

from protocols.env import ActionOutcome, ActionRequest, PolicyEnv
from protocols.policies._derivation import (
    BLOCKING_ERRORS,
    Evidence,
    Tally,
    best_effort_inputs,
    block_reason,
    known_versions,
    query_owners,
    refresh,
)
from protocols.policies.base import Policy
from protocols.policies.registry import register


@register
class OwnerHeadFreshness(Policy):
    """On path: d owner queries and changed-head fetches. Off path: nothing."""

    name = "owner_head_freshness"
    display_name = "Owner-head freshness"
    derivation_current = False

    async def validate(self, env: PolicyEnv, request: ActionRequest) -> ActionOutcome:
        tally = Tally()
        inputs = best_effort_inputs(env, request)
        local: dict[str, bytes] = {}
        for key in request.declared:
            latest = env.store.latest(key)
            if latest is not None:
                local[key] = latest.record_id
        try:
            known = known_versions(env, local.values())
            heads = await query_owners(env, list(request.declared), known, tally,
                                       per_key=True)
            await refresh(env, Evidence(heads), local, tally)
        except BLOCKING_ERRORS as exc:
            return ActionOutcome(False, 0, (), inputs, block_reason(exc),
                                 tally.requests)
        return ActionOutcome(True, 0, request.roots, inputs, messages=tally.requests)
