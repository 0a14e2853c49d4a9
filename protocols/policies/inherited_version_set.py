"""Inherited version-set validation: a stand-in for a native validator given the version
set that the application carries across the handoff (Tables 1a / G.1, "inherited
version set").

The version set is the plan's input versions as the planner reported them, handed to
the executor with the plan (``ActionRequest.supplied``; the controller carries it, as an
application would), checked against the one logical registry (``_registry_check``). It
detects every inherited conflict, like PlanFence, but needs the application to carry
the read set across every handoff and to validate against one registry. An action
without a supplied set has nothing to check. On path: one registry read per pass and
the refresh fetches. Timed off path: a registry commit per owner update.
"""

from __future__ import annotations

from protocols.env import ActionRequest, PolicyEnv
from protocols.policies._registry_check import RegistryValidator
from protocols.policies.registry import register


@register
class InheritedVersionSet(RegistryValidator):
    """Checks the version set supplied with the plan against the registry."""

    name = "inherited_version_set"
    display_name = "Registry check, inherited version set"

    def version_set(self, env: PolicyEnv, request: ActionRequest) -> dict[str, bytes]:
        return dict(request.supplied)
