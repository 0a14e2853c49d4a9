"""Live campaigns as data: the [model] table, the live kind's grid, its schedules and
presets, and the ``decisions`` field of replay campaigns (no process, no socket)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.campaign.decisions import DecisionsError
from testbed.campaign.endpoint import ModelTableError
from testbed.campaign.live import correct_option, live_roles, live_schedule, task_content
from testbed.campaign.model import CampaignError
from testbed.campaign.parse import campaign_from_config, load_campaign, parse_campaign
from testbed.errors import UserError


def live(model: dict[str, Any] | None = None, **grid: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"name": "l", "seed": 1, "templates": 3, "kind": "live",
                            "grid": {"policy": ["planfence"], "network": ["loopback"],
                                     **grid}}
    if model is not None:
        data["model"] = model
    return data


def test_a_live_schedule_depends_on_the_task_only() -> None:
    a = live_schedule(seed=3, family="deployment", template="deployment-02")
    b = live_schedule(seed=3, family="deployment", template="deployment-02")
    assert a.digest == b.digest
    assert a == b
    roles = live_roles(a)
    assert len({roles.planner, roles.executor, roles.auditor}) == 3
    assert roles.owner != roles.executor
    assert roles.auditor != roles.owner
    assert a.updates()[0].content == task_content(3, "deployment-02", 1)
    assert correct_option(a.seeds[int(roles.key[1:])].content) != correct_option(
        a.updates()[0].content)


def test_the_live_grid_and_its_cells() -> None:
    campaign = parse_campaign(live(policy=["planfence", "owner_head_freshness"],
                                   executor_inputs=["local", "fresh"],
                                   overlap=["none", "in_generation"]))
    assert len(campaign.cells()) == 8
    cell = campaign.cells()[0]
    assert cell.id.endswith("_exec-local_overlap-none")
    assert campaign.model is not None
    assert campaign.model.base_url.endswith(":8800/v1")
    assert "model" in campaign.config()
    assert "api_key_env" in campaign.config()["model"]


@pytest.mark.parametrize(("field", "value", "allowed"), [
    ("base_url", "ftp://host/v1", "http(s) URL"),
    ("base_url", 8000, "http(s) URL"),
    ("model", "", "model name"),
    ("temperature", 3, "0..2"),
    ("top_p", 0, "> 0 and <= 1"),
    ("max_tokens", 0, "integers 1..131072"),
    ("timeout_s", -1, "seconds > 0"),
    ("seed", -5, "integer >= 0"),
    ("concurrency", 0, "integers 1..64"),
    ("placement", "moon", "beside, central"),
    ("api_key_env", "1BAD-NAME", "environment variable"),
    ("response_format", "xml", "none, json_object, json_schema"),
])
def test_a_bad_model_field_is_one_line_naming_it(field: str, value: Any, allowed: str
                                                  ) -> None:
    with pytest.raises(ModelTableError) as info:
        parse_campaign(live({field: value}))
    message = str(info.value)
    assert message.startswith(f"model.{field}: ")
    assert allowed in message
    assert "\n" not in message


def test_unknown_model_field_and_misplaced_tables() -> None:
    with pytest.raises(ModelTableError, match="model: unknown field 'api_key'; allowed"):
        parse_campaign(live({"api_key": "sk-123"}))
    plain = {"name": "p", "seed": 1, "templates": 3, "model": {},
             "grid": {"policy": ["planfence"], "network": ["loopback"]}}
    with pytest.raises(CampaignError, match=r"^model: only for kind = 'live'"):
        parse_campaign(plain)
    with pytest.raises(CampaignError, match=r"^decisions: only for replay campaigns"):
        parse_campaign({**live(), "decisions": "somewhere"})
    with pytest.raises(CampaignError, match=r"^grid\.agents: 2 is not allowed in a live"):
        parse_campaign(live(agents=[2]))
    with pytest.raises(CampaignError, match=r"^grid\.overlap: 'sometimes' is not allowed"):
        parse_campaign(live(overlap=["sometimes"]))


def test_the_cli_refuses_a_bad_model_table_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('name = "b"\nseed = 1\ntemplates = 3\nkind = "live"\n'
                    '[model]\ntemperature = 9\n'
                    '[grid]\npolicy = ["planfence"]\nnetwork = ["loopback"]\n')
    proc = subprocess.run([sys.executable, "-m", "testbed", "run", str(path), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "testbed run: model.temperature: 9 is not allowed; allowed: a number 0..2"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("preset", "cells", "episodes"), [
    ("live", 3, 90), ("live_fresh_before", 3, 90), ("live_overlap", 4, 36)])
def test_the_live_presets(preset: str, cells: int, episodes: int) -> None:
    campaign = load_campaign(preset)
    assert campaign.kind == "live"
    assert campaign.model is not None
    assert len(campaign.cells()) == cells
    assert len(campaign.episodes()) == episodes
    families = [t.split("-")[0] for t in campaign.templates]
    assert len(set(families)) == 3
    assert families.count("fulfillment") == len(families) // 3


def _fake_live_run(run: Path, decisions: dict[str, list[dict[str, Any]]]) -> None:
    folder = run / "decisions"
    folder.mkdir(parents=True)
    for family, made in decisions.items():
        lines = [json.dumps({"role": "planner", "family": family, "decision": d,
                             "error": ""}) for d in made]
        lines.append(json.dumps({"role": "planner", "family": family, "decision": None,
                                 "error": "model failure"}))
        (folder / f"x~{family}-01.jsonl").write_text("\n".join(lines) + "\n")


def test_a_replay_campaign_takes_a_live_runs_planner_decisions(tmp_path: Path) -> None:
    made = {f: [{"tool": "t", "arguments": {"option": f"{f}-{i}"}} for i in range(2)]
            for f in ("reservation", "fulfillment", "deployment")}
    _fake_live_run(tmp_path / "run", made)
    base = {"name": "r", "seed": 4, "templates": 3,
            "grid": {"policy": ["planfence"], "network": ["loopback"], "units": [16]}}
    replay = parse_campaign({**base, "decisions": "run"}, base_dir=tmp_path)
    plain = parse_campaign(base)
    cell = replay.cells()[0]
    for template in replay.templates:
        ours, theirs = replay.schedule(cell, template), plain.schedule(cell, template)
        assert ours.digest != theirs.digest
        assert [e.unit for e in ours.events] == [e.unit for e in theirs.events]
        family = template.split("-")[0]
        allowed = {json.dumps(d, sort_keys=True, separators=(",", ":")) for d in made[family]}
        assert {p.decision for p in ours.plans()} <= allowed
        assert replay.schedule(cell, template) == ours  # identical every time
    again = campaign_from_config(replay.config())  # a manifest's config reads back
    assert again.schedule(cell, "fulfillment-01") == replay.schedule(cell, "fulfillment-01")


def test_decisions_that_changed_or_do_not_exist_are_refused(tmp_path: Path) -> None:
    base = {"name": "r", "seed": 4, "templates": 3,
            "grid": {"policy": ["planfence"], "network": ["loopback"]}}
    with pytest.raises(UserError, match=r"^decisions: .* is not a directory"):
        parse_campaign({**base, "decisions": str(tmp_path / "none")})
    (tmp_path / "empty").mkdir()
    with pytest.raises(DecisionsError, match="has no decisions/"):
        parse_campaign({**base, "decisions": str(tmp_path / "empty")})
    _fake_live_run(tmp_path / "half", {"reservation": [{"tool": "t", "arguments": {}}]})
    with pytest.raises(DecisionsError, match="no accepted planner decision of family"):
        parse_campaign({**base, "decisions": str(tmp_path / "half")})
    made = {f: [{"tool": "t", "arguments": {"option": f}}]
            for f in ("reservation", "fulfillment", "deployment")}
    _fake_live_run(tmp_path / "run", made)
    config = parse_campaign({**base, "decisions": str(tmp_path / "run")}).config()
    (tmp_path / "run" / "decisions" / "x~fulfillment-01.jsonl").write_text(
        json.dumps({"role": "planner", "family": "fulfillment", "decision": {"x": 1}}) + "\n")
    with pytest.raises(CampaignError, match="have changed since this run started"):
        campaign_from_config(config)
