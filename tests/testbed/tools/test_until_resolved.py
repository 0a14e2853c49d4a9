"""`testbed check`'s expected resolution (from the shipped spread table), `testbed spread`,
and `testbed run --until-resolved` growing a loopback campaign with real node processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from testbed.campaign.parse import parse_campaign
from testbed.report.spread import SPREAD_TABLE, read_spread_table
from testbed.tools.resolution_view import resolution_lines


def _testbed(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=900, check=False)


def _campaign(network: str, templates: int) -> dict[str, object]:
    return {"name": "resolve", "seed": 3, "templates": templates,
            "options": {"episode_timeout_s": 120},
            "grid": {"policy": ["planfence", "batched_all_key"], "network": [network],
                     "agents": [3], "keys": [6], "units": [8], "rho": [4]}}


def test_the_shipped_spread_table_has_the_headline_comparison() -> None:
    table = read_spread_table(SPREAD_TABLE)
    row = table["att/fresh/rho=4/planfence:batched_all_key"]
    assert row.templates >= 9
    assert 0 < row.resolution < 1
    assert row.expected(row.templates, row.repeats) == pytest.approx(
        row.curve.at(row.templates), rel=1e-9)


def test_check_prints_the_expected_resolution_from_earlier_runs() -> None:
    campaign = parse_campaign({**_campaign("att", 10),
                               "grid": {"policy": ["planfence", "batched_all_key"],
                                        "network": ["att"], "rho": [4]}})
    lines = resolution_lines(campaign)
    assert len(lines) == 1
    assert "planfence:batched_all_key on att, fresh, rho=4: expected resolution ±" in lines[0]
    assert "at 10 templates x 1 repeats" in lines[0]
    unknown = parse_campaign({**_campaign("fixed", 10)})
    assert "no expected resolution" in resolution_lines(unknown)[0]


@pytest.mark.slow
def test_until_resolved_grows_templates_and_says_why_it_stopped(tmp_path: Path) -> None:
    path = tmp_path / "resolve.toml"
    data = _campaign("loopback", 3)
    grid = data["grid"]
    assert isinstance(grid, dict)
    lines = [f'name = "{data["name"]}"', f"seed = {data['seed']}",
             f"templates = {data['templates']}", "[options]", "episode_timeout_s = 120",
             "[grid]", 'policy = ["planfence", "batched_all_key"]', 'network = ["loopback"]',
             "agents = [3]", "keys = [6]", "units = [8]", "rho = [4]"]
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    # an unreachable target with a cap of 6 templates and 2 repeats: one round of
    # templates (3 -> 6), one of repeats (1 -> 2), then the cap
    proc = _testbed("run", str(path), "--out", str(out), "--until-resolved", "0.01",
                    "--compare", "planfence:batched_all_key", "--max-templates", "6",
                    "--max-repeats", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "until-resolved: 3 templates x 1 repeats" in proc.stdout
    assert "until-resolved: 6 templates x 1 repeats" in proc.stdout
    assert "until-resolved: 6 templates x 2 repeats" in proc.stdout
    assert "cap reached (6 templates, 2 repeats)" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    rounds = manifest["until_resolved"]["rounds"]
    assert [(r["templates"], r["repeats"]) for r in rounds] == [(3, 1), (6, 1), (6, 2)]
    episodes = pd.read_parquet(out / "episodes.parquet")
    assert episodes["template"].nunique() == 6
    assert (episodes.groupby("episode")["repeat"].nunique() == 2).all()
    assert not episodes.duplicated(["episode", "attempt"]).any()
    # a target any run meets: resolved, but only once two templates per family back it
    again = _testbed("run", str(path), "--out", str(tmp_path / "wide"), "--until-resolved",
                     "99", "--compare", "planfence:batched_all_key", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "until-resolved: growing, templates 3 -> 6" in again.stdout
    assert "until-resolved: resolved" in again.stdout
    # naming a policy the grid does not have is the user's error, in one line
    bad = _testbed("run", str(path), "--out", str(tmp_path / "bad"), "--until-resolved", "5",
                   "--compare", "planfence:metadata_sync", cwd=tmp_path)
    assert bad.returncode == 2
    assert "--compare: policy 'metadata_sync' is not in the campaign's grid" in bad.stderr
