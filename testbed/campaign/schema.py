"""The campaign file as typed models: one definition validates a file and gives editors
its JSON Schema (``testbed schema campaign``).

Rules this module obeys:

1. Every table of a campaign file is a pydantic model here (:class:`CampaignFile`,
   :class:`OptionsTable`, :class:`ExecutionTable`, :class:`GridTable`); a wrong field
   is one line ``<path>: <value> is not allowed; allowed: <what>``, the path written as
   the file writes it (``grid.rho``, ``grid[1].rho``, ``options.backend``). When a file
   has several mistakes, the first in field order is the one reported.
2. Allowed values come from the registries (``testbed.campaign.vocabulary``) when a
   file is validated, never from a list kept here; a grid is checked against the fields
   validated before it (the kind, the ``[policies]`` tables, the ``[networks]`` the
   file defines, a command campaign's name as its default policy).
3. Tables with a parser of their own (``[networks.NAME]``: ``testbed.links.netdef``;
   ``[command]``: ``testbed.campaign.command``; ``[model]``:
   ``testbed.campaign.endpoint``) are checked by it from here, and their JSON Schema
   says which fields they take.
4. The error message travels in the error's context (``message``); a message holding
   ``\\x00`` names its own path there (a field check that mentions another field).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import ConfigDict, TypeAdapter, ValidationError, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from nodes.transport import is_connection
from testbed.campaign.command import COMMAND_KIND
from testbed.campaign.command_table import check_label, command_schema, default_label
from testbed.campaign.endpoint import ModelSettings
from testbed.campaign.fields import (
    BOOL,
    HERE,
    NUMBER_GE0,
    NUMBER_GT0,
    Check,
    Table,
    bad,
    choice,
    context,
    enum,
    first_problem,
    flag,
    int_schema,
    integer,
    is_int,
    is_number,
    message_of,
    no_duplicates,
    not_allowed,
    number,
    user_errors,
    whole,
)
from testbed.campaign.live import EXECUTOR_INPUTS, OVERLAPS
from testbed.campaign.model import (
    EXTRA_FIELDS,
    GRID_DEFAULTS,
    GRID_FIELDS,
    STUDY_DEFAULTS,
    STUDY_FIELDS,
    TRIAL_FIXED,
    CampaignError,
    Execution,
    Options,
    fmt_number,
)
from testbed.campaign.networks import parse_networks
from testbed.campaign.param_schema import policies_schema
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
from testbed.links.netdef_schema import NETWORK_SCHEMA, object_schema

KIND_NAMES = (*KINDS, COMMAND_KIND)
MAX_BATCHES = 100
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _name(value: Any) -> str:
    if isinstance(value, str) and NAME_RE.match(value):
        return value
    raise not_allowed(value, "1-64 letters, digits, '_', '.', '-' (starting with a letter "
                             "or digit)")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise not_allowed(value, "a string")


def _templates(value: Any) -> tuple[str, ...]:
    if is_int(value):
        if not 1 <= value <= MAX_TEMPLATES:
            raise bad(f"{value} is not allowed; allowed: a count 1..{MAX_TEMPLATES} or a "
                      "list of template ids")
        return tuple(round_robin_templates(int(value)))
    if not isinstance(value, list) or not value:
        raise not_allowed(value, f"a count 1..{MAX_TEMPLATES} or a non-empty list of "
                                 "template ids")
    for item in value:
        try:
            if not isinstance(item, str):
                raise WorkloadError(repr(item))
            template_family(item)
        except WorkloadError:
            raise not_allowed(item, f"<family>-NN with family in {', '.join(FAMILIES)} "
                                    f"and NN in 01..{TEMPLATES_PER_FAMILY:02d}") from None
    no_duplicates(value)
    return tuple(str(v) for v in value)


def _one_or_many(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "array", "items": schema, "minItems": 1,
                               "uniqueItems": True}]}


def grid_values(check: Callable[[Any, ValidationInfo], Any], schema: dict[str, Any]
                ) -> Check:
    """A grid field: one value or a non-empty list of distinct values."""
    def validate(value: Any, info: ValidationInfo) -> tuple[Any, ...]:
        if isinstance(value, Mapping):
            raise bad("expected a value or a list of values, not a table")
        values = value if isinstance(value, list) else [value]
        if not values:
            raise bad("empty list; list at least one value")
        out = tuple(check(v, info) for v in values)
        no_duplicates(out)
        return out
    return Check(validate, _one_or_many(schema), with_info=True)


def _plain(check: Callable[[Any], Any]) -> Callable[[Any, ValidationInfo], Any]:
    return lambda value, info: check(value)


# --- tables ------------------------------------------------------------------------------


class OptionsTable(Table):
    """``[options]``: campaign-wide settings that are not grid dimensions."""

    written: ClassVar[str] = "an [options] table"
    rpc_timeout_s: Annotated[Any, Check(number("a number > 0", lo=0, lo_open=True), NUMBER_GT0)] = None
    durability: Annotated[Any, Check(choice(DURABILITY), enum(DURABILITY))] = None
    backend: Annotated[Any, Check(choice(BACKENDS), enum(BACKENDS))] = None
    delay_ms: Annotated[Any, Check(number("a number >= 0", lo=0), NUMBER_GE0)] = None
    episode_timeout_s: Annotated[Any, Check(number("a number > 0", lo=0, lo_open=True),
                               NUMBER_GT0)] = None
    derivation: Annotated[Any, Check(choice(DERIVATIONS), enum(DERIVATIONS))] = None
    action_deadline_s: Annotated[Any, Check(number("a number > 0", lo=0, lo_open=True),
                               NUMBER_GT0)] = None
    effect_delay_s: Annotated[Any, Check(number("a number >= 0", lo=0), NUMBER_GE0)] = None
    link_log: Annotated[Any, Check(flag("true, false"), BOOL)] = None
    wire_encoding: Annotated[Any, Check(choice(WIRE_ENCODINGS), enum(WIRE_ENCODINGS))] = None

    def options(self) -> Options:
        return Options(**{k: v for k, v in self.model_dump().items() if v is not None})


def _cluster(value: Any) -> str:
    if isinstance(value, str) and CLUSTER_SPEC.fullmatch(value):
        return value
    raise not_allowed(value, CLUSTER_ALLOWED)


class ExecutionTable(Table):
    """``[execution]``: where a campaign runs (command-line flags override it)."""

    written: ClassVar[str] = "an [execution] table"
    cluster: Annotated[Any, Check(_cluster, {"type": "string", "pattern": f"^(?:{CLUSTER_SPEC.pattern})$",
                                "description": CLUSTER_ALLOWED})] = None
    jobs: Annotated[Any, Check(integer(1, 2**31, "an integer >= 1"), {"type": "integer",
                                                          "minimum": 1})] = None
    allow_mixed_backends: Annotated[Any, Check(flag("true or false"), BOOL)] = None

    def execution(self) -> Execution:
        return Execution(**{k: v for k, v in self.model_dump().items() if v is not None})


def _policy(value: Any, info: ValidationInfo) -> str:
    ctx = context(info)
    if ctx.get("label") is not None:  # a command campaign: labels of its program's variants
        return user_errors(check_label)(value, HERE)  # type: ignore[no-any-return]
    if not policy_allowed(value):
        if isinstance(value, str) and policy_exists(value) and "=" in value:
            raise bad(f"{HERE}: {policy_problem(value)}")
        raise not_allowed(value, allowed_policies())
    tables: Mapping[str, Mapping[str, Any]] = ctx.get("tables", {})
    try:
        return normal_spec(str(value), tables.get(str(value).partition("/")[0]))
    except ValueError as exc:
        raise bad(str(exc)) from None


def _network(value: Any, info: ValidationInfo) -> str:
    return choice(tuple(context(info).get("networks", network_names())))(value)


def _connection(value: Any) -> str:
    if is_connection(value):
        return value
    raise not_allowed(value, ", ".join(CONNECTIONS))


def _rho(value: Any) -> float:
    if is_number(value) and float(value) in RHOS:
        return float(value)
    raise not_allowed(value, ", ".join(fmt_number(r) for r in RHOS))


def _limits(name: str) -> Check:
    lo, hi = INT_LIMITS[name]
    return grid_values(_plain(integer(lo, hi, f"integers {lo}..{hi}")), int_schema(lo, hi))


def _string_values(choices: Sequence[str]) -> Check:
    return grid_values(_plain(choice(choices)), enum(choices))


class GridTable(Table):
    """``[grid]`` (or one ``[[grid]]`` slice): the values of each field; the cells are
    the cartesian product. Fields left out take their defaults."""

    written: ClassVar[str] = "a [grid] table"
    policy: Annotated[Any, grid_values(_policy, {"type": "string", "description":
                                  "a policy (`testbed policies list`)"})] = None
    network: Annotated[Any, grid_values(_network, {"type": "string", "description": "a network "
                                    "(`testbed networks list`) or one of [networks]"})] = None
    trace_offset_s: Annotated[Any, grid_values(_plain(number("numbers >= 0 (seconds into the trace)",
                                               lo=0)), NUMBER_GE0)] = None
    rho: Annotated[Any, grid_values(_plain(_rho), enum(RHOS))] = None
    keys: Annotated[Any, _limits("keys")] = None
    agents: Annotated[Any, _limits("agents")] = None
    deps: Annotated[Any, _limits("deps")] = None
    connection: Annotated[Any, grid_values(_plain(_connection), enum(CONNECTIONS))] = None
    tier: Annotated[Any, _string_values(TIERS)] = None
    units: Annotated[Any, _limits("units")] = None
    batch: Annotated[Any, grid_values(_plain(integer(1, MAX_BATCHES, f"integers 1..{MAX_BATCHES}")),
                       int_schema(1, MAX_BATCHES))] = None
    replan_delay_s: Annotated[Any, grid_values(_plain(number(
        "numbers >= 0 (seconds of synthetic replanning)", lo=0)), NUMBER_GE0)] = None
    update_rate_per_s: Annotated[Any, grid_values(_plain(number("numbers >= 0 (updates per second)",
                                                  lo=0)), NUMBER_GE0)] = None
    update_target: Annotated[Any, _string_values(UPDATE_TARGETS)] = None
    scenario: Annotated[Any, _string_values(SCENARIOS)] = None
    executor_inputs: Annotated[Any, _string_values(EXECUTOR_INPUTS)] = None
    overlap: Annotated[Any, _string_values(OVERLAPS)] = None

    @classmethod
    def allowed_fields(cls, info: ValidationInfo) -> tuple[str, ...]:
        kind = context(info).get("kind", KINDS[0])
        return (*GRID_FIELDS, *EXTRA_FIELDS, *STUDY_FIELDS.get(kind, ()))

    @model_validator(mode="before")
    @classmethod
    def _study_fields(cls, data: Any, info: ValidationInfo) -> Any:
        kind = context(info).get("kind", KINDS[0])
        for name in data if isinstance(data, Mapping) else ():
            owner = next((k for k, fields in STUDY_FIELDS.items() if name in fields), None)
            if owner is not None and owner != kind:
                raise bad(f"{HERE}.{name}: only for kind = {owner!r} campaigns; this "
                          f"campaign's kind is {kind!r}")
        return data

    def table(self, ctx: Mapping[str, Any]) -> dict[str, tuple[Any, ...]]:
        """Every field of the slice, defaults filled in (rule 2 checks across fields)."""
        kind, label = ctx.get("kind", KINDS[0]), ctx.get("label")
        given = {k: v for k, v in self.model_dump().items() if v is not None}
        for required in ("network",) if label is not None else ("policy", "network"):
            if required not in given:
                raise bad(f"{HERE}.{required}: missing; list at least one value")
        grid: dict[str, tuple[Any, ...]] = {}
        for name in (*GRID_FIELDS, *EXTRA_FIELDS, *STUDY_FIELDS[kind]):
            default = (label,) if name == "policy" and label is not None \
                else GRID_DEFAULTS.get(name, STUDY_DEFAULTS.get(name, ()))
            grid[name] = tuple(given.get(name, default))
        if kind in SINGLE_ACTION_KINDS:
            for name in TRIAL_FIXED:
                if grid[name] != GRID_DEFAULTS[name]:
                    raise bad(f"{HERE}.{name}: a {kind} trial is one action; leave {name} "
                              "out (it is not used)")
        too_many = [d for d in grid["deps"] if d > min(grid["keys"])]
        if too_many:
            raise bad(f"{HERE}.deps: {too_many[0]} exceeds {HERE}.keys "
                      f"{min(grid['keys'])}; allowed: deps <= keys")
        return grid


_GRID_TABLE_SCHEMA = GridTable.model_json_schema()
_GRID_SCHEMA = {"anyOf": [_GRID_TABLE_SCHEMA, {"type": "array", "items": _GRID_TABLE_SCHEMA,
                                               "minItems": 1}]}


def _grids(value: Any, info: ValidationInfo) -> tuple[dict[str, tuple[Any, ...]], ...]:
    data = info.data
    kind = data.get("kind", KINDS[0])
    label = default_label(data.get("command"), kind) if "command" in data else None
    networks = (*network_names(), *(data.get("networks") or {}))
    ctx = {"kind": kind, "label": label, "networks": networks,
           "tables": data.get("policies") or {}}
    if isinstance(value, Mapping):
        slices = [("grid", value)]
    elif isinstance(value, list) and value and all(isinstance(g, Mapping) for g in value):
        slices = [(f"grid[{i}]", g) for i, g in enumerate(value)]
    else:
        raise bad("expected a [grid] table or [[grid]] tables")
    out = []
    for where, raw in slices:
        try:
            out.append(GridTable.model_validate(raw, context=ctx).table(ctx))
        except ValidationError as exc:
            raise whole(first_problem(exc, where)) from None
        except PydanticCustomError as exc:
            raise whole(message_of(exc, where)) from None
    return tuple(out)


def _policy_tables(value: Any) -> dict[str, dict[str, Any]]:
    """``[policies.NAME]`` tables: parameters of NAME for every cell naming it."""
    if not isinstance(value, Mapping):
        raise bad("expected [policies.NAME] tables")
    out: dict[str, dict[str, Any]] = {}
    for name, table in value.items():
        if not policy_exists(name) or "/" in name:
            raise bad(f"{HERE}.{name}: unknown policy; allowed: {allowed_policies()}")
        if not isinstance(table, Mapping):
            raise bad(f"{HERE}.{name}: expected a table of parameters")
        problem = policy_problem(name, table)
        if problem is not None:
            raise bad(f"{HERE}.{name}.{problem.partition(': ')[2]}")
        out[name] = dict(table)
    return out


def _networks(value: Any, info: ValidationInfo) -> dict[str, Any]:
    ctx = context(info)
    parse = user_errors(parse_networks)
    return parse(value, base_dir=ctx.get("base_dir"),  # type: ignore[no-any-return]
                 check_files=ctx.get("check_files", True))


def _command(value: Any, info: ValidationInfo) -> Any:
    kind = info.data.get("kind", KINDS[0])
    user_errors(default_label)(value, kind)
    return value


def _as_is(value: Any) -> Any:
    return value


def _plugins(value: Any) -> tuple[str, ...]:
    if isinstance(value, list) and all(isinstance(n, str) and n for n in value):
        return tuple(value)
    raise not_allowed(value, "a list of module names or .py file paths")


COMMAND_SCHEMA = command_schema()


def _tidy(node: Any) -> Any:
    """A schema for editors: no null defaults (TOML has no null), no generated titles."""
    if isinstance(node, dict):
        props = node.get("properties")
        out = {k: _tidy(v) for k, v in node.items()
               if not (k == "default" and v is None) and k != "properties"}
        if isinstance(props, dict):
            out["properties"] = {k: {f: _tidy(x) for f, x in v.items() if f != "title"}
                                 if isinstance(v, dict) else v for k, v in props.items()}
            out["properties"] = {k: _tidy(v) for k, v in out["properties"].items()}
        return out
    if isinstance(node, list):
        return [_tidy(v) for v in node]
    return node


def model_table_schema() -> dict[str, Any]:
    """``[model]``'s JSON Schema, read from :class:`ModelSettings` (every field it has)."""
    schema = TypeAdapter(ModelSettings).json_schema()
    schema["additionalProperties"] = False
    schema.pop("required", None)
    return schema


class CampaignFile(Table):
    """A campaign file (docs/campaigns.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="testbed campaign",
                              arbitrary_types_allowed=True)
    written: ClassVar[str] = "a table of campaign fields"
    name: Annotated[Any, Check(_name, {"type": "string", "pattern": NAME_RE.pattern})]
    seed: Annotated[Any, Check(integer(0, MAX_SEED, f"an integer 0..{MAX_SEED} (2**63 - 1)"),
                  int_schema(0, MAX_SEED))]
    templates: Annotated[Any, Check(_templates, {"anyOf": [
        int_schema(1, MAX_TEMPLATES),
        {"type": "array", "minItems": 1, "uniqueItems": True, "items": {
            "type": "string", "pattern": f"^({'|'.join(FAMILIES)})-[0-9]{{2}}$"}}]})]
    description: Annotated[Any, Check(_text, {"type": "string"})] = ""
    kind: Annotated[Any, Check(choice(KIND_NAMES), enum(KIND_NAMES))] = KINDS[0]
    plugins: Annotated[Any, Check(_plugins, {"type": "array", "items": {"type": "string"}})] = ()
    policies: Annotated[Any, Check(_policy_tables, {"type": "object", "additionalProperties": {
        "type": "object", "description": "a policy's parameters "
                                         "(`testbed policies show NAME`)"}})] = None
    command: Annotated[Any, Check(_command, _tidy(COMMAND_SCHEMA), with_info=True)] = None
    options: OptionsTable = OptionsTable()
    execution: ExecutionTable = ExecutionTable()
    networks: Annotated[Any, Check(_networks, {"type": "object", "additionalProperties":
                                               NETWORK_SCHEMA}, with_info=True)] = None
    grid: Annotated[Any, Check(_grids, _GRID_SCHEMA, with_info=True)]
    model: Annotated[Any, Check(_as_is, model_table_schema())] = None
    decisions: Annotated[Any, Check(_as_is, {"type": "string", "description": "a live run's results "
                                "directory (replay campaigns)"})] = None


def validate_campaign(data: Any, *, base_dir: Path | None = None,
                      check_files: bool = True) -> CampaignFile:
    """DATA as a :class:`CampaignFile`, or a one-line :class:`CampaignError`."""
    try:
        return CampaignFile.model_validate(data, context={"base_dir": base_dir,
                                                          "check_files": check_files})
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        if err["type"] == "missing" and len(err["loc"]) == 1:
            raise CampaignError(f"{err['loc'][0]}: missing; a campaign needs name, seed, "
                                "templates and [grid]") from None
        raise CampaignError(first_problem(exc)) from None


def _with_defaults(schema: dict[str, Any]) -> dict[str, Any]:
    for name, table, defaults in (("OptionsTable", OptionsTable, Options()),
                                  ("ExecutionTable", ExecutionTable, Execution())):
        props = schema["$defs"][name]["properties"]
        for field in table.model_fields:
            value = getattr(defaults, field)
            if value is not None:
                props[field]["default"] = value
    return schema


DRAFT = "http://json-schema.org/draft-07/schema#"


def schemas() -> dict[str, dict[str, Any]]:
    """Every file a user writes, by the name `testbed schema NAME` takes; the policies'
    parameters are those of the policies registered now."""
    campaign = _with_defaults(_tidy(CampaignFile.model_json_schema()))
    campaign["properties"]["policies"] = policies_schema()
    return {"campaign": {"$schema": DRAFT, **campaign},
            "network": {"$schema": DRAFT, "title": "testbed network", **NETWORK_SCHEMA},
            "networks": {"$schema": DRAFT, "title": "testbed networks file",
                         **object_schema({"networks": {
                             "type": "object", "additionalProperties": NETWORK_SCHEMA}},
                             "[networks.NAME] tables (a networks file)")},
            "command": {"$schema": DRAFT, **_tidy(COMMAND_SCHEMA),
                        "title": "testbed command table"},
            "model": {"$schema": DRAFT, **_tidy(model_table_schema()),
                      "title": "testbed model table"}}
