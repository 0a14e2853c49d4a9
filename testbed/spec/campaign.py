"""The campaign model: options, cells, groups and the episodes of a campaign (pure data).

Rules this module obeys:

1. ``[grid]`` (one table) or ``[[grid]]`` (several slices) lists values per field;
   the cells are the union of each slice's cartesian product, in file order, without
   duplicates. Fields left out take the paper's defaults (:data:`GRID_DEFAULTS`).
2. Episodes are (cell, template) pairs ordered so that cells sharing a topology
   (network, trace offset, agents, central service or not) are contiguous; within a
   group, templates are the outer loop so paired policies run close together in time.
3. A schedule depends only on the seed, the template and the cell's workload fields,
   never on the policy, the network or the connection setting.

Files become campaigns in ``testbed.spec.parse``; the loop that runs them is
``testbed.run.loop``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from testbed.errors import UserError
from testbed.spec.vocabulary import policy_needs_central
from testbed.spec.workload import (
    Schedule,
    WorkloadError,
    generate_schedule,
    round_robin_templates,
    template_family,
)

GRID_FIELDS = ("policy", "network", "trace_offset_s", "rho", "keys", "agents", "deps",
               "connection", "tier", "units")
GRID_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "trace_offset_s": (0.0,), "rho": (4.0,), "keys": (8,), "agents": (5,), "deps": (1,),
    "connection": ("fresh",), "tier": ("compact",), "units": (64,),
}


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
    delay_ms: float | None = None  # one-way delay of the ``fixed`` profile; None: its default
    episode_timeout_s: float = 600.0


@dataclass(frozen=True)
class Execution:
    """Where a campaign runs (``[execution]``; command-line flags override it). Not part
    of the campaign's identity: a run may be resumed on another engine."""

    cluster: str | None = None  # None: this process; "local:N" or "tcp://HOST:PORT"
    jobs: int = 1
    allow_mixed_backends: bool = False


class GroupKey(NamedTuple):
    """What a topology depends on: cells with equal keys can share one."""

    network: str
    trace_offset_s: float
    agents: int
    central: bool

    @property
    def id(self) -> str:
        return (f"{self.network}_o{fmt_number(self.trace_offset_s)}_n{self.agents}"
                f"{'_central' if self.central else ''}")


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
    connection: str
    tier: str
    units: int

    @property
    def id(self) -> str:
        """Stable, filesystem-safe identifier (also the prefix of episode keys)."""
        return (f"{self.policy.replace('/', '-')}_{self.network}_o{fmt_number(self.trace_offset_s)}"
                f"_r{fmt_number(self.rho)}_x{self.keys}_n{self.agents}_d{self.deps}"
                f"_{self.connection}_{self.tier}_t{self.units}")

    @property
    def needs_central(self) -> bool:
        return policy_needs_central(self.policy)

    @property
    def group_key(self) -> GroupKey:
        return GroupKey(self.network, self.trace_offset_s, self.agents, self.needs_central)

    def columns(self) -> dict[str, Any]:
        return {"cell": self.id, "policy": self.policy, "network": self.network,
                "trace_offset_s": self.trace_offset_s, "connection": self.connection,
                "agents": self.agents, "keys": self.keys, "deps": self.deps, "rho": self.rho,
                "tier": self.tier, "units": self.units}


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

    def cells(self) -> list[Cell]:
        cells: dict[Cell, None] = {}
        for grid in self.grids:
            for values in itertools.product(*(grid[f] for f in GRID_FIELDS)):
                cells.setdefault(Cell(*values), None)
        return list(cells)

    def groups(self) -> list[tuple[GroupKey, list[Cell]]]:
        """Cells by topology, groups in order of first appearance."""
        grouped: dict[GroupKey, list[Cell]] = {}
        for cell in self.cells():
            grouped.setdefault(cell.group_key, []).append(cell)
        return list(grouped.items())

    def episodes(self) -> list[tuple[Cell, str]]:
        return [(cell, template) for _, cells in self.groups()
                for template in self.templates for cell in cells]

    def schedule(self, cell: Cell, template: str) -> Schedule:
        return generate_schedule(seed=self.seed, family=template_family(template),
                                 template=template, agents=cell.agents, keys=cell.keys,
                                 units=cell.units, deps=cell.deps, rho=cell.rho, tier=cell.tier)

    def with_templates(self, count: int) -> Campaign:
        """The same campaign over ``count`` templates taken round robin across families."""
        try:
            return replace(self, templates=tuple(round_robin_templates(count)))
        except WorkloadError as exc:
            raise CampaignError(str(exc)) from None

    def config(self) -> dict[str, Any]:
        """Normalised configuration (what the manifest stores and --resume compares)."""
        return {"name": self.name, "seed": self.seed, "templates": list(self.templates),
                "description": self.description,
                "options": {k: getattr(self.options, k) for k in Options.__dataclass_fields__},
                "grid": [{f: list(g[f]) for f in GRID_FIELDS} for g in self.grids]}
