"""Metadata sync with barrier interval K (``metadata_sync`` = K 1, ``metadata_sync/K``).

Owners announce every head change of their keys to every other agent; validation
compares the plan's inputs with the synchronized heads, never asking an owner.

Off the path, not stall: ``on_update`` only queues the new head (latest per key).
Timed as stall: ``at_unit_end`` at an owner with queued heads, after every K-th work
unit (units counted from 0: after units K-1, 2K-1, ...), sends one ``announce`` per
other agent carrying all queued heads, concurrently, and waits for every ack (the
barrier). On the action path: no owner query; a fetch from the owner of every synced
head S(x) != C(x) not held locally; the single replan; a recheck against the synced
view. With K > 1 the synced view can be behind the owner, so stale plans are released:
that is the point of the control.

Readings: (1) keys an executor owns are compared with its own head; (2) if the local
store already holds an owner-signed version newer than the synced head, that version
is the synced view (the announcement is provably behind); (3) before any announcement
of a key the synced view is its seeded state (what ``on_seed`` announces during setup),
which (2) lifts to the local version, so no owner is ever asked; (4) a failed
announcement keeps the heads queued and raises from the barrier.
"""

from __future__ import annotations

from collections.abc import Mapping

from protocols.env import ActionRequest, PolicyEnv
from protocols.errors import ConflictError
from protocols.frontier import EvidenceError
from protocols.policies._announce import ANNOUNCE, announce_to_all
from protocols.policies._derivation import (
    DerivationPolicy,
    Evidence,
    Tally,
    check_head,
    frontier_known,
    local_heads,
)
from protocols.policies.registry import register
from protocols.records import HeadInfo


@register
class MetadataSync(DerivationPolicy):
    """On path: fetches only. Timed off path: the barrier every K units. Untimed: queueing."""

    name = "metadata_sync"
    display_name = "Metadata sync"
    params = (1, 2, 4, 8, 16)
    off_path_hooks = frozenset({"on_update"})
    rpcs = (ANNOUNCE,)

    def __init__(self, param: int | None = None) -> None:
        super().__init__(param)
        self.interval = param or 1
        self._pending: dict[str, HeadInfo] = {}

    @property
    def title(self) -> str:
        return f"{self.display_name}, K={self.interval}"

    @property
    def category(self) -> str:
        """With K > 1 the synced view can lag the owner: a delayed (unsafe) control."""
        return self.DELAYED_SYNC if self.interval > 1 else self.DERIVATION_CURRENT

    def _owns(self, env: PolicyEnv, head: HeadInfo) -> bool:
        return env.roster.owners.get(head.key) == env.agent_id

    async def on_seed(self, env: PolicyEnv, head: HeadInfo) -> None:
        if self._owns(env, head):
            await announce_to_all(env, [head])

    async def on_update(self, env: PolicyEnv, head: HeadInfo) -> None:
        queued = self._pending.get(head.key)
        if self._owns(env, head) and (queued is None or head.seq > queued.seq):
            self._pending[head.key] = head

    async def at_unit_end(self, env: PolicyEnv, unit: int) -> None:
        if (unit + 1) % self.interval or not self._pending:
            return
        heads = [self._pending[k] for k in sorted(self._pending)]
        await announce_to_all(env, heads)
        for head in heads:
            if self._pending.get(head.key) == head:
                del self._pending[head.key]

    async def obtain_heads(self, env: PolicyEnv, request: ActionRequest,
                           captured: Mapping[str, bytes], frontier: Mapping[str, bytes],
                           tally: Tally) -> Evidence:
        known = frontier_known(env, captured, frontier)
        heads = local_heads(env, request.declared)
        for key in request.declared:
            if key in heads:
                continue
            synced = env.store.synced_head(key)
            local = env.store.get(captured[key])
            if synced is None:  # nothing announced yet: the seeded state, lifted by (2)
                if local is None:
                    raise EvidenceError(f"no synced or local version of {key!r}")
                synced = local.head
            elif local is not None and local.seq >= synced.seq:
                if local.seq == synced.seq and local.id != synced.record_id:
                    raise ConflictError(f"synced head of {key!r} conflicts with the "
                                        f"owner-signed record held locally")
                synced = local.head
            heads[key] = check_head(key, env.roster.owner_of(key), synced, known,
                                    source="synced view")
        return Evidence(heads)
