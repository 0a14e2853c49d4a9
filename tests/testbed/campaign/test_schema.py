"""One schema for every file a user writes (testbed.campaign.schema, `testbed schema`).

The JSON Schema editors read must accept every campaign the project ships and refuse
what the models refuse; it is checked here with the `jsonschema` library (a dev
dependency), as an editor would check it, and the models themselves validate the
same files (load_campaign)."""

from __future__ import annotations

import json
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from protocols.policies.registry import policy_class, policy_names
from testbed.campaign.command_table import RUN_FIELDS, TABLE_FIELDS
from testbed.campaign.endpoint import ModelSettings
from testbed.campaign.model import CampaignError, Options
from testbed.campaign.parse import load_campaign
from testbed.campaign.schema import schemas
from testbed.cli import main
from testbed.links.netdef import HOST_FIELDS, NETWORK_FIELDS

ROOT = Path(__file__).resolve().parents[3]
CAMPAIGNS = sorted([*ROOT.glob("testbed/campaign/presets/*.toml"),
                    *ROOT.glob("results/configs/*.toml"),
                    *ROOT.glob("docs/examples/*/campaign.toml")])
NETWORK_FILES = sorted(ROOT.glob("testbed/links/presets/*.toml"))


def problems(schema: dict[str, Any], value: Any) -> list[str]:
    """What VALUE breaks of SCHEMA, as an editor's JSON Schema validator reports it."""
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(value)]


def test_every_shipped_campaign_is_valid_for_the_schema_and_the_models(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(CAMPAIGNS) >= 17 + 15 + 3
    schema = schemas()["campaign"]
    for path in CAMPAIGNS:
        monkeypatch.syspath_prepend(str(path.parent))  # an example's plugin, as its README
        data = tomllib.loads(path.read_text())
        assert problems(schema, data) == [], path
        assert load_campaign(path).name == data["name"]


def test_every_shipped_network_file_is_valid_for_the_schema() -> None:
    assert NETWORK_FILES
    schema = schemas()["networks"]
    for path in NETWORK_FILES:
        assert problems(schema, tomllib.loads(path.read_text())) == [], path


def test_the_schema_names_exactly_the_fields_the_parsers_take() -> None:
    network = schemas()["network"]
    assert tuple(network["properties"]) == NETWORK_FIELDS
    host = network["properties"]["hosts"]["additionalProperties"]
    assert tuple(host["properties"]) == HOST_FIELDS
    command = schemas()["command"]
    assert tuple(command["properties"]) == TABLE_FIELDS
    assert tuple(command["properties"]["run"]["items"]["properties"]) == RUN_FIELDS
    model = schemas()["model"]["properties"]
    assert tuple(model) == tuple(f.name for f in fields(ModelSettings))
    options = schemas()["campaign"]["$defs"]["OptionsTable"]["properties"]
    assert tuple(options) == tuple(f.name for f in fields(Options))
    assert options["backend"]["default"] == Options().backend


BASE: dict[str, Any] = {"name": "t", "seed": 1, "templates": 3,
        "grid": {"policy": ["planfence"], "network": ["loopback"]}}


#: (the file's change, the message, whether the JSON Schema refuses it too: what depends
#: on the kind or on the registries only the models check)
@pytest.mark.parametrize(("change", "message", "schema_too"), [
    ({"options": 3}, "options: expected an [options] table", True),
    ({"options": {"link_log": "yes"}}, "options.link_log: 'yes' is not allowed; allowed: "
                                       "true, false", True),
    ({"execution": {"jobs": 0}}, "execution.jobs: 0 is not allowed; allowed: an integer >= 1",
     True),
    ({"execution": {"cluster": "local:0"}}, "execution.cluster: 'local:0' is not allowed; "
                                            "allowed: local:N (N >= 1) or tcp://HOST:PORT", True),
    ({"grid": "planfence"}, "grid: expected a [grid] table or [[grid]] tables", True),
    ({"grid": {**BASE["grid"], "scenario": "handoff"}},
     "grid.scenario: only for kind = 'handoff' campaigns; this campaign's kind is 'episodes'",
     False),
    ({"grid": [BASE["grid"], {"network": "att"}]}, "grid[1].policy: missing; list at least "
                                                  "one value", False),
    ({"grid": {**BASE["grid"], "keys": {"a": 1}}},
     "grid.keys: expected a value or a list of values, not a table", True),
    ({"policies": {"fastest": {}}}, "policies.fastest: unknown policy; allowed: ",
     False),
    ({"description": 5}, "description: 5 is not allowed; allowed: a string", True),
    ({"kind": "movie"}, "kind: 'movie' is not allowed; allowed: episodes, replanning, "
                        "handoff, live, command", True),
])
def test_bad_values_are_one_line_and_refused_by_the_schema(change: dict[str, Any],
                                                            message: str,
                                                            schema_too: bool,
                                                            tmp_path: Path) -> None:
    data = {**BASE, **change}
    path = tmp_path / "c.toml"
    path.write_text(_toml(data))
    with pytest.raises(CampaignError) as info:
        load_campaign(path)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)
    assert (problems(schemas()["campaign"], data) != []) == schema_too


def _toml(data: dict[str, Any]) -> str:
    """DATA as TOML (the few shapes the cases above use)."""
    top = [f"{k} = {json.dumps(v)}" for k, v in data.items() if not isinstance(v, dict)
           and not (isinstance(v, list) and v and isinstance(v[0], dict))]
    tables = []
    for key, value in data.items():
        if isinstance(value, dict):
            tables.append(_table(key, value))
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            tables += [_table(key, v, array=True) for v in value]
    return "\n".join([*top, *tables]) + "\n"


def _table(name: str, table: dict[str, Any], *, array: bool = False) -> str:
    head = f"[[{name}]]" if array else f"[{name}]"
    lines = [head]
    for key, value in table.items():
        if isinstance(value, dict):
            inner = ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items())
            lines.append(f"{key} = {{ {inner} }}")
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines)


def test_policy_tables_list_every_policys_parameters() -> None:
    policies = schemas()["campaign"]["properties"]["policies"]["properties"]
    assert sorted(policies) == sorted(policy_names())
    with_params = [n for n in policy_names() if (cls := policy_class(n)) and cls.parameters]
    assert with_params, "no registered policy declares parameters"
    for name in with_params:
        cls = policy_class(name)
        assert cls is not None
        for param in cls.parameters:
            field = policies[name]["properties"][param.name]
            assert field["default"] == param.default
            assert problems(field, param.default) == []


def test_a_plugins_parameters_are_in_the_schema_it_prints(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "docs" / "examples" / "lease-policy"))
    assert main(["schema", "--plugin", "planfence_lease"]) == 0
    printed = json.loads(capsys.readouterr().out)
    lease = printed["properties"]["policies"]["properties"]["lease"]["properties"]
    assert "lease_ms" in lease
    assert problems(lease["lease_ms"], 2000) == []
    assert problems(lease["lease_ms"], "long") != []


def test_the_schema_command_prints_each_schema(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("campaign", "network", "networks", "command", "model"):
        assert main(["schema", name]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed == json.loads(json.dumps(schemas()[name]))
        assert printed["$schema"].startswith("http://json-schema.org/draft-07")
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "testbed campaign"
