"""Session read-set validation: a stand-in for a native validator that checks what the
executor's own session observed (Tables 1a / G.1, "session observations").

The version set is every version this agent's session has read in the episode, latest
per key (``PolicyEnv.session_reads``: what it read when it planned, retrieved an input
or replanned), checked against the one logical registry (``_registry_check``). After a
handoff the receiving session has not read the inherited plan's inputs, so a revision
it has already read looks current and the stale plan is issued: the miss the ablation
isolates. On path: one registry read per pass and the refresh fetches. Timed off path:
a registry commit per owner update (as centralized lineage).
"""

from __future__ import annotations

from protocols.env import ActionRequest, PolicyEnv
from protocols.policies._registry_check import RegistryValidator
from protocols.policies.registry import register


@register
class SessionReadSet(RegistryValidator):
    """Checks the session's read set against the registry; no parent links."""

    name = "session_read_set"
    display_name = "Registry check, session observations"

    def version_set(self, env: PolicyEnv, request: ActionRequest) -> dict[str, bytes]:
        return dict(env.session_reads())
