"""Campaigns: TOML files, validation, the grid of cells, and the resumable campaign loop.

Rules this module obeys:

1. A campaign file is validated completely before anything runs; every error is one
   line naming the field and the allowed values (:class:`CampaignError`).
2. ``[grid]`` (one table) or ``[[grid]]`` (several slices) lists values per field;
   the cells are the union of each slice's cartesian product, in file order, without
   duplicates. Fields left out take the paper's defaults (:data:`GRID_DEFAULTS`).
3. Episodes are (cell, template) pairs ordered so that cells sharing a topology
   (network, trace offset, agents, central service or not) are contiguous; within a
   group, templates are the outer loop so paired policies run close together in time.
4. The run directory (``testbed.results_io``) makes the loop resumable: an episode is
   marked started before it runs and committed by renaming its episode shard; on
   ``--resume`` every committed episode is skipped, every other one (never started,
   or started and killed) runs.
5. ``--extend`` is ``--resume`` for a campaign that has grown: same name, seed and
   options, every template and cell of the existing run still present; the new cells
   and templates run, the committed episodes are kept (schedules depend only on the
   seed, the template and the cell, so old and new episodes are paired as if the grid
   had been that large from the start).
6. ``jobs > 1`` runs that many groups at once, each on its own topology (own run
   prefix, namespaces, emulator and node processes). Work is split per (group,
   template), so a template's policies still run back to back on one topology. On an
   emulated LTE link an episode spends almost all of its time waiting on the link
   (about 5% of one core for a whole team), so lanes do not contend. On loopback they
   would, and stall there is CPU time, so loopback units always run first and alone,
   one at a time, whatever ``jobs`` is (docs/campaigns.md).
7. An aborted episode (the runner raised :class:`EpisodeAborted`, or it outlived
   ``options.episode_timeout_s`` by :data:`BACKSTOP_GRACE_S`) is recorded with
   ``aborted = True`` and its reason, no action rows and no costs (nothing imputed);
   its ``scheduled_actions`` keep its slots in availability denominators. The group's
   topology and processes are then closed and reopened before the next episode, so a
   dead node cannot abort the rest of the group.
"""

from __future__ import annotations

import itertools
import math
import re
import time
import tomllib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import pandas as pd
import trio
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from protocols.policies import policy_names
from testbed.results_io import (
    ACTION_COLUMNS,
    EPISODE_COLUMNS,
    RUNNER_ACTION_FIELDS,
    RUNNER_EPISODE_FIELDS,
    ResultRowError,
    RunDir,
    RunDirError,
    check_fields,
    git_revision,
    host_description,
    package_versions,
)
from testbed.workload import (
    FAMILIES,
    MAX_AGENTS,
    MAX_KEYS,
    MAX_UNITS,
    MIN_UNITS,
    TEMPLATES_PER_FAMILY,
    TIERS,
    Schedule,
    WorkloadError,
    generate_schedule,
    round_robin_templates,
    template_family,
)

__all__ = [
    "ACTION_COLUMNS",
    "EPISODE_COLUMNS",
    "Campaign",
    "CampaignError",
    "Cell",
    "EpisodeAborted",
    "EpisodeResult",
    "Group",
    "GroupKey",
    "Options",
    "RunDir",
    "RunDirError",
    "RunSummary",
    "Runner",
    "episode_key",
    "load_campaign",
    "parse_campaign",
    "preset_names",
    "print_summary",
    "run_campaign",
    "summary_frame",
]

# --- allowed values ---------------------------------------------------------------------

#: Policy names a campaign may use (kept in step with protocols.policies registrations).
POLICY_NAMES = tuple(policy_names())  # the registry is the single source of names
#: Barrier intervals accepted as ``metadata_sync/K``.
METADATA_SYNC_K = (1, 2, 4, 8, 16)
#: Policies whose cells need the central metadata directory in the topology.
CENTRAL_POLICIES = frozenset({"centralized_lineage"})
NETWORKS = ("loopback", "fixed", "att", "att2016", "tmobile", "verizon")
RHOS = (0.25, 1.0, 4.0, 16.0)
CONNECTIONS = ("fresh", "reuse")
BACKENDS = ("auto", "userspace", "netem")
DURABILITY = ("full", "normal")
GRID_FIELDS = ("policy", "network", "trace_offset_s", "rho", "keys", "agents", "deps",
               "connection", "tier", "units")
GRID_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "trace_offset_s": (0.0,), "rho": (4.0,), "keys": (8,), "agents": (5,), "deps": (1,),
    "connection": ("fresh",), "tier": ("compact",), "units": (64,),
}
TOP_FIELDS = ("name", "seed", "templates", "description", "options", "grid")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_MAX_TEMPLATES = len(FAMILIES) * TEMPLATES_PER_FAMILY
#: The runner enforces options.episode_timeout_s itself; the loop cancels an episode
#: that outlives it by this much (a backstop against a runner that hangs).
BACKSTOP_GRACE_S = 30.0


class CampaignError(ValueError):
    """A campaign file or run request is wrong (the user's input); one-line message."""


class EpisodeAborted(Exception):
    """Raised by a runner when an episode cannot finish (node failure, timeout)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --- model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """Campaign-wide settings that are not grid dimensions."""

    rpc_timeout_s: float = 10.0
    durability: str = "full"
    backend: str = "auto"
    delay_ms: float | None = None  # one-way delay of the ``fixed`` profile; None: its default
    episode_timeout_s: float = 600.0


class GroupKey(NamedTuple):
    """What a topology depends on: cells with equal keys can share one."""

    network: str
    trace_offset_s: float
    agents: int
    central: bool

    @property
    def id(self) -> str:
        return (f"{self.network}_o{_fmt(self.trace_offset_s)}_n{self.agents}"
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
        return (f"{self.policy.replace('/', '-')}_{self.network}_o{_fmt(self.trace_offset_s)}"
                f"_r{_fmt(self.rho)}_x{self.keys}_n{self.agents}_d{self.deps}"
                f"_{self.connection}_{self.tier}_t{self.units}")

    @property
    def needs_central(self) -> bool:
        return self.policy.partition("/")[0] in CENTRAL_POLICIES

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
        return replace(self, templates=tuple(_templates(count, "templates")))

    def config(self) -> dict[str, Any]:
        """Normalised configuration (what the manifest stores and --resume compares)."""
        return {"name": self.name, "seed": self.seed, "templates": list(self.templates),
                "description": self.description,
                "options": {k: getattr(self.options, k) for k in Options.__dataclass_fields__},
                "grid": [{f: list(g[f]) for f in GRID_FIELDS} for g in self.grids]}


# --- loading and validation ---------------------------------------------------------------


def preset_names() -> list[str]:
    folder = resources.files("testbed") / "presets"
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir()
                  if p.name.endswith(".toml"))


def load_campaign(name_or_path: str | Path) -> Campaign:
    """Load a shipped preset by name, or a campaign file by path."""
    text = str(name_or_path)
    path = Path(text)
    if path.is_file():
        return _parse_text(path.read_text(), str(path))
    presets = preset_names()
    if text in presets:
        preset = resources.files("testbed") / "presets" / f"{text}.toml"
        return _parse_text(preset.read_text(), f"preset {text}")
    kind = "file not found" if text.endswith(".toml") or "/" in text else \
        "neither a file nor a preset"
    raise CampaignError(f"campaign: {text!r} is {kind}; presets: {', '.join(presets)}")


def _parse_text(text: str, source: str) -> Campaign:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CampaignError(f"{source}: invalid TOML: {exc}") from None
    return parse_campaign(data, source=source)


def parse_campaign(data: Mapping[str, Any], *, source: str = "<campaign>") -> Campaign:
    """Validate a decoded campaign table (see docs/campaigns.md for the format)."""
    _no_unknown(data, TOP_FIELDS, "campaign")
    for required in ("name", "seed", "templates", "grid"):
        if required not in data:
            raise CampaignError(f"{required}: missing; a campaign needs "
                                "name, seed, templates and [grid]")
    name = data["name"]
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise CampaignError(f"name: {name!r} is not allowed; allowed: 1-64 letters, digits, "
                            "'_', '.', '-' (starting with a letter or digit)")
    seed = data["seed"]
    if not _is_int(seed) or seed < 0:
        raise CampaignError(f"seed: {seed!r} is not allowed; allowed: an integer >= 0")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise CampaignError(f"description: {description!r} is not allowed; allowed: a string")
    templates = _templates(data["templates"], "templates")
    options = _options(data.get("options", {}))
    raw_grid = data["grid"]
    grids: tuple[dict[str, tuple[Any, ...]], ...]
    if isinstance(raw_grid, Mapping):
        grids = (_grid(raw_grid, "grid"),)
    elif isinstance(raw_grid, list) and raw_grid and all(isinstance(g, Mapping)
                                                         for g in raw_grid):
        grids = tuple(_grid(g, f"grid[{i}]") for i, g in enumerate(raw_grid))
    else:
        raise CampaignError("grid: expected a [grid] table or [[grid]] tables")
    return Campaign(name=name, seed=int(seed), templates=tuple(templates), grids=grids,
                    options=options, description=description, source=source)


def _templates(value: Any, where: str) -> list[str]:
    if _is_int(value):
        if not 1 <= value <= _MAX_TEMPLATES:
            raise CampaignError(f"{where}: {value} is not allowed; allowed: a count "
                                f"1..{_MAX_TEMPLATES} or a list of template ids")
        return round_robin_templates(int(value))
    if not isinstance(value, list) or not value:
        raise CampaignError(f"{where}: {value!r} is not allowed; allowed: a count "
                            f"1..{_MAX_TEMPLATES} or a non-empty list of template ids")
    for item in value:
        try:
            if not isinstance(item, str):
                raise WorkloadError(repr(item))
            template_family(item)
        except WorkloadError:
            raise CampaignError(f"{where}: {item!r} is not allowed; allowed: <family>-NN with "
                                f"family in {', '.join(FAMILIES)} and NN in "
                                f"01..{TEMPLATES_PER_FAMILY:02d}") from None
    _no_duplicates(value, where)
    return [str(v) for v in value]


def _options(value: Any) -> Options:
    if not isinstance(value, Mapping):
        raise CampaignError("options: expected an [options] table")
    allowed = tuple(Options.__dataclass_fields__)
    _no_unknown(value, allowed, "options")
    out: dict[str, Any] = {}
    for key in ("rpc_timeout_s", "episode_timeout_s"):
        if key in value:
            out[key] = _number(value[key], f"options.{key}", "a number > 0", lo=0,
                               lo_open=True)
    if "delay_ms" in value:
        out["delay_ms"] = _number(value["delay_ms"], "options.delay_ms", "a number >= 0", lo=0)
    for key, choices in (("durability", DURABILITY), ("backend", BACKENDS)):
        if key in value:
            out[key] = _choice(value[key], f"options.{key}", choices)
    return Options(**out)


def _grid(raw: Mapping[str, Any], where: str) -> dict[str, tuple[Any, ...]]:
    _no_unknown(raw, GRID_FIELDS, where)
    for required in ("policy", "network"):
        if required not in raw:
            raise CampaignError(f"{where}.{required}: missing; list at least one value")
    grid: dict[str, tuple[Any, ...]] = {}
    for name in GRID_FIELDS:
        values = _as_list(raw[name], f"{where}.{name}") if name in raw else \
            list(GRID_DEFAULTS[name])
        grid[name] = tuple(_grid_value(name, v, f"{where}.{name}") for v in values)
        _no_duplicates(list(grid[name]), f"{where}.{name}")
    too_many = [d for d in grid["deps"] if d > min(grid["keys"])]
    if too_many:
        raise CampaignError(f"{where}.deps: {too_many[0]} exceeds {where}.keys "
                            f"{min(grid['keys'])}; allowed: deps <= keys")
    return grid


def _grid_value(name: str, value: Any, where: str) -> Any:
    if name == "policy":
        return _policy(value, where)
    if name == "network":
        return _choice(value, where, NETWORKS)
    if name == "connection":
        return _choice(value, where, CONNECTIONS)
    if name == "tier":
        return _choice(value, where, TIERS)
    if name == "rho":
        if _is_number(value) and float(value) in RHOS:
            return float(value)
        raise CampaignError(f"{where}: {_fmt_value(value)} is not allowed; allowed: "
                            f"{', '.join(_fmt(r) for r in RHOS)}")
    if name == "trace_offset_s":
        return _number(value, where, "numbers >= 0 (seconds into the trace)", lo=0)
    limits = {"keys": (1, MAX_KEYS), "agents": (2, MAX_AGENTS), "deps": (1, MAX_KEYS),
              "units": (MIN_UNITS, MAX_UNITS)}
    lo, hi = limits[name]
    if _is_int(value) and lo <= value <= hi:
        return int(value)
    raise CampaignError(f"{where}: {_fmt_value(value)} is not allowed; allowed: "
                        f"integers {lo}..{hi}")


def _policy(value: Any, where: str) -> str:
    if isinstance(value, str):
        name, sep, param = value.partition("/")
        if not sep and name in POLICY_NAMES:
            return value
        if (sep and name == "metadata_sync" and param.isdigit()
                and int(param) in METADATA_SYNC_K and str(int(param)) == param):
            return value
    raise CampaignError(f"{where}: {_fmt_value(value)} is not allowed; allowed: "
                        f"{', '.join(POLICY_NAMES)}, metadata_sync/K with K in "
                        f"{', '.join(map(str, METADATA_SYNC_K))}")


def _choice(value: Any, where: str, choices: Sequence[str]) -> str:
    if isinstance(value, str) and value in choices:
        return value
    raise CampaignError(f"{where}: {_fmt_value(value)} is not allowed; allowed: "
                        f"{', '.join(choices)}")


def _number(value: Any, where: str, allowed: str, *, lo: float, lo_open: bool = False
            ) -> float:
    if _is_number(value) and math.isfinite(value) and (value > lo if lo_open else value >= lo):
        return float(value)
    raise CampaignError(f"{where}: {_fmt_value(value)} is not allowed; allowed: {allowed}")


def _as_list(value: Any, where: str) -> list[Any]:
    if isinstance(value, list):
        if not value:
            raise CampaignError(f"{where}: empty list; list at least one value")
        return value
    if isinstance(value, Mapping):
        raise CampaignError(f"{where}: expected a value or a list of values, not a table")
    return [value]


def _no_unknown(table: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    unknown = [k for k in table if k not in allowed]
    if unknown:
        raise CampaignError(f"{where}: unknown field {unknown[0]!r}; allowed: "
                            f"{', '.join(allowed)}")


def _no_duplicates(values: list[Any], where: str) -> None:
    seen: set[Any] = set()
    for v in values:
        if v in seen:
            raise CampaignError(f"{where}: {_fmt_value(v)} is listed twice; list each value once")
        seen.add(v)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _fmt_value(value: Any) -> str:
    return _fmt(value) if _is_number(value) and math.isfinite(value) else repr(value)


# --- the runner interface (implemented by testbed/episode.py) -------------------------------


@dataclass(frozen=True)
class EpisodeResult:
    """Measurements of one finished episode.

    ``actions``: one dict per scheduled protected action with exactly the fields in
    ``results_io.RUNNER_ACTION_FIELDS``. ``episode``: the fields in
    ``results_io.RUNNER_EPISODE_FIELDS`` (``wall_s`` and ``congestion_control`` may be
    left out). The campaign adds the cell, schedule and identity columns.
    """

    actions: list[dict[str, Any]]
    episode: dict[str, Any]


class Group(Protocol):
    """A live topology (and its node processes) shared by the cells of one group."""

    @property
    def backend(self) -> str:
        """Link backend in use: "userspace", "netem" or "none"."""
        ...

    @property
    def description(self) -> Mapping[str, Any]:
        """JSON-able description of the topology for the manifest."""
        ...

    async def run_episode(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        """Run one episode on fresh stores and counters; raise EpisodeAborted on failure."""
        ...


class Runner(Protocol):
    def open_group(self, key: GroupKey, cells: Sequence[Cell]
                   ) -> AbstractAsyncContextManager[Group]:
        """Build the group's topology and processes; tear them down on exit."""
        ...


@dataclass(frozen=True)
class RunSummary:
    out_dir: Path
    episodes: int  # in the campaign
    skipped: int  # already complete when this run started (resume)
    ran: int
    aborted: int
    wall_s: float


# --- the campaign loop ----------------------------------------------------------------------


async def run_campaign(campaign: Campaign, out_dir: Path | str, *, resume: bool,
                       runner: Runner, console: Console, extend: bool = False,
                       jobs: int = 1) -> RunSummary:
    """Run every not-yet-committed episode of ``campaign`` into ``out_dir``."""
    if not (isinstance(jobs, int) and jobs >= 1):
        raise CampaignError(f"jobs: {jobs!r} is not allowed; allowed: an integer >= 1")
    run_dir = RunDir(out_dir)
    extended_from: dict[str, int] | None = None
    if not run_dir.is_empty():
        if not (resume or extend):
            raise CampaignError(f"{run_dir.path}: not empty; pass --resume to finish that run "
                                "(or --extend to grow it) or choose another --out")
        extended_from = _check_same_campaign(run_dir, campaign, extend=extend)
    t0 = time.monotonic()
    run_dir.open()
    status = "interrupted"
    counts = {"ran": 0, "aborted": 0}
    progress = _progress(console)
    try:
        previous = run_dir.read_manifest()
        sessions = previous.get("sessions", [])
        session: dict[str, Any] = {"started_at": _now(), "resume": bool(sessions),
                                   "jobs": jobs}
        if extended_from is not None:
            session["extended_from"] = extended_from
        run_dir.update_manifest(
            started_at=previous.get("started_at", session["started_at"]),
            campaign=campaign.name, source=campaign.source, config=campaign.config(),
            versions=package_versions(), git=git_revision(), system=host_description(),
            sessions=[*sessions, session], status="running")
        done = run_dir.completed()
        episodes = campaign.episodes()
        todo = [(c, t) for c, t in episodes if episode_key(c, t) not in done]
        task = progress.add_task("episodes", total=len(episodes),
                                 completed=len(episodes) - len(todo))
        progress.start()
        units = _work_units(todo, jobs)

        async def lane() -> None:
            schedules = _ScheduleCache(campaign)
            while units:
                gkey, pending = units.pop(0)
                while pending:
                    cells = list(dict.fromkeys(c for c, _ in pending))
                    async with runner.open_group(gkey, cells) as group:
                        _note_group(run_dir, gkey, group)
                        while pending:
                            cell, template = pending.pop(0)
                            key = episode_key(cell, template)
                            progress.update(task, description=key)
                            was_aborted = await _run_one(campaign, run_dir, group, cell,
                                                         schedules.get(cell, template), key)
                            counts["ran"] += 1
                            counts["aborted"] += was_aborted
                            progress.advance(task)
                            if was_aborted:
                                break  # rebuild the topology and processes before going on

        if jobs == 1:
            await lane()
        else:
            # Loopback stall is CPU time: its units run first, one at a time, with no
            # other lane beside them; then the emulated-link units fill the lanes.
            emulated = [u for u in units if u[0].network != "loopback"]
            units[:] = [u for u in units if u[0].network == "loopback"]
            await lane()
            units[:] = emulated
            await _run_lanes(lane, min(jobs, len(units)))
        status = "complete"
    finally:
        progress.stop()
        sessions = run_dir.read_manifest().get("sessions", [])
        if sessions:
            sessions[-1] = {**sessions[-1], "ended_at": _now(), "status": status}
        run_dir.update_manifest(sessions=sessions, status=status, ended_at=_now())
        if run_dir.completed():
            run_dir.consolidate()
        run_dir.close()
    if status == "complete":
        print_summary(run_dir.path, console)
    return RunSummary(run_dir.path, len(campaign.episodes()), len(done), counts["ran"],
                      counts["aborted"], time.monotonic() - t0)


WorkUnit = tuple[GroupKey, list[tuple[Cell, str]]]


def _work_units(todo: Sequence[tuple[Cell, str]], jobs: int) -> list[WorkUnit]:
    """What one lane runs on one topology: a whole group, or with several lanes one
    (group, template) slice of it, so that paired policies stay back to back."""
    def unit_key(item: tuple[Cell, str]) -> Any:
        cell, template = item
        return cell.group_key if jobs == 1 else (cell.group_key, template)

    return [(items[0][0].group_key, items)
            for items in (list(g) for _, g in itertools.groupby(todo, key=unit_key))]


async def _run_lanes(lane: Callable[[], Awaitable[None]], count: int) -> None:
    """Run ``count`` lanes in one nursery; a failure in one stops all of them (their
    episodes stay "started" and run again on --resume). A single failure is re-raised
    as itself, not as an exception group, so callers see the same errors as with one
    lane."""
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(lane)
    except BaseExceptionGroup as group:
        leaves = [e for e in _leaves(group) if not isinstance(e, trio.Cancelled)]
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


class _ScheduleCache:
    """Schedules are identical across the policies of a template; build each once."""

    def __init__(self, campaign: Campaign) -> None:
        self.campaign = campaign
        self.last: tuple[tuple[Any, ...], Schedule] | None = None

    def get(self, cell: Cell, template: str) -> Schedule:
        ident = (template, cell.agents, cell.keys, cell.units, cell.deps, cell.rho, cell.tier)
        if self.last is None or self.last[0] != ident:
            self.last = (ident, self.campaign.schedule(cell, template))
        return self.last[1]


async def _run_one(campaign: Campaign, run_dir: RunDir, group: Group, cell: Cell,
                   schedule: Schedule, key: str) -> bool:
    """Run and commit one episode; True if it was aborted."""
    run_dir.mark_started(key)
    started = time.monotonic()
    result: EpisodeResult | None = None
    reason = ""
    try:
        limit_s = campaign.options.episode_timeout_s
        with trio.move_on_after(limit_s + BACKSTOP_GRACE_S) as scope:
            result = await group.run_episode(cell, schedule)
        if scope.cancelled_caught:
            reason = (f"episode exceeded options.episode_timeout_s ({_fmt(limit_s)} s) "
                      f"by {_fmt(BACKSTOP_GRACE_S)} s; the runner did not stop it")
    except EpisodeAborted as exc:
        reason = exc.reason or "aborted (no reason given)"
        result = None
    wall_s = time.monotonic() - started
    base = {"campaign": campaign.name, **cell.columns(), "backend": group.backend,
            "episode": key, "family": schedule.family, "template": schedule.template,
            "schedule_digest": schedule.digest}
    if result is None:
        episode_row = {**base, "seed": campaign.seed,
                       "scheduled_actions": schedule.counts.actions, "attempted_actions": 0,
                       "updates": schedule.counts.updates, "aborted": True,
                       "abort_reason": reason, "wall_s": wall_s}
        run_dir.record_episode(key, [], episode_row)
        return True
    actions, episode_row = _rows(base, campaign, schedule, result, wall_s, key)
    run_dir.record_episode(key, actions, episode_row)
    return False


def _rows(base: dict[str, Any], campaign: Campaign, schedule: Schedule, result: EpisodeResult,
          wall_s: float, key: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Full result rows from the runner's measurements (checking the field contract)."""
    acts = {a.action: a for a in schedule.acts()}
    planners = {p.action: p.planner for p in schedule.plans()}
    rows = []
    for row in result.actions:
        check_fields(row, RUNNER_ACTION_FIELDS, RUNNER_ACTION_FIELDS, f"episode {key}: action")
        act = acts.get(row["action"])
        if act is None:
            raise ResultRowError(f"episode {key}: action {row['action']!r} is not scheduled")
        if row["outcome"] not in ("released", "blocked"):
            raise ResultRowError(f"episode {key}: action {row['action']}: outcome "
                                 f"{row['outcome']!r}; allowed: released, blocked")
        rows.append({**base, "unit": act.unit, "planner": planners[act.action],
                     "executor": act.executor, **row})
    reported = [r["action"] for r in rows]
    if sorted(reported) != sorted(acts):
        raise ResultRowError(f"episode {key}: action rows {len(reported)} do not match the "
                             f"{len(acts)} scheduled actions one to one")
    optional = ("wall_s", "congestion_control")
    required = [f for f in RUNNER_EPISODE_FIELDS if f not in optional]
    check_fields(result.episode, required, RUNNER_EPISODE_FIELDS, f"episode {key}: episode")
    episode_row = {**base, "seed": campaign.seed, "scheduled_actions": schedule.counts.actions,
                   "attempted_actions": len(rows), "updates": schedule.counts.updates,
                   "aborted": False, "abort_reason": None, "wall_s": wall_s,
                   **result.episode}
    return rows, episode_row


def _note_group(run_dir: RunDir, gkey: GroupKey, group: Group) -> None:
    manifest = run_dir.read_manifest()
    groups = dict(manifest.get("groups", {}))
    groups[gkey.id] = {"key": gkey._asdict(), "backend": group.backend,
                       **dict(group.description)}
    backends = sorted({str(g.get("backend")) for g in groups.values()})
    run_dir.update_manifest(groups=groups, backend=", ".join(backends))


def _check_same_campaign(run_dir: RunDir, campaign: Campaign, *,
                         extend: bool) -> dict[str, int] | None:
    """Refuse to resume (or extend) a directory that holds another campaign. With
    ``extend`` returns the size of the run being grown."""
    try:
        manifest = run_dir.read_manifest()
    except (ValueError, OSError) as exc:
        raise CampaignError(f"{run_dir.manifest_path}: unreadable ({exc}); "
                            "choose another --out") from None
    old = manifest.get("config")
    if not isinstance(old, dict):
        raise CampaignError(f"{run_dir.path}: no campaign manifest; --resume needs a directory "
                            "written by `testbed run`")
    new = campaign.config()
    if not extend:
        differing = [k for k in new if old.get(k) != new[k]]
        if differing:
            raise CampaignError(f"--resume: {run_dir.path} holds a different campaign (field "
                                f"{differing[0]}); rerun with the same campaign, grow it with "
                                "--extend, or choose another --out")
        return None
    differing = [k for k in ("name", "seed", "options") if old.get(k) != new[k]]
    if differing:
        raise CampaignError(f"--extend: {run_dir.path} holds a campaign with another "
                            f"{differing[0]}; only grid, templates and description may change")
    try:
        previous = _recorded_campaign(old, source=str(run_dir.manifest_path))
    except CampaignError as exc:
        raise CampaignError(f"--extend: the manifest's campaign no longer parses ({exc})"
                            ) from None
    lost_templates = [t for t in previous.templates if t not in campaign.templates]
    if lost_templates:
        raise CampaignError(f"--extend: template {lost_templates[0]} of the existing run is "
                            "missing; an extended campaign keeps every template")
    cells = {c.id for c in campaign.cells()}
    previous_cells = previous.cells()
    lost_cells = [c.id for c in previous_cells if c.id not in cells]
    if lost_cells:
        raise CampaignError(f"--extend: cell {lost_cells[0]} of the existing run is missing "
                            "from the grid; an extended campaign keeps every cell")
    return {"templates": len(previous.templates), "cells": len(previous_cells)}


def _recorded_campaign(config: Mapping[str, Any], *, source: str = "<manifest>") -> Campaign:
    """The campaign a manifest's ``config`` describes, for its cells and templates.

    Options are left out: the manifest stores every option, unset ones as None, which a
    campaign file may not say, and options shape neither cells nor schedules."""
    return parse_campaign({**config, "options": {}}, source=source)


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA"),
                    TimeRemainingColumn(), console=console, transient=False,
                    refresh_per_second=2)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# --- summary ----------------------------------------------------------------------------------

_SUMMARY_ROWS = 40


def summary_frame(out_dir: Path) -> pd.DataFrame:
    """Per cell: episodes, aborted, invalid/issued, median stall and KiB per action."""
    episodes = pd.read_parquet(out_dir / "episodes.parquet")
    actions = pd.read_parquet(out_dir / "actions.parquet")
    done = episodes[~episodes["aborted"]]
    by = ["cell", "policy", "network", "rho", "keys", "agents", "deps", "connection"]
    frame = episodes.groupby(by, sort=False).agg(
        episodes=("episode", "size"), aborted=("aborted", "sum")).reset_index()
    medians = done.groupby("cell").agg(stall_ms=("stall_ms_per_action", "median"),
                                       kib=("kib_per_action", "median"))
    released = actions[actions["outcome"] == "released"]
    issued = released.groupby("cell").size().rename("issued")
    invalid = released.groupby("cell")["invalid"].sum().rename("invalid")
    frame = frame.join(medians, on="cell").join(issued, on="cell").join(invalid, on="cell")
    frame = frame.fillna({"issued": 0, "invalid": 0})
    # Rows in the campaign file's order (shards come back in file-name order, which puts
    # rho 16 before rho 4); cells the manifest does not know go last, sorted.
    order = {cell_id: i for i, cell_id in enumerate(_manifest_cell_order(out_dir))}
    frame["_order"] = frame["cell"].map(order).fillna(len(order))
    frame = frame.sort_values(["_order", "policy", "network", "rho", "keys", "agents", "deps",
                               "connection"], kind="stable")
    return frame.drop(columns="_order").reset_index(drop=True)


def _manifest_cell_order(out_dir: Path) -> list[str]:
    try:
        config = RunDir(out_dir).read_manifest().get("config")
        if not isinstance(config, dict):
            return []
        return [c.id for c in _recorded_campaign(config).cells()]
    except (OSError, ValueError):
        return []


def print_summary(out_dir: Path, console: Console) -> None:
    """One screen: median stall (ms/action) and traffic (KiB/action) per cell."""
    frame = summary_frame(out_dir)
    table = Table(title=f"{out_dir.name}: medians over templates (aborted episodes excluded)")
    for column in ("policy", "network", "rho", "keys", "agents", "deps", "conn", "episodes",
                   "invalid/issued", "stall ms/action", "KiB/action"):
        table.add_column(column, justify="left" if column in ("policy", "network") else "right")
    for row in frame.head(_SUMMARY_ROWS).to_dict("records"):
        episodes = f"{row['episodes']}" + (f" ({row['aborted']} aborted)" if row["aborted"]
                                           else "")
        table.add_row(str(row["policy"]), str(row["network"]), _fmt(float(row["rho"])),
                      str(row["keys"]), str(row["agents"]), str(row["deps"]),
                      str(row["connection"]), episodes,
                      f"{int(row['invalid'])}/{int(row['issued'])}", _num(row["stall_ms"]),
                      _num(row["kib"]))
    console.print(table)
    if len(frame) > _SUMMARY_ROWS:
        console.print(f"... {len(frame) - _SUMMARY_ROWS} more cells in "
                      f"{out_dir / 'episodes.parquet'} (see `testbed report`)")


def _num(value: Any) -> str:
    return "-" if value is None or pd.isna(value) else f"{float(value):.1f}"

