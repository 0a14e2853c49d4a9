"""PlanFence with a verification budget: check at most ``b`` inputs per action.

The question it measures: an agent that may check only some of the inputs it inherited
must choose which; how much risk (invalid actions issued) does each check buy, at what
stall and bytes? ``b = all`` is PlanFence; ``b = 0`` checks nothing and issues the
inherited plan as owner-head freshness does (same risk, no messages). Which inputs are
checked is the ranking's choice (``protocols.policies._budget``: ``random``,
``recency``, ``critical_first``, ``value``).

Per action: the ranking picks the checked set K (|K| <= b) once. A pass captures C and
reconstructs F for every declared key, asks the owner of each key of K for its head
(one ``heads`` request per key, concurrently, own keys read locally), checks the
answers, fetches every changed head of K, and releases when F = C = H on K. A mismatch
asks for the single replan, from H on K and the newest local version elsewhere, and the
replacement is checked again on K. Failures block (fail closed), as in PlanFence; an
input outside K is never compared. ``b = 0`` releases at once with the plan's recorded
inputs. Off the path: nothing (the ranking's bookkeeping is in memory).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from protocols.env import ActionOutcome, ActionRequest, PolicyEnv
from protocols.policies._budget import ALL, RANKINGS, BudgetStats, choose, rank, seeded_order
from protocols.policies._derivation import (
    Evidence,
    Tally,
    all_or_raise,
    best_effort_inputs,
    check_head,
    known_versions,
    local_heads,
    verify_passes,
)
from protocols.policies.base import Policy
from protocols.policies.registry import register
from protocols.policy_params import Param
from protocols.records import HeadInfo

_MEMORY_KEY = "planfence_budget"


@register
class PlanFenceBudget(Policy):
    """On path: at most b per-key owner queries per pass, fetches. Off path: nothing."""

    name = "planfence_budget"
    display_name = "PlanFence budget"
    parameters = (
        Param("b", "int", ALL, lo=0, named=(ALL,),
              doc="inputs checked per action (all: PlanFence, 0: none)"),
        Param("ranking", "str", "random", choices=RANKINGS,
              doc="which inputs the budget checks"),
        Param("loss_ms", "float", 1000.0, lo=0,
              doc="value ranking: the loss of one invalid action, in ms of stall"),
        Param("seed", "int", 0, lo=0, hi=2**31 - 1, doc="seed of the random order"),
    )

    @property
    def category(self) -> str:
        full = self.settings["b"] == ALL and self.settings["ranking"] != "value"
        return self.DERIVATION_CURRENT if full else self.BUDGETED

    def stats(self, env: PolicyEnv) -> BudgetStats:
        stats = env.memory.get(_MEMORY_KEY)
        if not isinstance(stats, BudgetStats):
            stats = env.memory[_MEMORY_KEY] = BudgetStats()
        return stats

    def checked_keys(self, env: PolicyEnv, request: ActionRequest) -> list[str]:
        """The inputs this action checks, in ranking order (notes what the store shows)."""
        stats, now = self.stats(env), env.now()
        for key in request.declared:
            latest = env.store.latest(key)
            if latest is not None:
                stats.note_version(key, latest.seq, now)
        own = {k for k in request.declared if env.roster.owners.get(k) == env.agent_id}
        order = seeded_order(request.declared, seed=self.settings["seed"], agent=env.agent_id,
                             action=request.action)
        ranked = rank(self.settings["ranking"], order, critical=request.critical,
                      stats=stats, own=own, loss_ms=self.settings["loss_ms"])
        return choose(self.settings["b"], ranked)

    async def validate(self, env: PolicyEnv, request: ActionRequest) -> ActionOutcome:
        keys = self.checked_keys(env, request)
        if not keys:
            return ActionOutcome(True, 0, request.roots, best_effort_inputs(env, request))
        stats = self.stats(env)

        async def obtain(candidate: ActionRequest, captured: Mapping[str, bytes],
                         frontier: Mapping[str, bytes], tally: Tally) -> Evidence:
            known = known_versions(env, [*(captured[k] for k in keys),
                                         *(frontier[k] for k in keys)])
            return Evidence(await self._owner_heads(env, keys, known, tally, stats))

        def first_pass(frontier: Mapping[str, bytes], evidence: Evidence) -> None:
            for key in keys:
                stats.note_check(key, superseded=evidence.heads[key].record_id != frontier[key])

        return await verify_passes(env, request, obtain, compared=keys,
                                   on_first_pass=first_pass)

    async def _owner_heads(self, env: PolicyEnv, keys: Sequence[str], known: list[HeadInfo],
                           tally: Tally, stats: BudgetStats) -> dict[str, HeadInfo]:
        """H for ``keys``: own keys locally, others one timed request per key."""
        heads = local_heads(env, keys)
        remote = [k for k in keys if k not in heads]

        def asker(key: str) -> Callable[[], Awaitable[dict[str, Any]]]:
            async def run() -> dict[str, Any]:
                started = env.now()
                try:  # a failed query cost its time too (a timeout: the whole of it)
                    return await tally.call(
                        lambda: env.owner_heads(env.roster.owner_of(key), [key]))
                finally:
                    stats.note_round_trip((env.now() - started) * 1000.0)
            return run

        answers = await all_or_raise(env, [asker(k) for k in remote])
        for key, answer in zip(remote, answers, strict=True):
            owner = env.roster.owner_of(key)
            heads[key] = check_head(key, owner, answer.get(key), known,
                                    source=f"owner {owner!r}")
        now = env.now()
        for key, head in heads.items():
            stats.note_version(key, head.seq, now)
        return heads
