"""Attempts: an episode run several times with the same schedule, and which run counts.

Rules this module obeys (pure; the loop and ``run_unit`` apply them):

1. ``--repeats R`` gives every episode R *repeats* (slots 1..R), each run with the same
   schedule; ``--rerun-disturbed N`` lets a repeat whose attempt was disturbed
   (``testbed/run/disturbance.py``) run again, up to N more times, right after it.
2. Every run is an *attempt* with its own number (1 upward per episode, in the order
   they ran) and its own rows; none replaces another. A repeat is settled by its first
   undisturbed attempt, by an aborted one (an abort is not a disturbance: it is
   recorded and not retried here), or when its N reruns are used up. An attempt
   aborted by the infrastructure (its model endpoint gave no answer;
   ``testbed.results.aborts``) settles nothing and uses up no rerun: ``--resume``
   runs the repeat again under the next attempt number.
3. Resume plans from the committed attempts alone (``RunDir.attempts``): an attempt
   that was started and killed left no rows, so it runs again under the same number;
   settled repeats never run again, so nothing is duplicated. Raising R or N on
   ``--resume`` adds only the attempts the new values call for.
4. Which attempt is the verdict of a repeat (the report's reading, ``testbed/report/
   attempts.py``): its first undisturbed attempt, else its first attempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from testbed.campaign.model import CampaignError
from testbed.results.rundir import Attempt

MAX_REPEATS = 100
MAX_RERUNS = 20


@dataclass(frozen=True)
class AttemptPolicy:
    """How many repeats an episode gets and how often a disturbed one may rerun."""

    repeats: int = 1
    rerun_disturbed: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.repeats, int) and 1 <= self.repeats <= MAX_REPEATS):
            raise CampaignError(f"repeats: {self.repeats!r} is not allowed; allowed: "
                                f"an integer 1..{MAX_REPEATS}")
        if not (isinstance(self.rerun_disturbed, int)
                and 0 <= self.rerun_disturbed <= MAX_RERUNS):
            raise CampaignError(f"rerun_disturbed: {self.rerun_disturbed!r} is not allowed; "
                                f"allowed: an integer 0..{MAX_RERUNS}")


@dataclass(frozen=True)
class Slot:
    """A repeat still to run, and how many attempts it may still take."""

    repeat: int
    tries: int


@dataclass(frozen=True)
class EpisodePlan:
    """The repeats an episode still needs and the number its next attempt takes."""

    slots: tuple[Slot, ...]
    next_attempt: int = 1


ONE_ATTEMPT = EpisodePlan((Slot(1, 1),), 1)


def settled(records: Sequence[Attempt], rerun_disturbed: int) -> bool:
    """Whether a repeat with these committed attempts needs no further run (rule 2)."""
    counted = [r for r in records if not r.retry]
    if any(r.aborted or not r.disturbed for r in counted):
        return True
    return len(counted) >= 1 + rerun_disturbed


def plan_episode(records: Sequence[Attempt], policy: AttemptPolicy) -> EpisodePlan | None:
    """What an episode still needs, from its committed attempts (rule 3); None: nothing."""
    slots = []
    for repeat in range(1, policy.repeats + 1):
        mine = [r for r in records if r.repeat == repeat]
        if not settled(mine, policy.rerun_disturbed):
            slots.append(Slot(repeat, 1 + policy.rerun_disturbed
                              - sum(not r.retry for r in mine)))
    if not slots:
        return None
    return EpisodePlan(tuple(slots), max((r.attempt for r in records), default=0) + 1)


def verdict_attempt(records: Sequence[Attempt]) -> Attempt:
    """The attempt a repeat's verdict comes from (rule 4)."""
    ordered = sorted(records, key=lambda r: (r.retry, r.attempt))
    return next((r for r in ordered if not r.disturbed and not r.retry), ordered[0])
