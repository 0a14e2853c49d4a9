"""Adaptive (beyond the paper): metadata-sync evidence while updates are rare, PlanFence above.

Sync mode (the start of every episode): each owner announces every new head of its keys
to every other agent inside ``on_update`` (one ``announce`` per peer, concurrently,
waiting for every ack: timed as stall), and executors take H from the synced heads.
PlanFence mode: nobody announces; executors query the owners per key. The switch is
team-wide and one-way within an episode: once the estimated update rate is confidently
above rho = 1.

Estimator (a pure function of data every agent holds identically). In sync mode every
update is announced, so the announced heads give the exact team update count
``U = sum(seq - 1)`` over keys with an announced head (seeds have seq 1, each update
adds one). With ``u`` the current work unit (from 0), ``lambda = U / (u + 1)`` updates
per unit. The workload lays out one event per unit in blocks "plan, updates, act"
(testbed/workload.py: A = T / (2 + rho), U = rho * A), so ``lambda = rho / (2 + rho)``
and ``rho_hat = 2 lambda / (1 - lambda)``. The decision uses the one-sigma lower bound
``lambda_lo = (U - sqrt(U)) / (u + 1)`` (Poisson counts) in the same formula: sync
mode while ``rho_lo <= 1``; never a switch before unit 8 (warm-up).

Why it never releases what the derivation check would block: announcements are
synchronous and the controller runs operations one at a time, so every agent holds
the same announced state after each update. Every agent (owner before and after
announcing, executor at each validation and at every unit end) evaluates the rule on
that state with the unit in which the state first appeared, so all agents agree on the
announcement after which the team left sync mode; no owner stops announcing before
every executor stops trusting announcements. While in sync mode a synced head is H,
and a key with no synced head has not changed since its seed, so its only version (the
one held locally) is H. Whenever that reasoning does not hold (PlanFence mode, a local
owner-signed version newer than the synced head, or no local version) the executor
asks the owner. A failed announcement raises from ``on_update`` (the update fails, as an
owner-write timeout aborts an episode in the paper): a peer that missed it would hold a
stale view.

On the action path: owner queries in PlanFence mode, fetches, the single replan and its
revalidation. Off the path: ``at_unit_end`` only notes the unit and reads synced heads
locally (no message).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from protocols.env import ActionRequest, PolicyEnv
from protocols.policies._announce import ANNOUNCE, announce_to_all
from protocols.policies._derivation import (
    DerivationPolicy,
    Evidence,
    Tally,
    check_head,
    frontier_known,
    local_heads,
    query_owners,
)
from protocols.policies.registry import register
from protocols.records import HeadInfo

SEED_SEQ = 1  # nodes seed every key at sequence 1 (nodes/node.py op_seed)
WARMUP_UNITS = 8
SWITCH_ABOVE_RHO = 1.0

State = tuple[tuple[str, int], ...]


def rho_from_rate(per_unit: float) -> float:
    """Invert the workload's layout law lambda = rho / (2 + rho)."""
    if per_unit >= 1.0:
        return math.inf
    return 2.0 * max(per_unit, 0.0) / (1.0 - per_unit)


def rho_estimates(updates: int, unit: int) -> tuple[float, float]:
    """(rho_hat, its one-sigma lower bound) after ``updates`` by the end of ``unit``."""
    units = unit + 1
    point = rho_from_rate(updates / units)
    low = rho_from_rate(max(0.0, updates - math.sqrt(updates)) / units)
    return point, low


def ends_sync(state: State, unit: int) -> bool:
    """The team-wide rule: leave sync mode once rho is confidently above 1."""
    if unit + 1 < WARMUP_UNITS:
        return False
    updates = sum(max(0, seq - SEED_SEQ) for _, seq in state)
    return rho_estimates(updates, unit)[1] > SWITCH_ABOVE_RHO


@register
class Adaptive(DerivationPolicy):
    """On path: owner queries in PlanFence mode, fetches. Timed off path: announcements in
    sync mode. Untimed: bookkeeping at unit ends."""

    name = "adaptive"
    display_name = "Adaptive (rho rule)"
    off_path_hooks = frozenset({"at_unit_end"})
    rpcs = (ANNOUNCE,)

    def __init__(self, param: int | None = None) -> None:
        super().__init__(param)
        self._last_unit = -1  # last completed work unit
        self._announced: dict[str, int] = {}  # own key -> highest seq announced
        self._seen: State = ()
        self.switched = False

    @property
    def sync_mode(self) -> bool:
        return not self.switched

    def _state(self, env: PolicyEnv) -> State:
        state = dict(self._announced)
        for key, owner in env.roster.owners.items():
            if owner != env.agent_id:
                synced = env.store.synced_head(key)
                if synced is not None:
                    state[key] = synced.seq
        return tuple(sorted(state.items()))

    def _observe(self, env: PolicyEnv) -> None:
        """Evaluate the rule on the announced state, at the unit it first appeared in."""
        if self.switched:
            return
        state = self._state(env)
        if state != self._seen:
            self._seen = state
            self.switched = ends_sync(state, self._last_unit + 1)

    # --- owner side ----------------------------------------------------------------------
    async def on_seed(self, env: PolicyEnv, head: HeadInfo) -> None:
        await self.on_update(env, head)

    async def on_update(self, env: PolicyEnv, head: HeadInfo) -> None:
        if env.roster.owners.get(head.key) != env.agent_id:
            return
        self._observe(env)
        if self.switched:
            return
        await announce_to_all(env, [head])
        self._announced[head.key] = max(head.seq, self._announced.get(head.key, 0))
        self._observe(env)

    # --- every agent ---------------------------------------------------------------------
    async def at_unit_end(self, env: PolicyEnv, unit: int) -> None:
        self._last_unit = max(self._last_unit, unit - 1)
        self._observe(env)  # changes made during ``unit`` are dated ``unit``
        self._last_unit = max(self._last_unit, unit)

    async def obtain_heads(self, env: PolicyEnv, request: ActionRequest,
                           captured: Mapping[str, bytes], frontier: Mapping[str, bytes],
                           tally: Tally) -> Evidence:
        self._observe(env)
        known = frontier_known(env, captured, frontier)
        heads = local_heads(env, request.declared)
        ask = []
        for key in request.declared:
            if key in heads:
                continue
            synced = env.store.synced_head(key)
            local = env.store.get(captured[key])
            if self.switched or local is None:
                ask.append(key)
            elif synced is None:  # never announced: unchanged since its seed
                heads[key] = local.head
            elif local.seq > synced.seq:  # an unannounced update: do not trust the view
                ask.append(key)
            else:
                heads[key] = check_head(key, env.roster.owner_of(key), synced, known,
                                        source="synced view")
        if ask:
            heads.update(await query_owners(env, ask, known, tally, per_key=True))
        return Evidence(heads)
