"""Campaign files: TOML in, a validated :class:`Campaign` out, or a one-line error.

Rules this module obeys:

1. A campaign file is validated completely before anything runs; every error is one
   line naming the field and the allowed values (:class:`CampaignError`).
2. The allowed values come from ``testbed.campaign.vocabulary`` (the registries), never
   from a list kept here.
3. Presets are campaign files shipped in ``testbed/campaign/presets/``; a name that is not
   a file is looked up there.
4. ``[networks.NAME]`` tables define the campaign's own networks
   (``testbed.campaign.networks``); ``grid.network`` names registered or defined ones, and
   the networks are checked against the grid (hosts, trace offsets) and their files
   read before the campaign is returned.
5. ``plugins = [...]`` are loaded before anything else is checked
   (``testbed.campaign.plugins``); ``[policies.NAME]`` tables set a policy's parameters
   for every cell naming it, and each cell's policy is written in its one spelling
   (``protocols.policy_params.canonical_spec``).
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from nodes.transport import Connection, is_connection
from testbed.campaign.command import COMMAND_KIND, check_label, default_label, parse_command
from testbed.campaign.live_parse import live_fields, live_grid_value
from testbed.campaign.model import (
    EXTRA_FIELDS,
    GRID_DEFAULTS,
    GRID_FIELDS,
    STUDY_DEFAULTS,
    STUDY_FIELDS,
    TRIAL_FIXED,
    Campaign,
    CampaignError,
    Execution,
    Options,
    fmt_number,
)
from testbed.campaign.networks import check_against_grid, check_backend, parse_networks
from testbed.campaign.plugins import load as load_plugins
from testbed.campaign.plugins import resolve_names
from testbed.campaign.trials import KINDS, SCENARIOS, SINGLE_ACTION_KINDS, UPDATE_TARGETS
from testbed.campaign.vocabulary import (
    BACKENDS,
    CLUSTER_ALLOWED,
    CLUSTER_SPEC,
    CONNECTIONS,
    DURABILITY,
    INT_LIMITS,
    MAX_TEMPLATES,
    RHOS,
    TIERS,
    WIRE_ENCODINGS,
    allowed_policies,
    network_names,
    normal_spec,
    policy_allowed,
    policy_exists,
    policy_problem,
)
from testbed.campaign.workload import (
    DERIVATIONS,
    FAMILIES,
    MAX_SEED,
    TEMPLATES_PER_FAMILY,
    WorkloadError,
    round_robin_templates,
    template_family,
)

TOP_FIELDS = ("name", "seed", "templates", "description", "kind", "options", "execution",
              "networks", "grid", "plugins", "policies", "command", "model",
              "decisions")
EXECUTION_FIELDS = ("cluster", "jobs", "allow_mixed_backends")
MAX_BATCHES = 100
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
PRESETS_PACKAGE = "testbed.campaign"


def preset_names() -> list[str]:
    folder = resources.files(PRESETS_PACKAGE) / "presets"
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir()
                  if p.name.endswith(".toml"))


def load_campaign(name_or_path: str | Path) -> Campaign:
    """Load a shipped preset by name, or a campaign file by path."""
    text = str(name_or_path)
    path = Path(text)
    if path.is_file():
        return _parse_text(_read_text(path), str(path), base_dir=path.resolve().parent)
    presets = preset_names()
    if text in presets:
        preset = resources.files(PRESETS_PACKAGE) / "presets" / f"{text}.toml"
        return _parse_text(preset.read_text(), f"preset {text}")
    if path.is_dir():
        kind = "a directory; give the campaign's .toml file in it"
    elif text.endswith(".toml") or "/" in text:
        kind = "not a file (no such file)"
    else:
        kind = "neither a file nor a preset"
    raise CampaignError(f"campaign: {text!r} is {kind}; presets: {', '.join(presets)}")


def _read_text(path: Path) -> str:
    """A campaign file's text: UTF-8 (a byte order mark is dropped), one line if not."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CampaignError(f"campaign: {path}: unreadable ({exc.strerror})") from None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise CampaignError(f"campaign: {path}: not UTF-8 text (byte 0x{data[exc.start]:02x} "
                            f"at offset {exc.start}); save it as UTF-8") from None


def _parse_text(text: str, source: str, *, base_dir: Path | None = None) -> Campaign:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CampaignError(f"{source}: invalid TOML: {exc}") from None
    return parse_campaign(data, source=source, base_dir=base_dir)


def parse_campaign(data: Mapping[str, Any], *, source: str = "<campaign>",
                   base_dir: Path | None = None, check_files: bool = True,
                   plugins: Sequence[str] = ()) -> Campaign:
    """Validate a decoded campaign table (see docs/campaigns.md for the format).

    ``base_dir``: where relative trace paths of ``[networks]`` start (the campaign
    file's folder). Without ``check_files`` trace files are neither read nor checked
    against the grid (reading back a manifest's campaign for its cells).
    """
    _no_unknown(data, TOP_FIELDS, "campaign")
    named = resolve_names(data.get("plugins", []), base_dir=base_dir)
    named = tuple(dict.fromkeys([*named, *plugins]))
    load_plugins(named)
    tables = _policy_tables(data.get("policies", {}))
    for required in ("name", "seed", "templates", "grid"):
        if required not in data:
            raise CampaignError(f"{required}: missing; a campaign needs "
                                "name, seed, templates and [grid]")
    name = data["name"]
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise CampaignError(f"name: {name!r} is not allowed; allowed: 1-64 letters, digits, "
                            "'_', '.', '-' (starting with a letter or digit)")
    seed = data["seed"]
    if not _is_int(seed) or not 0 <= seed <= MAX_SEED:
        raise CampaignError(f"seed: {seed!r} is not allowed; allowed: an integer "
                            f"0..{MAX_SEED} (2**63 - 1)")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise CampaignError(f"description: {description!r} is not allowed; allowed: a string")
    templates = _templates(data["templates"], "templates")
    kind = _choice(data.get("kind", KINDS[0]), "kind", (*KINDS, COMMAND_KIND))
    label = default_label(data.get("command"), kind)  # a command campaign's default policy
    options = _options(data.get("options", {}))
    execution = _execution(data.get("execution", {}))
    networks = parse_networks(data.get("networks", {}), base_dir=base_dir,
                              check_files=check_files)
    allowed = (*network_names(), *networks)
    raw_grid = data["grid"]
    grids: tuple[dict[str, tuple[Any, ...]], ...]
    if isinstance(raw_grid, Mapping):
        grids = (_grid(raw_grid, "grid", allowed, kind, tables, label),)
    elif isinstance(raw_grid, list) and raw_grid and all(isinstance(g, Mapping)
                                                         for g in raw_grid):
        grids = tuple(_grid(g, f"grid[{i}]", allowed, kind, tables, label)
                      for i, g in enumerate(raw_grid))
    else:
        raise CampaignError("grid: expected a [grid] table or [[grid]] tables")
    model, decisions = live_fields(data, kind, templates, grids, base_dir=base_dir,
                                   check_files=check_files)
    command = None
    if kind == COMMAND_KIND:
        command = parse_command(data.get("command"), base_dir=base_dir,
                                agents=min(min(g["agents"]) for g in grids))
    campaign = Campaign(name=name, seed=int(seed), templates=tuple(templates), grids=grids,
                        options=options, description=description, source=source, kind=kind,
                        execution=execution, networks=networks, plugins=named, model=model,
                        decisions=decisions, command=command)
    if check_files:
        check_against_grid(campaign)
        check_backend(campaign, options.backend)
    return campaign


def _execution(value: Any) -> Execution:
    if not isinstance(value, Mapping):
        raise CampaignError("execution: expected an [execution] table")
    _no_unknown(value, EXECUTION_FIELDS, "execution")
    out: dict[str, Any] = {}
    if "cluster" in value:
        cluster = value["cluster"]
        if not (isinstance(cluster, str) and CLUSTER_SPEC.fullmatch(cluster)):
            raise CampaignError(f"execution.cluster: {cluster!r} is not allowed; allowed: "
                                f"{CLUSTER_ALLOWED}")
        out["cluster"] = cluster
    if "jobs" in value:
        jobs = value["jobs"]
        if not (_is_int(jobs) and jobs >= 1):
            raise CampaignError(f"execution.jobs: {jobs!r} is not allowed; allowed: an "
                                "integer >= 1")
        out["jobs"] = int(jobs)
    if "allow_mixed_backends" in value:
        flag = value["allow_mixed_backends"]
        if not isinstance(flag, bool):
            raise CampaignError(f"execution.allow_mixed_backends: {flag!r} is not allowed; "
                                "allowed: true or false")
        out["allow_mixed_backends"] = flag
    return Execution(**out)


def _templates(value: Any, where: str) -> list[str]:
    if _is_int(value):
        if not 1 <= value <= MAX_TEMPLATES:
            raise CampaignError(f"{where}: {value} is not allowed; allowed: a count "
                                f"1..{MAX_TEMPLATES} or a list of template ids")
        return round_robin_templates(int(value))
    if not isinstance(value, list) or not value:
        raise CampaignError(f"{where}: {value!r} is not allowed; allowed: a count "
                            f"1..{MAX_TEMPLATES} or a non-empty list of template ids")
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
    for key in ("rpc_timeout_s", "episode_timeout_s", "action_deadline_s"):
        if key in value:
            out[key] = _number(value[key], f"options.{key}", "a number > 0", lo=0,
                               lo_open=True)
    for key in ("delay_ms", "effect_delay_s"):
        if key in value:
            out[key] = _number(value[key], f"options.{key}", "a number >= 0", lo=0)
    if "link_log" in value:
        if not isinstance(value["link_log"], bool):
            raise CampaignError(f"options.link_log: {_fmt_value(value['link_log'])} is not "
                                "allowed; allowed: true, false")
        out["link_log"] = value["link_log"]
    for key, choices in (("durability", DURABILITY), ("backend", BACKENDS),
                         ("derivation", DERIVATIONS), ("wire_encoding", WIRE_ENCODINGS)):
        if key in value:
            out[key] = _choice(value[key], f"options.{key}", choices)
    return Options(**out)


def _grid(raw: Mapping[str, Any], where: str, networks: Sequence[str], kind: str = KINDS[0],
          tables: Mapping[str, Mapping[str, Any]] | None = None,
          label: str | None = None) -> dict[str, tuple[Any, ...]]:
    """One grid slice. LABEL: a command campaign's default policy (its policies are
    labels of the program's variants, not registered policies)."""
    names = (*GRID_FIELDS, *EXTRA_FIELDS, *STUDY_FIELDS[kind])
    for name in raw:
        owner = next((k for k, fields in STUDY_FIELDS.items() if name in fields), None)
        if owner is not None and owner != kind:
            raise CampaignError(f"{where}.{name}: only for kind = {owner!r} campaigns; "
                                f"this campaign's kind is {kind!r}")
    _no_unknown(raw, names, where)
    for required in ("network",) if label is not None else ("policy", "network"):
        if required not in raw:
            raise CampaignError(f"{where}.{required}: missing; list at least one value")
    grid: dict[str, tuple[Any, ...]] = {}
    for name in names:
        defaults = GRID_DEFAULTS.get(name, STUDY_DEFAULTS.get(name, ()))
        if name == "policy" and label is not None:
            defaults = (label,)
        values = _as_list(raw[name], f"{where}.{name}") if name in raw else list(defaults)
        grid[name] = tuple(check_label(v, f"{where}.{name}")
                           if name == "policy" and label is not None
                           else _policy(v, f"{where}.{name}", tables or {})
                           if name == "policy"
                           else _grid_value(name, v, f"{where}.{name}", networks)
                           for v in values)
        _no_duplicates(list(grid[name]), f"{where}.{name}")
    if kind in SINGLE_ACTION_KINDS:
        for name in TRIAL_FIXED:
            if grid[name] != GRID_DEFAULTS[name]:
                raise CampaignError(f"{where}.{name}: a {kind} trial is one action; leave "
                                    f"{name} out (it is not used)")
    too_many = [d for d in grid["deps"] if d > min(grid["keys"])]
    if too_many:
        raise CampaignError(f"{where}.deps: {too_many[0]} exceeds {where}.keys "
                            f"{min(grid['keys'])}; allowed: deps <= keys")
    return grid


def _grid_value(name: str, value: Any, where: str, networks: Sequence[str]) -> Any:
    if name == "network":
        return _choice(value, where, networks)
    if name == "connection":
        return _connection(value, where)
    if name == "tier":
        return _choice(value, where, TIERS)
    if name == "rho":
        if _is_number(value) and float(value) in RHOS:
            return float(value)
        raise CampaignError(f"{where}: {_fmt_value(value)} is not allowed; allowed: "
                            f"{', '.join(fmt_number(r) for r in RHOS)}")
    if name == "trace_offset_s":
        return _number(value, where, "numbers >= 0 (seconds into the trace)", lo=0)
    if name == "replan_delay_s":
        return _number(value, where, "numbers >= 0 (seconds of synthetic replanning)", lo=0)
    if name == "update_rate_per_s":
        return _number(value, where, "numbers >= 0 (updates per second)", lo=0)
    if name == "update_target":
        return _choice(value, where, UPDATE_TARGETS)
    if name == "scenario":
        return _choice(value, where, SCENARIOS)
    if name in ("executor_inputs", "overlap"):
        return live_grid_value(name, value, where)
    if name == "batch":
        if _is_int(value) and 1 <= value <= MAX_BATCHES:
            return int(value)
        raise CampaignError(f"{where}: {_fmt_value(value)} is not allowed; allowed: "
                            f"integers 1..{MAX_BATCHES}")
    lo, hi = INT_LIMITS[name]
    if _is_int(value) and lo <= value <= hi:
        return int(value)
    raise CampaignError(f"{where}: {_fmt_value(value)} is not allowed; allowed: "
                        f"integers {lo}..{hi}")


def _policy(value: Any, where: str, tables: Mapping[str, Mapping[str, Any]]) -> str:
    if not policy_allowed(value):
        if isinstance(value, str) and policy_exists(value) and "=" in value:
            raise CampaignError(f"{where}: {policy_problem(value)}")
        raise CampaignError(f"{where}: {_fmt_value(value)} is not allowed; allowed: "
                            f"{allowed_policies()}")
    name = str(value).partition("/")[0]
    try:
        return normal_spec(str(value), tables.get(name))
    except ValueError as exc:
        raise CampaignError(f"{where}: {exc}") from None


def _policy_tables(value: Any) -> dict[str, dict[str, Any]]:
    """``[policies.NAME]`` tables: parameters of NAME for every cell naming it."""
    if not isinstance(value, Mapping):
        raise CampaignError("policies: expected [policies.NAME] tables")
    out: dict[str, dict[str, Any]] = {}
    for name, table in value.items():
        if not policy_exists(name) or "/" in name:
            raise CampaignError(f"policies.{name}: unknown policy; allowed: "
                                f"{allowed_policies()}")
        if not isinstance(table, Mapping):
            raise CampaignError(f"policies.{name}: expected a table of parameters")
        problem = policy_problem(name, table)
        if problem is not None:
            raise CampaignError(f"policies.{name}.{problem.partition(': ')[2]}")
        out[name] = dict(table)
    return out


def _connection(value: Any, where: str) -> Connection:
    if is_connection(value):
        return value
    raise CampaignError(f"{where}: {_fmt_value(value)} is not allowed; allowed: "
                        f"{', '.join(CONNECTIONS)}")


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


def _fmt_value(value: Any) -> str:
    return fmt_number(value) if _is_number(value) and math.isfinite(value) else repr(value)


def recorded_campaign(config: Mapping[str, Any], *, source: str = "<manifest>") -> Campaign:
    """The campaign a manifest's ``config`` describes, for its cells and templates.

    Options are left out: the manifest stores every option, unset ones as None, which a
    campaign file may not say, and options shape neither cells nor schedules. Trace
    files are not read (the run's manifest has their digests)."""
    return parse_campaign({**config, "options": {}}, source=source, check_files=False)


def campaign_from_config(config: Mapping[str, Any], *, source: str = "<config>") -> Campaign:
    """The campaign ``Campaign.config()`` describes, options included (a cluster worker
    rebuilds the campaign it runs from this)."""
    options = {k: v for k, v in dict(config.get("options") or {}).items() if v is not None}
    return parse_campaign({**config, "options": options}, source=source)
