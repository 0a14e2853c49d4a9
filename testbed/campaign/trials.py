"""Single-action trials: the schedules of the ``replanning`` and ``handoff`` study kinds.

Rules this module obeys (pure: no I/O, no clock, every choice from a seeded generator):

1. A trial is one protected action. Its schedule is a :class:`Schedule` with every key
   seeded by its owner, one ``Plan`` (unit 0), one revision of the declared key by its
   owner (unit 1: the change that makes the first check stale) and one ``Act`` (unit 2).
   It depends only on (seed, family, template, agents, keys, tier, derivation, kind),
   never on the policy or the study settings (delay, update rate, scenario), so paired
   trials of every row replay the same plan, revision and action.
2. Roles come from the template's role pools: the executor E, a planner P != E, and the
   declared key (the requirement) owned by some O != E that owns at least one more key:
   O's other key is the trial's unrelated key (the control row of appendix F changes
   only that key, at the same owner, so relevance is the only difference).
3. Updates alternate the requirement between two task states (``state-a`` at the seed,
   ``state-b`` at the revision, then a, b, ...); contents are sized per tier like the
   workload's (compact: the template's size range; artifact: 256-320 KiB).
4. Updates during replanning follow a seeded Poisson process (:func:`poisson_times`):
   exponential gaps at ``rate_per_s`` from the start of the action, depending only on
   (seed, template, rate), hence paired across policies and replanning delays.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from testbed.campaign.workload import (
    ARTIFACT_BYTES,
    FAMILIES,
    Act,
    Counts,
    Plan,
    Schedule,
    Seed,
    Update,
    WorkloadError,
    describe_template,
    schedule_digest,
    seed_int,
    template_family,
    template_roles,
)

#: Study kinds whose episodes are single-action trials (the first kind, ``episodes``, is
#: the workload of ``testbed.campaign.workload``).
TRIAL_KINDS = ("replanning", "handoff")
#: Live workflows (``testbed.campaign.live``): single actions too, decided by a model.
LIVE_KINDS = ("live",)
KINDS = ("episodes", *TRIAL_KINDS, *LIVE_KINDS)
#: Kinds whose episodes are one protected action (their workload fields are fixed).
SINGLE_ACTION_KINDS = (*TRIAL_KINDS, *LIVE_KINDS)
#: Which updates run during a replanning trial.
UPDATE_TARGETS = ("relevant", "unrelated")
#: The handoff evidence scenarios (Table G.1), in table order.
SCENARIOS = ("unchanged", "same_session", "handoff")
ACTION = "act000"
TRIAL_UNITS = 3


def trial_schedule(*, seed: int, family: str, template: str, agents: int = 5,
                   keys: int = 8, tier: str = "compact", derivation: str = "direct",
                   kind: str = "replanning", decide: Callable[[int], str] | None = None
                   ) -> Schedule:
    """The seeded single-action schedule of one trial (module rules 1-3); ``decide(0)``
    replaces the recorded decision (a live run's, ``testbed.campaign.decisions``)."""
    if kind not in TRIAL_KINDS:
        raise WorkloadError(f"kind: {kind!r} is not allowed; allowed: {', '.join(TRIAL_KINDS)}")
    if template_family(template) != family or family not in FAMILIES:
        raise WorkloadError(f"template: {template!r} is not a {family} template")
    if not 2 <= agents < keys:
        raise WorkloadError(f"agents: {agents} with keys {keys} is not allowed; a trial "
                            "needs 2 <= agents < keys (an owner of two keys)")
    shape = describe_template(template)
    agent_ids = tuple(f"a{i}" for i in range(agents))
    key_ids = tuple(f"k{i:03d}" for i in range(keys))
    owners = {k: agent_ids[i % agents] for i, k in enumerate(key_ids)}
    params = (kind, seed, family, template, agents, keys, tier, derivation)
    rng = random.Random(seed_int("trial", *params))
    planner, executor = (agent_ids[i] for i in template_roles(rng, shape, agents))
    held = {o: [k for k in key_ids if owners[k] == o] for o in agent_ids}
    candidates = [k for k in key_ids if owners[k] != executor and len(held[owners[k]]) >= 2]
    requirement = rng.choice(candidates)
    owner = owners[requirement]
    rtype = "requirement" if tier == "compact" else "artifact"
    size = (rng.randint(*shape.compact_bytes) if tier == "compact"
            else rng.randint(*ARTIFACT_BYTES))
    seeds = tuple(Seed(k, owners[k], rtype, trial_content(template, k, 0, size))
                  for k in key_ids)
    depth = shape.depth if derivation == "template" else 0
    verb = rng.choice(("hold", "book", "allocate", "ship", "stage", "promote"))
    decision = f"{verb}:option-{rng.randrange(1, 100):02d}"
    if decide is not None:
        decision = decide(0)
    events = (Plan(0, ACTION, planner, executor, (requirement,), depth, decision),
              Update(1, requirement, owner, rtype, trial_content(template, requirement, 1,
                                                                 size)),
              Act(2, ACTION, executor, (requirement,)))
    digest = schedule_digest(params, owners, depth, seeds, list(events))
    return Schedule(seed=seed, family=family, template=template, agents=agent_ids,
                    keys=key_ids, owners=owners, units=TRIAL_UNITS, deps=1, rho=1.0,
                    tier=tier, depth=depth, seeds=seeds, events=events,
                    counts=Counts(1, 1), digest=digest)


def trial_content(template: str, key: str, version: int, size: int) -> bytes:
    """Version ``version`` of ``key``: its task state alternates a, b, a, ... (rule 3)."""
    state = "state-a" if version % 2 == 0 else "state-b"
    header = f"{template}/{key}/v{version}/{state}\n".encode()
    body = random.Random(seed_int("trial-content", template, key, version)).randbytes(
        max(0, size - len(header)))
    return header + body


def trial_roles(schedule: Schedule) -> tuple[str, str, str, str, str]:
    """(planner, executor, requirement key, its owner, the owner's unrelated key)."""
    plan = schedule.plans()[0]
    (requirement,) = plan.keys
    owner = schedule.owners[requirement]
    unrelated = next(k for k in schedule.keys if schedule.owners[k] == owner
                     and k != requirement)
    return plan.planner, plan.executor, requirement, owner, unrelated


def poisson_times(*, seed: int, template: str, rate_per_s: float, horizon_s: float
                  ) -> list[float]:
    """Seeded Poisson arrivals (seconds from the action's start) up to ``horizon_s``."""
    if rate_per_s <= 0:
        return []
    rng = random.Random(seed_int("poisson", seed, template, float(rate_per_s)))
    times: list[float] = []
    t = rng.expovariate(rate_per_s)
    while t < horizon_s:
        times.append(t)
        t += rng.expovariate(rate_per_s)
    return times
