"""Budgeted validation: which of an action's inputs to check (pure: no I/O, no clock).

An executor with a verification budget ``b`` checks at most ``b`` of the action's
declared inputs (a check establishes F(x) = C(x) = H(x) for that input, as PlanFence
does for all of them); every other input is taken on trust. A ranking orders the
inputs and the first ``b`` are checked. Rules:

1. ``random``: a permutation of the declared keys seeded by (the policy's ``seed``,
   the executor, the action, its declared keys), stable across runs and machines. It
   is also every other ranking's tie-break.
2. ``recency``: keys this executor has seen change most recently first. A key "is seen
   to change" when a version with a higher sequence than any it saw before appears in
   its store or in an owner's answer, stamped with the executor's clock; a key never
   seen above its seed (sequence 1) ranks after every stamped one.
3. ``critical_first``: the workload's declared critical input first, the others in the
   random order (no declared critical input: the random order).
4. ``value``: checks only the inputs whose expected avoided loss exceeds their measured
   cost, best net value first:
   - p(x), the chance that the plan's version of x is superseded, from this executor's
     checks in the episode: s(x) of n(x) first-pass checks of x found H(x) != F(x).
     Pooled over keys, P = (S + 1) / (N + 2) (Laplace's rule: 1/2 before any check);
     per key, p(x) = (s(x) + 2P) / (n(x) + 2) (the pool as a prior worth two checks).
   - Expected avoided loss: p(x) * ``loss_ms``, the price of one invalid action in
     milliseconds of stall (a policy parameter).
   - Measured cost: 0 for a key the executor owns (its head is local); otherwise the
     mean round trip of the owner queries this executor sent in the episode, each timed
     from request to answer or failure (0 before the first one, so the first action
     explores).
   - Checked: keys with p(x) * loss_ms > cost, by p(x) * loss_ms - cost descending,
     at most ``b`` of them.
5. The budget counts inputs, not messages: a key the executor owns is checked without
   a message but takes a slot. ``b = all`` checks every declared input.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

RANKINGS = ("random", "recency", "critical_first", "value")
ALL = "all"
#: What a key's own checks weigh against the pooled estimate (rule 4).
PRIOR_CHECKS = 2.0


@dataclass
class BudgetStats:
    """What one executor has observed in the episode (kept in the policy's memory)."""

    checks: dict[str, int] = field(default_factory=dict)
    changed: dict[str, int] = field(default_factory=dict)
    rtt_ms_total: float = 0.0
    rtt_count: int = 0
    #: key -> (highest sequence seen, when it was first seen; None for a seed).
    seen: dict[str, tuple[int, float | None]] = field(default_factory=dict)

    def note_version(self, key: str, seq: int, now: float) -> None:
        """A version of ``key`` at ``seq`` was observed at ``now`` (rule 2)."""
        before = self.seen.get(key)
        if before is None or seq > before[0]:
            stamp = now if seq > 1 else None
            self.seen[key] = (seq, stamp)

    def note_check(self, key: str, *, superseded: bool) -> None:
        self.checks[key] = self.checks.get(key, 0) + 1
        self.changed[key] = self.changed.get(key, 0) + int(superseded)

    def note_round_trip(self, ms: float) -> None:
        self.rtt_ms_total += ms
        self.rtt_count += 1

    def pooled(self) -> float:
        return (sum(self.changed.values()) + 1.0) / (sum(self.checks.values()) + 2.0)

    def p_changed(self, key: str) -> float:
        prior = self.pooled()
        return ((self.changed.get(key, 0) + PRIOR_CHECKS * prior)
                / (self.checks.get(key, 0) + PRIOR_CHECKS))

    def cost_ms(self, key: str, own: Collection[str]) -> float:
        if key in own or self.rtt_count == 0:
            return 0.0
        return self.rtt_ms_total / self.rtt_count

    def changed_at(self, key: str) -> float | None:
        entry = self.seen.get(key)
        return None if entry is None else entry[1]


def seeded_order(declared: Sequence[str], *, seed: int, agent: str, action: str) -> list[str]:
    """Rule 1: the declared keys in a seeded random order."""
    keys = sorted(set(declared))
    material = "\x1f".join(["planfence_budget", str(seed), agent, action, *keys]).encode()
    rng = random.Random(int.from_bytes(hashlib.blake2b(material, digest_size=8).digest(),
                                       "big"))
    rng.shuffle(keys)
    return keys


def rank(ranking: str, order: Sequence[str], *, critical: str, stats: BudgetStats,
         own: Collection[str], loss_ms: float) -> list[str]:
    """The keys in checking order (``order`` is the seeded order of rule 1); ``value``
    leaves out the keys it does not fund."""
    if ranking == "random":
        return list(order)
    if ranking == "critical_first":
        if critical in order:
            return [critical, *(k for k in order if k != critical)]
        return list(order)
    tie = {k: i for i, k in enumerate(order)}
    if ranking == "recency":
        def recent(key: str) -> tuple[int, float, int]:
            at = stats.changed_at(key)
            return (0, -at, tie[key]) if at is not None else (1, 0.0, tie[key])
        return sorted(order, key=recent)
    if ranking == "value":
        net = {k: stats.p_changed(k) * loss_ms - stats.cost_ms(k, own) for k in order}
        return sorted((k for k in order if net[k] > 0), key=lambda k: (-net[k], tie[k]))
    raise ValueError(f"ranking: {ranking!r} is not allowed; allowed: {', '.join(RANKINGS)}")


def choose(budget: int | str, ranked: Sequence[str]) -> list[str]:
    """The first ``budget`` keys of ``ranked`` (``all``: every one)."""
    if budget == ALL:
        return list(ranked)
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise ValueError(f"b: {budget!r} is not allowed; allowed: an integer >= 0 or all")
    return list(ranked[:budget])
