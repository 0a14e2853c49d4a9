"""Live workflows: the task, its roles and its schedule (the ``live`` kind; pure).

Rules this module obeys (no I/O, no clock, every choice from a seeded generator):

1. A live task is one protected action (``Plan`` at unit 0, the owner's revision of
   the requirement at unit 1, ``Act`` at unit 2), like a trial: it depends only on (seed,
   family, template, agents, keys), never on the policy or the study settings, so the
   arms of a study see the same task, revision and roles.
2. Roles: the planner P and the executor E come from the template's role pools; the
   requirement (the declared key) is owned by some O != E; the auditor A is another
   agent, apart from P, E and O when the team is large enough.
3. The requirement's content is a task document (``protocols.roles`` rule 1): a request
   in words, the attribute the task needs and four candidates with distinct values of
   it. Version 0 (the seed) needs one candidate, version 1 (the inserted revision)
   another, version 2 (the overlap cohort's update during the replacement generation)
   the first again: the versions alternate between two task states, as in appendix F.
   Which candidate a version needs is the grader's answer (:func:`correct_option`); the
   model sees only the document.
4. The planner's decision is made live (``Plan.decision`` is ``"live"``); everything a
   model decides is recorded by the run, not by the schedule.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from testbed.campaign.trials import trial_content
from testbed.campaign.workload import (
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

LIVE_KIND = "live"
#: What the executor holds when it generates: its local state (the original path), or
#: inputs refreshed from the owners first (appendix C.2's fresh-before-generation control).
EXECUTOR_INPUTS = ("local", "fresh")
#: Whether the owner commits a relevant update while the replacement generation runs
#: (appendix F's live cohort) or not (its initial-only controls, and Table 1(b)).
OVERLAPS = ("none", "in_generation")
ACTION = "act000"
LIVE_UNITS = 3
CANDIDATES = 4
# family -> (candidate id prefix, attribute, values, request)
_TASKS = {
    "reservation": ("room", "date", ("2026-05-04", "2026-05-11", "2026-05-18", "2026-05-25",
                                     "2026-06-01", "2026-06-08"),
                    "Book a meeting room for the team that is free on {value}."),
    "fulfillment": ("wh", "region", ("north", "south", "east", "west", "central", "coast"),
                    "Ship the customer's order from a warehouse in the {value} region."),
    "deployment": ("cluster", "zone", ("zone-a", "zone-b", "zone-c", "zone-d", "zone-e",
                                       "zone-f"),
                   "Deploy the release to a cluster running in {value}."),
}


@dataclass(frozen=True)
class LiveRoles:
    """Who does what in one live task (rule 2)."""

    planner: str
    executor: str
    auditor: str
    key: str
    owner: str


def live_schedule(*, seed: int, family: str, template: str, agents: int = 5,
                  keys: int = 8) -> Schedule:
    """The seeded schedule of one live task (rules 1-4)."""
    if template_family(template) != family or family not in FAMILIES:
        raise WorkloadError(f"template: {template!r} is not a {family} template")
    if not 3 <= agents <= keys:
        raise WorkloadError(f"agents: {agents} with keys {keys} is not allowed; a live task "
                            "needs 3 <= agents <= keys (planner, executor and auditor)")
    shape = describe_template(template)
    agent_ids = tuple(f"a{i}" for i in range(agents))
    key_ids = tuple(f"k{i:03d}" for i in range(keys))
    owners = {k: agent_ids[i % agents] for i, k in enumerate(key_ids)}
    params = (LIVE_KIND, seed, family, template, agents, keys)
    rng = random.Random(seed_int("live", *params))
    planner, executor = (agent_ids[i] for i in template_roles(rng, shape, agents))
    requirement = rng.choice([k for k in key_ids if owners[k] != executor])
    owner = owners[requirement]
    size = rng.randint(*shape.compact_bytes)
    seeds = tuple(Seed(k, owners[k], "requirement",
                       task_content(seed, template, 0) if k == requirement
                       else trial_content(template, k, 0, size)) for k in key_ids)
    events = (Plan(0, ACTION, planner, executor, (requirement,), 0, "live"),
              Update(1, requirement, owner, "requirement", task_content(seed, template, 1)),
              Act(2, ACTION, executor, (requirement,)))
    digest = schedule_digest(params, owners, 0, seeds, list(events))
    return Schedule(seed=seed, family=family, template=template, agents=agent_ids,
                    keys=key_ids, owners=owners, units=LIVE_UNITS, deps=1, rho=1.0,
                    tier="compact", depth=0, seeds=seeds, events=events,
                    counts=Counts(1, 1), digest=digest)


def live_roles(schedule: Schedule) -> LiveRoles:
    """The roles of a live schedule (rule 2; the auditor is seeded by the schedule)."""
    plan = schedule.plans()[0]
    (key,) = plan.keys
    owner = schedule.owners[key]
    taken = {plan.planner, plan.executor, owner}
    pool = [a for a in schedule.agents if a not in taken] or \
        [a for a in schedule.agents if a not in (plan.planner, plan.executor)]
    rng = random.Random(seed_int("auditor", schedule.digest))
    return LiveRoles(plan.planner, plan.executor, rng.choice(pool), key, owner)


def _task(seed: int, template: str) -> tuple[str, str, list[dict[str, str]], str, str]:
    family = template_family(template)
    prefix, attribute, values, _ = _TASKS[family]
    rng = random.Random(seed_int("live-task", seed, template))
    chosen = rng.sample(values, CANDIDATES)
    numbers = rng.sample(range(10, 100), CANDIDATES)
    candidates = [{"id": f"{prefix}-{n}", attribute: v} for n, v in zip(numbers, chosen,
                                                                        strict=True)]
    first, second = rng.sample(range(CANDIDATES), 2)
    return family, attribute, candidates, chosen[first], chosen[second]


def task_content(seed: int, template: str, version: int) -> bytes:
    """Version ``version`` of the task's requirement (rule 3): state a, b, a, ..."""
    family, attribute, candidates, state_a, state_b = _task(seed, template)
    value = state_a if version % 2 == 0 else state_b
    request = _TASKS[family][3].format(value=value)
    doc = {"family": family, "task": template, "version": version, "request": request,
           "need": {attribute: value}, "candidates": candidates}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def correct_option(content: bytes) -> str | None:
    """The grader's answer for a requirement version: the candidate its need selects."""
    try:
        doc = json.loads(content)
        need = dict(doc["need"])
        for candidate in doc["candidates"]:
            if all(candidate.get(k) == v for k, v in need.items()):
                return str(candidate["id"])
    except (ValueError, KeyError, TypeError):
        return None
    return None
