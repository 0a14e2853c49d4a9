"""The campaign model: options, cells, groups and the episodes of a campaign (pure data).

Rules this module obeys:

1. ``[grid]`` (one table) or ``[[grid]]`` (several slices) lists values per field;
   the cells are the union of each slice's cartesian product, in file order, without
   duplicates. Fields left out take the paper's defaults (:data:`GRID_DEFAULTS`).
2. Episodes are (cell, template) pairs ordered so that cells sharing a topology
   (network, trace offset, agents, central service or not) are contiguous; within a
   group, templates are the outer loop so paired policies run close together in time.
3. A schedule depends only on the seed, the template, the cell's workload fields and
   the ``derivation`` option, never on the policy, the network, the connection setting,
   the batch or a study setting (replanning delay, update rate, scenario).
4. A campaign has a ``kind``: ``episodes`` (the workload of ``testbed.campaign.workload``)
   or a study of single-action trials (``testbed.campaign.trials``). Study kinds add their
   grid fields (:data:`STUDY_FIELDS`); ``batch`` (any kind) repeats identical cells as
   separate batches, each on its own topology, one batch after another.
5. Fields that did not exist before (a kind, a batch, a study field, an option at its
   default) are left out of :meth:`Campaign.config` when they keep the earlier
   behaviour, so runs recorded before them still resume. ``derivation`` is always
   recorded: its default changed (runs recorded without it used ``template``).
6. A campaign's own networks (``[networks.NAME]``, ``testbed.links.netdef``) sit beside
   the registered ones; :meth:`Campaign.network_profile` is the one place a cell's
   network name becomes the profile a topology is built from.

Files become campaigns in ``testbed.campaign.parse``; the loop that runs them is
``testbed.run.loop``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from nodes.transport import Connection
from testbed.campaign.command import COMMAND_KIND, CommandWorkload, command_to_data
from testbed.campaign.decisions import RecordedDecisions
from testbed.campaign.endpoint import ModelSettings
from testbed.campaign.live import EXECUTOR_INPUTS, LIVE_KIND, OVERLAPS, live_schedule
from testbed.campaign.trials import KINDS, SCENARIOS, TRIAL_KINDS, trial_schedule
from testbed.campaign.vocabulary import policy_needs_central
from testbed.campaign.workload import (
    DERIVATIONS,
    Schedule,
    WorkloadError,
    generate_schedule,
    round_robin_templates,
    template_family,
)
from testbed.errors import UserError
from testbed.links.netdef import network_to_data
from testbed.links.profiles import NetworkProfile, get_profile

GRID_FIELDS = ("policy", "network", "trace_offset_s", "rho", "keys", "agents", "deps",
               "connection", "tier", "units")
GRID_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "trace_offset_s": (0.0,), "rho": (4.0,), "keys": (8,), "agents": (5,), "deps": (1,),
    "connection": ("fresh",), "tier": ("compact",), "units": (64,),
}
#: Grid fields every kind accepts beyond :data:`GRID_FIELDS`.
EXTRA_FIELDS = ("batch",)
#: Grid fields of each study kind.
STUDY_FIELDS: dict[str, tuple[str, ...]] = {
    "episodes": (), "replanning": ("replan_delay_s", "update_rate_per_s", "update_target"),
    "handoff": ("scenario",), LIVE_KIND: ("executor_inputs", "overlap"), COMMAND_KIND: (),
}
STUDY_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "batch": (1,), "replan_delay_s": (0.0,), "update_rate_per_s": (0.0,),
    "update_target": ("relevant",), "scenario": SCENARIOS,
    "executor_inputs": EXECUTOR_INPUTS[:1], "overlap": OVERLAPS[:1],
}
#: Workload fields a trial does not use: a trial campaign keeps them at their defaults.
TRIAL_FIXED = ("rho", "units", "deps")
#: Options added after the first recorded runs, with the default that keeps their old
#: behaviour (rule 5); ``derivation`` is not one of them (its default changed).
NEW_OPTION_DEFAULTS: dict[str, Any] = {"action_deadline_s": 30.0, "effect_delay_s": 0.0,
                                       "link_log": False, "wire_encoding": "msgpack"}


class CampaignError(UserError):
    """A campaign file or run request is wrong (the user's input); one-line message."""


def fmt_number(x: float) -> str:
    """A number as campaign files and ids write it: 4 not 4.0, 0.25 as is."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


@dataclass(frozen=True)
class Options:
    """Campaign-wide settings that are not grid dimensions."""

    rpc_timeout_s: float = 10.0
    durability: str = "full"
    backend: str = "auto"
    delay_ms: float | None = None  # one-way delay of the built-in networks; None: theirs
    episode_timeout_s: float = 600.0
    #: How plans derive from their inputs (``testbed.campaign.workload`` rule 3).
    derivation: str = DERIVATIONS[0]
    #: Trials: a decision still pending this long after the action started blocks.
    action_deadline_s: float = 30.0
    #: Trials: time between a release and its recorded effect.
    effect_delay_s: float = 0.0
    link_log: bool = False  # per-episode packet logs of every link (Mahimahi format)
    #: Records and head entries on the wire: compact msgpack maps or the paper's JSON.
    wire_encoding: str = "msgpack"


@dataclass(frozen=True)
class Execution:
    """Where a campaign runs (``[execution]``; command-line flags override it). Not part
    of the campaign's identity: a run may be resumed on another engine."""

    cluster: str | None = None  # None: this process; "local:N" or "tcp://HOST:PORT"
    jobs: int = 1
    allow_mixed_backends: bool = False


class GroupKey(NamedTuple):
    """What a topology depends on: cells with equal keys can share one (a batch > 1
    gets topologies of its own)."""

    network: str
    trace_offset_s: float
    agents: int
    central: bool
    batch: int = 1

    @property
    def id(self) -> str:
        return (f"{self.network}_o{fmt_number(self.trace_offset_s)}_n{self.agents}"
                f"{'_central' if self.central else ''}"
                f"{f'_b{self.batch}' if self.batch != 1 else ''}")


@dataclass(frozen=True)
class Cell:
    """One point of the grid: a policy under one network and workload setting."""

    policy: str
    network: str
    trace_offset_s: float
    rho: float
    keys: int
    agents: int
    deps: int
    connection: Connection
    tier: str
    units: int
    batch: int = 1
    replan_delay_s: float | None = None  # replanning trials
    update_rate_per_s: float | None = None
    update_target: str | None = None
    scenario: str | None = None  # handoff trials
    executor_inputs: str | None = None  # live workflows
    overlap: str | None = None
    own_program: bool = False  # a command workload's cell: ``policy`` is a label

    @property
    def id(self) -> str:
        """Stable, filesystem-safe identifier (also the prefix of episode keys); fields
        at their earlier behaviour add nothing, so earlier ids are unchanged."""
        base = (f"{self.policy.replace('/', '-')}_{self.network}_o{fmt_number(self.trace_offset_s)}"
                f"_r{fmt_number(self.rho)}_x{self.keys}_n{self.agents}_d{self.deps}"
                f"_{self.connection}_{self.tier}_t{self.units}")
        if self.replan_delay_s is not None and self.update_rate_per_s is not None:
            base += (f"_delay{fmt_number(self.replan_delay_s)}"
                     f"_lambda{fmt_number(self.update_rate_per_s)}_{self.update_target}")
        if self.scenario is not None:
            base += f"_{self.scenario}"
        if self.executor_inputs is not None and self.overlap is not None:
            base += f"_exec-{self.executor_inputs}_overlap-{self.overlap}"
        return base + (f"_b{self.batch}" if self.batch != 1 else "")

    @property
    def needs_central(self) -> bool:
        return not self.own_program and policy_needs_central(self.policy)

    @property
    def group_key(self) -> GroupKey:
        return GroupKey(self.network, self.trace_offset_s, self.agents, self.needs_central,
                        self.batch)

    def columns(self) -> dict[str, Any]:
        return {"cell": self.id, "policy": self.policy, "network": self.network,
                "trace_offset_s": self.trace_offset_s, "connection": self.connection,
                "agents": self.agents, "keys": self.keys, "deps": self.deps, "rho": self.rho,
                "tier": self.tier, "units": self.units, "batch": self.batch,
                "replan_delay_s": self.replan_delay_s,
                "update_rate_per_s": self.update_rate_per_s, "update_target": self.update_target,
                "scenario": self.scenario, "executor_inputs": self.executor_inputs,
                "overlap": self.overlap}


def episode_key(cell: Cell, template: str) -> str:
    return f"{cell.id}/{template}"


@dataclass(frozen=True)
class Campaign:
    """A validated campaign (build one with :func:`load_campaign`)."""

    name: str
    seed: int
    templates: tuple[str, ...]
    grids: tuple[Mapping[str, tuple[Any, ...]], ...]
    options: Options = field(default_factory=Options)
    description: str = ""
    source: str = ""
    execution: Execution = field(default_factory=Execution)
    kind: str = KINDS[0]
    #: A live campaign's endpoint (``[model]``; ``testbed.campaign.endpoint``).
    model: ModelSettings | None = None
    #: A replay campaign's plan decisions from a live run (``decisions = "..."``).
    decisions: RecordedDecisions | None = None
    #: The programs of a ``kind = "command"`` campaign (``testbed.campaign.command``).
    command: CommandWorkload | None = None

    @property
    def fields(self) -> tuple[str, ...]:
        """The grid fields of this campaign's kind, in cell order."""
        return (*GRID_FIELDS, *EXTRA_FIELDS, *STUDY_FIELDS[self.kind])
    networks: Mapping[str, NetworkProfile] = field(default_factory=dict)
    #: Policy plugins every node imports (``testbed.campaign.plugins``), as resolved.
    plugins: tuple[str, ...] = ()

    def cells(self) -> list[Cell]:
        cells: dict[Cell, None] = {}
        names = self.fields
        for grid in self.grids:
            for values in itertools.product(*(grid.get(f, STUDY_DEFAULTS.get(f, (None,)))
                                              for f in names)):
                cell = Cell(**dict(zip(names, values, strict=True)))
                if self.kind == COMMAND_KIND:
                    cell = replace(cell, own_program=True)
                cells.setdefault(cell, None)
        return list(cells)

    def groups(self) -> list[tuple[GroupKey, list[Cell]]]:
        """Cells by topology, groups in order of first appearance, batch by batch."""
        grouped: dict[GroupKey, list[Cell]] = {}
        for cell in self.cells():
            grouped.setdefault(cell.group_key, []).append(cell)
        return sorted(grouped.items(), key=lambda item: item[0].batch)

    def episodes(self) -> list[tuple[Cell, str]]:
        return [(cell, template) for _, cells in self.groups()
                for template in self.templates for cell in cells]

    def schedule(self, cell: Cell, template: str) -> Schedule:
        family = template_family(template)
        if self.kind == LIVE_KIND:
            return live_schedule(seed=self.seed, family=family, template=template,
                                 agents=cell.agents, keys=cell.keys)
        recorded = self.decisions
        decide = None if recorded is None else (
            lambda i: recorded.decision(family, template, i))
        if self.kind in TRIAL_KINDS:
            return trial_schedule(seed=self.seed, family=family, template=template,
                                  agents=cell.agents, keys=cell.keys, tier=cell.tier,
                                  derivation=self.options.derivation, kind=self.kind,
                                  decide=decide)
        return generate_schedule(seed=self.seed, family=family, template=template,
                                 agents=cell.agents, keys=cell.keys, units=cell.units,
                                 deps=cell.deps, rho=cell.rho, tier=cell.tier,
                                 derivation=self.options.derivation, decide=decide)

    def with_templates(self, count: int) -> Campaign:
        """The same campaign over ``count`` templates taken round robin across families."""
        try:
            return replace(self, templates=tuple(round_robin_templates(count)))
        except WorkloadError as exc:
            raise CampaignError(str(exc)) from None

    def network_profile(self, name: str) -> NetworkProfile:
        """The profile cells of network NAME run on (rule 6): the campaign's own
        definition, else the registered network with ``options.delay_ms`` applied to
        its links."""
        if name in self.networks:
            return self.networks[name]
        probe = get_profile(name)
        delay = None if probe.link is None else self.options.delay_ms
        return get_profile(name, delay_ms=delay) if delay is not None else probe

    def network_names(self) -> list[str]:
        """Every network the grid names, in order of first appearance."""
        return list(dict.fromkeys(c.network for c in self.cells()))

    def config(self) -> dict[str, Any]:
        """Normalised configuration (what the manifest stores and --resume compares);
        rule 5 says which fields are left out at their defaults."""
        options = {k: getattr(self.options, k) for k in Options.__dataclass_fields__
                   if k not in NEW_OPTION_DEFAULTS
                   or getattr(self.options, k) != NEW_OPTION_DEFAULTS[k]}
        batches = any(tuple(g.get("batch", (1,))) != (1,) for g in self.grids)
        names = [*GRID_FIELDS, *(["batch"] if batches else []), *STUDY_FIELDS[self.kind]]
        config: dict[str, Any] = {
            "name": self.name, "seed": self.seed, "templates": list(self.templates),
            "description": self.description, "options": options,
            "grid": [{f: list(g.get(f, STUDY_DEFAULTS.get(f, ()))) for f in names}
                     for g in self.grids]}
        if self.kind != KINDS[0]:
            config["kind"] = self.kind
        if self.networks:
            config["networks"] = {n: network_to_data(p) for n, p in self.networks.items()}
        if self.model is not None:
            config["model"] = self.model.to_data()
        if self.decisions is not None:
            config["decisions"] = self.decisions.describe()
        if self.plugins:
            config["plugins"] = list(self.plugins)
        if self.command is not None:
            config["command"] = command_to_data(self.command)
        return config
