"""Seeded workload schedules: what every agent does in each work unit of an episode.

Rules this module obeys (pure: no I/O, no clock, every choice from a seeded generator):

1. A schedule is a function of (seed, family, template, agents, keys, units, deps, rho,
   tier) only. Policies, networks and connection settings are not inputs, so every
   policy of a cell replays exactly the same schedule; ``Schedule.digest`` proves it.
2. Keys are ``k000``..``k127``; key ``k<i>`` is owned by agent ``a<i mod N>`` (round
   robin), so every agent owns at least one key when ``keys >= agents``.
3. A template (``reservation-03``) fixes structural choices from its id alone: its
   derivation depth (0: the plan's parent is the requirement; 1: plan -> review ->
   requirement), which agents plan and which execute, the size range of compact
   records (0.5-4 KiB) and the family's decision vocabulary. The ``derivation``
   setting decides whether the template's depth is used: ``direct`` (the default, the
   paper's cost setting "a single declared key and a direct parent") plans every action
   at depth 0; ``template`` uses each template's own depth (15 of the 30 templates
   derive through a review). Only the plans' depth differs between the two: every
   seeded draw is the same, so depth-0 templates give identical schedules.
4. Scaling rule for the number of protected actions A and owner updates U at horizon
   T and nominal rate rho: ``A = max(1, round_half_up(T / (2 + rho)))`` and
   ``U = min(round_half_up(rho * A), T - 2A)``. At T = 64 this gives 28/21/11/4
   actions with 7/21/42/56 updates for rho = 0.25/1/4/16, and 3/11/43 actions at
   rho = 4 for T = 16/64/256 (the final burst of updates is truncated at the horizon).
5. Layout: one event per work unit. Action i is a block ``Plan, u_i updates, Act``;
   blocks follow each other, unused units stay idle at the end. Updates are spread
   over blocks as evenly as possible (which blocks get the remainder is seeded). One
   update of each block, at a seeded position, writes one of the action's declared
   keys (a relevant update), the others write keys drawn uniformly from the keyspace.
   Its position matters to delayed synchronisation: a relevant update just before the
   action is still unannounced at the action when the barrier interval K > 1. So when
   U >= A (rho >= 1) a relevant update lands between planning and every protected
   action; at rho = 0.25 only U of the A actions see one.
6. Record contents are deterministic pseudo-random bytes (cheap to generate), sized
   per tier: compact 0.5-4 KiB, artifact 256-320 KiB. Every key also gets an initial
   version (``Schedule.seeds``) written by its owner before the episode starts.
7. Every protected action declares one critical input (``Act.critical``, read by
   ``planfence_budget``'s ``critical_first`` ranking): one of its declared keys, drawn
   from a generator of its own seeded by the schedule's parameters and the action id,
   so it takes nothing from the schedule's stream and is not correlated with which key
   the block's updates write. Being a function of what the digest already covers, it
   is left out of the digest: every schedule (and digest) is what it was before.
8. A plan's decision is the template's (a verb of the family's vocabulary and an
   option) unless the campaign replays the decisions a live run's models made
   (``testbed.campaign.decisions``); then only the decisions differ.
9. Teams beyond the template's role pool (16 agents): roles still name agents
   ``a0``..``a15`` (indices mod N, as for smaller teams) and keys are owned round
   robin, so with N > keys the other agents own nothing and act in nothing: they are
   the peers a policy announces to, reads replicas from or waits for at a barrier
   (sparse dependencies). The workload's size (actions, updates, keys) follows units,
   rho and keys, not N.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import msgpack

from testbed.errors import UserError

FAMILIES = ("reservation", "fulfillment", "deployment")
TEMPLATES_PER_FAMILY = 10
TIERS = ("compact", "artifact")
#: How plans derive from their inputs (rule 3); the first is the default.
DERIVATIONS = ("direct", "template")
MAX_KEYS = 128
MAX_AGENTS = 16
"""The largest team the packet-level testbed runs (``testbed.campaign.networks``
refuses more unless the backend is sim)."""
MAX_SIM_AGENTS = 10_000
"""The largest team the generator builds (rule 9): the sim backend's limit."""
ROLE_POOL = 16
"""Agent indices a template draws its planners and executors from (rule 3); fixed, so
a template's roles, and every schedule, do not depend on the largest team allowed."""
MIN_UNITS = 4
MAX_UNITS = 4096
MAX_SEED = 2**63 - 1
"""The largest campaign seed: every episode row records it in the ``seed`` column, a
signed 64-bit integer (``testbed.results.schema``). (The schedule digest,
:func:`schedule_digest`, and the userspace emulator's configure message carry it as a
msgpack integer, which would allow up to 2**64 - 1.)"""
COMPACT_BYTES = (512, 4096)
ARTIFACT_BYTES = (256 * 1024, 320 * 1024)
_DIGEST_VERSION = 1

# Decision vocabularies per family: the recorded decision a replan replays.
_VERBS = {
    "reservation": ("hold", "book", "rebook", "release", "upgrade"),
    "fulfillment": ("allocate", "pick", "ship", "split", "backorder"),
    "deployment": ("stage", "canary", "promote", "rollback", "pause"),
}


class WorkloadError(UserError):
    """A schedule parameter is outside what the generator supports (caller's input)."""


# --- events ----------------------------------------------------------------------


@dataclass(frozen=True)
class Seed:
    """Initial version of a key, written by its owner before the episode."""

    key: str
    owner: str
    rtype: str
    content: bytes


@dataclass(frozen=True)
class Update:
    """The owner writes a new version of ``key`` (parents: its previous head)."""

    unit: int
    key: str
    owner: str
    rtype: str
    content: bytes


@dataclass(frozen=True)
class Plan:
    """``planner`` derives a plan for ``action`` from the current heads of ``keys``."""

    unit: int
    action: str
    planner: str
    executor: str
    keys: tuple[str, ...]
    depth: int
    decision: str


@dataclass(frozen=True)
class Act:
    """``executor`` attempts the protected ``action`` from the plan it inherited."""

    unit: int
    action: str
    executor: str
    keys: tuple[str, ...]
    critical: str = ""  # the declared critical input (rule 7); "" in single-action trials


Event = Update | Plan | Act


class Counts(NamedTuple):
    actions: int
    updates: int


@dataclass(frozen=True)
class Template:
    """Structural choices a template fixes (derived from its id)."""

    template: str
    family: str
    depth: int
    planners: tuple[int, ...]  # agent indices (mod N) that plan
    executors: tuple[int, ...]  # agent indices (mod N) that execute
    compact_bytes: tuple[int, int]


@dataclass(frozen=True)
class Schedule:
    """One episode's workload; identical for every policy of a cell."""

    seed: int
    family: str
    template: str
    agents: tuple[str, ...]
    keys: tuple[str, ...]
    owners: dict[str, str]
    units: int
    deps: int
    rho: float
    tier: str
    depth: int
    seeds: tuple[Seed, ...]
    events: tuple[Event, ...]
    counts: Counts
    digest: str

    def plans(self) -> list[Plan]:
        return [e for e in self.events if isinstance(e, Plan)]

    def acts(self) -> list[Act]:
        return [e for e in self.events if isinstance(e, Act)]

    def updates(self) -> list[Update]:
        return [e for e in self.events if isinstance(e, Update)]


# --- templates -------------------------------------------------------------------


def template_ids(family: str | None = None) -> list[str]:
    """All template ids of ``family`` (or of every family, family by family)."""
    families = FAMILIES if family is None else (_check_family(family),)
    return [f"{f}-{i:02d}" for f in families for i in range(1, TEMPLATES_PER_FAMILY + 1)]


def round_robin_templates(count: int) -> list[str]:
    """``count`` templates taken round robin across families (3 = one per family)."""
    total = len(FAMILIES) * TEMPLATES_PER_FAMILY
    if not 1 <= count <= total:
        raise WorkloadError(f"templates: {count} is not allowed; allowed: 1..{total}")
    return [f"{FAMILIES[i % len(FAMILIES)]}-{i // len(FAMILIES) + 1:02d}" for i in range(count)]


def template_family(template: str) -> str:
    family, sep, number = template.rpartition("-")
    if (not sep or family not in FAMILIES or not number.isdigit()
            or not 1 <= int(number) <= TEMPLATES_PER_FAMILY or len(number) != 2):
        raise WorkloadError(f"template: {template!r} is not allowed; allowed: <family>-NN "
                            f"with family in {', '.join(FAMILIES)} and NN in "
                            f"01..{TEMPLATES_PER_FAMILY:02d}")
    return family


def describe_template(template: str) -> Template:
    """The structural choices of ``template``, seeded from its id only."""
    family = template_family(template)
    rng = random.Random(seed_int("template", template))
    # Deployments go through a review more often than reservations.
    p_review = {"reservation": 0.3, "fulfillment": 0.5, "deployment": 0.7}[family]
    depth = 1 if rng.random() < p_review else 0
    roles = list(range(ROLE_POOL))
    rng.shuffle(roles)
    n_planners = rng.choice((1, 2))
    planners = tuple(roles[:n_planners])
    executors = tuple(roles[n_planners:n_planners + rng.choice((1, 2, 3))])
    lo = rng.randrange(COMPACT_BYTES[0], COMPACT_BYTES[1] // 2 + 1)
    hi = rng.randrange(lo, COMPACT_BYTES[1] + 1)
    return Template(template, family, depth, planners, executors, (lo, hi))


# --- counts ----------------------------------------------------------------------


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def realised_counts(units: int, rho: float) -> Counts:
    """Protected actions and owner updates realising nominal ``rho`` over ``units``."""
    actions = max(1, _round_half_up(units / (2.0 + rho)))
    updates = max(0, min(_round_half_up(rho * actions), units - 2 * actions))
    return Counts(actions, updates)


# --- generator -------------------------------------------------------------------


def generate_schedule(*, seed: int, family: str, template: str, agents: int = 5,
                      keys: int = 8, units: int = 64, deps: int = 1, rho: float = 4,
                      tier: str = "compact", derivation: str = DERIVATIONS[0],
                      decide: Callable[[int], str] | None = None) -> Schedule:
    """Build the seeded schedule of one episode (see the module rules).

    ``decide(i)`` gives the decision of the ``i``-th plan in place of the template's
    (recorded decisions of a live run, rule 8); every seeded draw stays the same."""
    _check_params(family, template, agents, keys, units, deps, rho, tier)
    if derivation not in DERIVATIONS:
        raise WorkloadError(f"derivation: {derivation!r} is not allowed; allowed: "
                            f"{', '.join(DERIVATIONS)}")
    shape = describe_template(template)
    depth = shape.depth if derivation == "template" else 0
    agent_ids = tuple(f"a{i}" for i in range(agents))
    key_ids = tuple(f"k{i:03d}" for i in range(keys))
    owners = {k: agent_ids[i % agents] for i, k in enumerate(key_ids)}
    params = (seed, family, template, agents, keys, units, deps, float(rho), tier)
    rng = random.Random(seed_int("schedule", *params))
    rtype = "requirement" if tier == "compact" else "artifact"

    def content(label: str) -> bytes:
        if tier == "compact":
            size = rng.randint(*shape.compact_bytes)
        else:
            size = rng.randint(*ARTIFACT_BYTES)
        header = f"{template}/{label}\n".encode()
        return header + rng.randbytes(max(0, size - len(header)))

    seeds = tuple(Seed(k, owners[k], rtype, content(f"{k}/v0")) for k in key_ids)
    counts = realised_counts(units, rho)
    per_block = [counts.updates // counts.actions] * counts.actions
    for block in rng.sample(range(counts.actions), counts.updates % counts.actions):
        per_block[block] += 1

    events: list[Event] = []
    versions = dict.fromkeys(key_ids, 0)
    unit = 0
    for index in range(counts.actions):
        action = f"act{index:03d}"
        planner, executor = template_roles(rng, shape, agents)
        declared = tuple(sorted(rng.sample(key_ids, deps)))
        verb = rng.choice(_VERBS[family])
        decision = f"{verb}:option-{rng.randrange(1, 100):02d}"
        if decide is not None:
            decision = decide(index)
        events.append(Plan(unit, action, agent_ids[planner], agent_ids[executor], declared,
                           depth, decision))
        unit += 1
        relevant_at = rng.randrange(per_block[index]) if per_block[index] else -1
        for n in range(per_block[index]):
            key = rng.choice(declared) if n == relevant_at else rng.choice(key_ids)
            versions[key] += 1
            events.append(Update(unit, key, owners[key], rtype,
                                 content(f"{key}/v{versions[key]}")))
            unit += 1
        events.append(Act(unit, action, agent_ids[executor], declared,
                          critical_input(params, action, declared)))
        unit += 1
    assert unit <= units, "realised_counts keeps every event inside the horizon"

    digest = schedule_digest(params, owners, depth, seeds, events)
    return Schedule(seed=seed, family=family, template=template, agents=agent_ids,
                    keys=key_ids, owners=owners, units=units, deps=deps, rho=float(rho),
                    tier=tier, depth=depth, seeds=seeds, events=tuple(events),
                    counts=counts, digest=digest)


def critical_input(params: tuple[object, ...], action: str, declared: tuple[str, ...]) -> str:
    """The action's declared critical input (rule 7): its own seeded draw."""
    return random.Random(seed_int("critical", *params, action)).choice(declared)


def template_roles(rng: random.Random, shape: Template, agents: int) -> tuple[int, int]:
    """A planner and a different executor, from the template's role pools."""
    planner = rng.choice(shape.planners) % agents
    executors = [e % agents for e in shape.executors if e % agents != planner]
    if not executors:
        executors = [a for a in range(agents) if a != planner]
    return planner, rng.choice(executors)


def _check_family(family: str) -> str:
    if family not in FAMILIES:
        raise WorkloadError(f"family: {family!r} is not allowed; allowed: {', '.join(FAMILIES)}")
    return family


def _check_params(family: str, template: str, agents: int, keys: int, units: int,
                  deps: int, rho: float, tier: str) -> None:
    _check_family(family)
    if template_family(template) != family:
        raise WorkloadError(f"template: {template!r} is not a {family} template; allowed: "
                            f"{family}-01..{family}-{TEMPLATES_PER_FAMILY:02d}")
    if not 2 <= agents <= MAX_SIM_AGENTS:
        raise WorkloadError(f"agents: {agents} is not allowed; allowed: 2..{MAX_SIM_AGENTS}")
    if not 1 <= keys <= MAX_KEYS:
        raise WorkloadError(f"keys: {keys} is not allowed; allowed: 1..{MAX_KEYS}")
    if not MIN_UNITS <= units <= MAX_UNITS:
        raise WorkloadError(f"units: {units} is not allowed; allowed: {MIN_UNITS}..{MAX_UNITS}")
    if not 1 <= deps <= keys:
        raise WorkloadError(f"deps: {deps} is not allowed; allowed: 1..keys ({keys})")
    if not (math.isfinite(rho) and rho > 0):
        raise WorkloadError(f"rho: {rho} is not allowed; allowed: finite numbers > 0")
    if tier not in TIERS:
        raise WorkloadError(f"tier: {tier!r} is not allowed; allowed: {', '.join(TIERS)}")


def seed_int(*parts: object) -> int:
    """A 64-bit seed from any parts (stable across runs and machines)."""
    text = "\x1f".join(repr(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def schedule_digest(params: tuple[object, ...], owners: dict[str, str], depth: int,
                    seeds: tuple[Seed, ...], events: list[Event]) -> str:
    """What identifies a schedule: its parameters, owners, depth, seeds and events."""
    def h(data: bytes) -> bytes:
        return hashlib.blake2b(data, digest_size=16).digest()

    body: list[object] = [_DIGEST_VERSION, list(params), sorted(owners.items()), depth,
                          [[s.key, s.owner, s.rtype, h(s.content)] for s in seeds]]
    for e in events:
        if isinstance(e, Update):
            body.append(["u", e.unit, e.key, e.owner, e.rtype, h(e.content)])
        elif isinstance(e, Plan):
            body.append(["p", e.unit, e.action, e.planner, e.executor, list(e.keys), e.depth,
                         e.decision])
        else:
            body.append(["a", e.unit, e.action, e.executor, list(e.keys)])
    return hashlib.blake2b(msgpack.packb(body, use_bin_type=True), digest_size=16).hexdigest()
