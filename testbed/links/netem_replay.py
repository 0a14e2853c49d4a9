"""The netem backend's trace replay loop: one chunk of rate steps, on time or catching up.

Step k of a chunk is due at ``first_s + k * interval_ms`` (trio time). The loop sleeps
until the next step is due; when it wakes after a later step has begun (slow netlink
calls, a busy or emulated CPU), it plays the step in force now and skips the ones
already past, so the replay keeps to real time instead of drifting behind it. What
was late and what was skipped goes to the :class:`netem_plan.ReplayLateness` it is
given; the pure decisions (which step, which changes) are ``netem_plan``'s.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import trio

from testbed.links.netem_plan import RateStep, ReplayLateness, current_step, step_changes


async def play_steps(per_direction: Sequence[Sequence[RateStep] | None], n_steps: int,
                     first_s: float, *, interval_ms: float,
                     rates: Callable[[], Sequence[float | None]],
                     apply: Callable[[list[tuple[int, float]]], Awaitable[None]],
                     lateness: ReplayLateness) -> None:
    """Play steps 0..N_STEPS-1 of one chunk; ``rates()`` gives each direction's rate now,
    ``apply(changes)`` sends ``(direction, rate_kbit)`` changes."""
    k, interval_s = 0, interval_ms / 1000.0
    while k < n_steps:
        await trio.sleep_until(first_s + k * interval_s)
        now_k = current_step((trio.current_time() - first_s) * 1000.0, interval_ms)
        k = lateness.catch_up(k, now_k, n_steps)
        changes = step_changes(per_direction, k, rates())
        if changes:
            await apply(changes)
            lateness.record((trio.current_time() - first_s - k * interval_s) * 1000.0)
        k += 1
