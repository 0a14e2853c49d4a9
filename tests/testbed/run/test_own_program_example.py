"""The worked example of docs/own-programs.md (docs/examples/own-program): plain programs
with no testbed imports, the committed run in results/examples/own-program made from this very
campaign file, and its programs still running as a command workload today (one short
episode over the fixed link; privileged, real namespaces)."""

from __future__ import annotations

import ast
import json
import os
import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from protocols.history_check import CURRENT, STALE, STALE_IN_WINDOW, check_history
from testbed import api
from testbed.campaign.parse import load_campaign
from testbed.results.history import episode_folders, read_episode

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "docs" / "examples" / "own-program"
RESULTS = ROOT / "results" / "examples" / "own-program"


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("program", ["server.py", "client.py"])
def test_the_example_programs_use_the_standard_library_only(program: str) -> None:
    modules = _imported_modules(EXAMPLE / program)
    assert modules, "no imports found: the check would prove nothing"
    assert modules <= set(sys.stdlib_module_names), modules - set(sys.stdlib_module_names)


def test_the_committed_run_is_of_the_example_campaign() -> None:
    """results/examples/own-program and its report come from this file as it is now (edit the
    example, rerun it: docs/examples/own-program/README.md)."""
    manifest = json.loads((RESULTS / "manifest.json").read_text())
    campaign = load_campaign(EXAMPLE / "campaign.toml")
    expected = json.loads(json.dumps(campaign.config(), default=str))
    # the programs' folder is recorded as an absolute path: the checkout the run was made
    # in, not necessarily this one
    recorded_cwd = Path(manifest["config"]["command"].pop("cwd"))
    assert recorded_cwd.parts[-3:] == Path(expected["command"].pop("cwd")).parts[-3:]
    assert manifest["config"] == expected
    episodes = pd.read_parquet(RESULTS / "episodes.parquet")
    assert len(episodes) == len(campaign.episodes())
    assert not episodes["aborted"].any()


@pytest.mark.privileged
@pytest.mark.slow
def test_the_example_runs_as_a_command_workload(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    if not os.path.exists("/dev/net/tun"):
        pytest.skip("needs /dev/net/tun")
    data = tomllib.loads((EXAMPLE / "campaign.toml").read_text())
    data["templates"] = 1
    data["command"]["unit_ms"] = 100  # 32 units: 3 s of schedule after the 2 s lead
    data["grid"].update(network=["fixed12"], rho=[4])
    campaign = api.from_dict(data, base_dir=EXAMPLE)
    summary = api.run(campaign, tmp_path / "out", console=None)
    assert (summary.ran, summary.aborted, summary.failures) == (1, 0, ()), summary
    episodes = api.episodes(tmp_path / "out")
    actions = api.actions(tmp_path / "out")
    row = episodes.iloc[0]
    assert not row["aborted"], row["abort_reason"]
    assert len(actions) == int(row["scheduled_actions"]) > 0
    assert actions["ok"].notna().all()
    # every check crosses the client's link twice: 2 x 20 ms (the service is unshaped)
    assert actions["stall_ms"].min() >= 40.0, actions["stall_ms"].describe()
    per_host = json.loads(row["link_host_bytes"])
    assert {"a0", "a1", "a2"} <= set(per_host)
    assert all(per_host[h]["up_bytes"] > 0 for h in ("a0", "a1", "a2"))
    # The testbed judges the actions from the programs' histories (docs/history.md): a
    # plan the service found superseded is stale; one it found current is current, or
    # stale only by a write that landed in the check's window (after the request left).
    (folder,) = [f for _, f in episode_folders(tmp_path / "out")]
    verdicts = {v.action: v for v in check_history(read_episode(folder)).verdicts}
    assert set(verdicts) == set(actions["action"])
    for action in actions.itertuples():
        status = verdicts[str(action.action)].status
        assert status in ((CURRENT, STALE_IN_WINDOW) if action.ok else (STALE, STALE_IN_WINDOW))
    assert row["stale_actions"] == sum(v.status != CURRENT for v in verdicts.values())
    assert row["stale_actions"] > 0  # rho 4: updates land between plans and actions
