"""The policy interface. One file per policy; each registers itself by name.

Attribution rules (what the measurement counts as stall):
- ``validate`` runs on the action path: its elapsed time, minus replan (generation)
  time, is action-path stall.
- ``on_update`` runs at the owner right after it installs a new head of one of its
  keys. Its elapsed time is stall (a timed central commit or quorum write) unless
  the policy lists "on_update" in ``off_path_hooks``.
- ``at_unit_end`` runs at every agent after every work unit. Its elapsed time is stall
  (a timed synchronisation barrier) unless listed in ``off_path_hooks``.
- ``on_seed`` runs at the owner after it seeded a key's initial version during setup.
  It is never measured (setup happens before the episode's measurement starts).
"""

from __future__ import annotations

from typing import Any, ClassVar

from protocols.env import ActionOutcome, ActionRequest, PolicyEnv
from protocols.policy_params import Param, format_value
from protocols.policy_rpc import Rpc
from protocols.records import HeadInfo


class Policy:
    #: Safety categories (the paper's Table 2 groups), as ``category`` returns them.
    UNSAFE_FRESHNESS: ClassVar[str] = "unsafe_freshness"
    DELAYED_SYNC: ClassVar[str] = "delayed_sync"
    DERIVATION_CURRENT: ClassVar[str] = "derivation_current"
    #: Stand-ins for a native validator's evidence configurations (Tables 1a / G.1).
    NATIVE_STANDIN: ClassVar[str] = "native_validator_standin"
    #: Checks only some of an action's inputs (``planfence_budget`` below b = all).
    BUDGETED: ClassVar[str] = "budgeted"

    #: The name campaign files use (registered by ``@register``).
    name: ClassVar[str] = ""
    #: How reports name the policy (default: ``name``).
    display_name: ClassVar[str] = ""
    #: True if the policy checks derivation currency (F = C = H) before release.
    derivation_current: ClassVar[bool] = True
    #: Whether the central metadata directory must run for this policy.
    needs_central: ClassVar[bool] = False
    #: Parameters a campaign may give after a slash (``metadata_sync/4``); () = none.
    params: ClassVar[tuple[int, ...]] = ()
    #: Hooks whose time is not stall (announcements sent in the background, etc.).
    off_path_hooks: ClassVar[frozenset[str]] = frozenset()
    #: Named, typed parameters (``name/field=value`` or ``[policies.NAME]``).
    parameters: ClassVar[tuple[Param, ...]] = ()
    #: Methods this policy adds to the data plane, served by every node running it.
    rpcs: ClassVar[tuple[Rpc, ...]] = ()

    def __init__(self, param: int | None = None) -> None:
        self.param = param
        #: Every declared parameter's value (set by ``make_policy`` after construction,
        #: before any hook runs; defaults until then).
        self.settings: dict[str, Any] = {p.name: p.default for p in self.parameters}

    def _changed_settings(self) -> str:
        return "".join(f"/{p.name}={format_value(self.settings[p.name])}"
                       for p in self.parameters
                       if self.settings.get(p.name, p.default) != p.default)

    @property
    def label(self) -> str:
        base = self.name if self.param is None else f"{self.name}/{self.param}"
        return base + self._changed_settings()

    @property
    def title(self) -> str:
        """Display name of this configuration (reports use it for rows and legends)."""
        base = self.display_name or self.name
        base = base if self.param is None else f"{base}/{self.param}"
        return base + self._changed_settings()

    @property
    def category(self) -> str:
        """Which safety group this configuration belongs to."""
        return self.DERIVATION_CURRENT if self.derivation_current else self.UNSAFE_FRESHNESS

    async def on_seed(self, env: PolicyEnv, head: HeadInfo) -> None:
        """Called at the owner after seeding ``head`` (setup, unmeasured); default: nothing."""

    async def on_update(self, env: PolicyEnv, head: HeadInfo) -> None:
        """Called at the owner after it advanced ``head``; default: nothing."""

    async def at_unit_end(self, env: PolicyEnv, unit: int) -> None:
        """Called at every agent after work unit ``unit``; default: nothing."""

    async def validate(self, env: PolicyEnv, request: ActionRequest) -> ActionOutcome:
        raise NotImplementedError


class CommitsToDirectory(Policy):
    """Owners commit every head they seed or advance to the central metadata directory
    and wait for its ack (centralized lineage, the registry stand-ins)."""

    needs_central = True

    async def _commit(self, env: PolicyEnv, head: HeadInfo) -> None:
        if env.roster.owners.get(head.key) == env.agent_id:
            await env.central_commit([head])

    async def on_seed(self, env: PolicyEnv, head: HeadInfo) -> None:
        await self._commit(env, head)

    async def on_update(self, env: PolicyEnv, head: HeadInfo) -> None:
        await self._commit(env, head)
