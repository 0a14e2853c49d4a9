"""Local replica (unsafe control): act on whatever is installed, no coordination at all.

On the action path: nothing (no message). Off the path: nothing. ``inputs`` is the
plan's frontier when it can be read locally, so the controller can judge validity.
"""

from __future__ import annotations

from protocols.env import ActionOutcome, ActionRequest, PolicyEnv
from protocols.policies._derivation import best_effort_inputs
from protocols.policies.base import Policy
from protocols.policies.registry import register


@register
class LocalReplica(Policy):
    """No work on or off the action path."""

    name = "local_replica"
    display_name = "Local replica"
    derivation_current = False

    async def validate(self, env: PolicyEnv, request: ActionRequest) -> ActionOutcome:
        return ActionOutcome(True, 0, request.roots, best_effort_inputs(env, request))
