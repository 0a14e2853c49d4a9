"""Plugin policies in campaigns, through the command line in fresh processes: the lease
example installed with pip (entry point) and named by ``plugins =``, next to built-in
policies on loopback; malformed plugins refused in one line before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "lease-policy"

CAMPAIGN = """
name = "{name}"
seed = 9
templates = 2
{plugins}
[policies.lease]
lease_ms = 3000

[grid]
policy = ["lease", "planfence", "batched_all_key"]
network = ["loopback"]
rho = [4]
deps = [2]
connection = ["reuse"]
units = [16]
"""


def run_testbed(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, cwd=cwd or ROOT,
                          timeout=600, check=False)


def _check_run(out: Path) -> pd.DataFrame:
    from testbed import api

    episodes = api.episodes(out)
    actions = api.actions(out)
    assert set(episodes["policy"]) == {"lease/lease_ms=3000", "planfence", "batched_all_key"}
    assert (episodes["aborted"] == False).all()  # noqa: E712
    # The same schedules for built-in and plugin policies: digests match per template.
    digests = episodes.groupby("template")["schedule_digest"].nunique()
    assert (digests == 1).all(), digests
    lease = episodes[episodes["policy"].str.startswith("lease")]
    assert (lease["kib_per_action"] > 0).all()
    assert (lease["rounds_per_action"] > 0).all()
    assert not actions[actions["policy"].str.startswith("lease")]["invalid"].any()
    return episodes


@pytest.mark.slow
def test_the_lease_example_installed_with_pip_runs_next_to_builtin_policies(
        tmp_path: Path) -> None:
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          "--target", str(target), str(EXAMPLE)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert pip.returncode == 0, pip.stderr
    env = {"PYTHONPATH": os.pathsep.join([str(target), str(ROOT)])}
    listed = run_testbed("policies", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert any(line.startswith("lease ") and "plugin planfence-lease:lease "
               "(planfence-lease 0.1.0)" in line for line in listed.stdout.splitlines())
    toml = tmp_path / "installed.toml"
    toml.write_text(CAMPAIGN.format(name="installed", plugins=""))
    out = tmp_path / "out"
    run = run_testbed("run", str(toml), "--out", str(out), env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    recorded = manifest["plugins"]["planfence-lease:lease"]
    assert recorded["distribution"] == "planfence-lease"
    assert recorded["version"] == "0.1.0"
    assert len(recorded["source_sha256"]) == 64
    _check_run(out)


@pytest.mark.slow
def test_a_plugin_named_in_the_campaign_runs_and_resume_refuses_a_changed_one(
        tmp_path: Path) -> None:
    package = tmp_path / "planfence_lease"
    package.mkdir()
    source = (EXAMPLE / "planfence_lease" / "__init__.py").read_text()
    (package / "__init__.py").write_text(source)
    toml = tmp_path / "named.toml"
    toml.write_text(CAMPAIGN.format(name="named", plugins='plugins = ["planfence_lease"]'))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = tmp_path / "out"
    run = run_testbed("run", str(toml), "--out", str(out), env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    _check_run(out)
    assert run_testbed("run", str(toml), "--out", str(out), "--resume", env=env).returncode == 0
    (package / "__init__.py").write_text(source + "\n# changed\n")
    refused = run_testbed("run", str(toml), "--out", str(out), "--resume", env=env)
    assert refused.returncode == 2
    assert "plugin 'planfence_lease' changed since the run was recorded" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


BAD_PLUGINS = {
    "import_error": ("import no_such_module_anywhere\n", "No module named"),
    "builtin_name": ("from protocols.api import Policy, register\n"
                     "@register\nclass P(Policy):\n    name = 'planfence'\n",
                     "policy name 'planfence' collides with a built-in policy"),
    "rpc_name": ("from protocols.api import Map, Policy, Rpc, register\n"
                 "@register\nclass P(Policy):\n    name = 'mine'\n"
                 "    rpcs = (Rpc('announce', request=Map(), handler='h'),)\n",
                 "rpc 'announce' collides with the one of adaptive, metadata_sync"),
    "bad_schema": ("from protocols.api import Map, Policy, Rpc, register\n"
                   "@register\nclass P(Policy):\n    name = 'mine'\n"
                   "    rpcs = (Rpc('mine', request=Map({'a': 5}), handler='h'),)\n",
                   "Map field 'a': 5 is not a schema"),
}


@pytest.mark.parametrize("kind", sorted(BAD_PLUGINS))
def test_a_malformed_plugin_is_refused_in_one_line_naming_it(kind: str,
                                                             tmp_path: Path) -> None:
    code, message = BAD_PLUGINS[kind]
    plugin = tmp_path / f"{kind}.py"
    plugin.write_text(code)
    toml = tmp_path / "bad.toml"
    toml.write_text(CAMPAIGN.format(name="bad", plugins=f'plugins = ["{kind}.py"]')
                    .replace('"lease", ', ""))
    for args in (("check", str(toml)), ("run", str(toml), "--out", str(tmp_path / "o"))):
        result = run_testbed(*args)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert f"plugin '{plugin}'" in lines[0], lines[0]
        assert message in lines[0], lines[0]
    assert not (tmp_path / "o").exists()  # refused before anything started
    cli = run_testbed("policies", "list", "--plugin", str(plugin))
    assert cli.returncode == 2
    assert message in cli.stderr
