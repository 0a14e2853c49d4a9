"""The real-store examples (docs/examples/redis-store, etcd-store): agents that keep
their plans in Redis or etcd, naive or check-before-act, judged by the testbed's
checker from their histories, not by the agents. The committed runs are of the
campaign files as they are; the campaigns still run (privileged, real namespaces; each
needs its store installed, as the example's setup.sh does)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from protocols.history_check import CURRENT, check_history
from testbed import api
from testbed.campaign.parse import load_campaign
from testbed.results.history import episode_folders, read_episode

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "docs" / "examples"
STORES = ["redis-store", "etcd-store"]


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("example", STORES)
def test_the_programs_import_no_testbed_code(example: str) -> None:
    """Plain programs: the standard library, the store's own client, each other."""
    programs = sorted((EXAMPLES / example).glob("*.py"))
    allowed = set(sys.stdlib_module_names) | {"redis"} | {p.stem for p in programs}
    for program in programs:
        modules = _imported_modules(program)
        assert modules, f"{program.name}: no imports found: the check would prove nothing"
        assert modules <= allowed, (program.name, modules - allowed)


@pytest.mark.parametrize("example", STORES)
def test_the_committed_run_is_of_the_campaign_and_judged_so(example: str) -> None:
    """results/examples/<example> comes from the campaign file as it is now (edit the
    example, rerun it: its README), and its histories, judged again, say what its
    README says: the naive arm acted on stale plans, the check arm never."""
    results = ROOT / "results" / "examples" / example
    manifest = json.loads((results / "manifest.json").read_text())
    expected = json.loads(json.dumps(load_campaign(EXAMPLES / example / "campaign.toml")
                                     .config(), default=str))
    recorded_cwd = Path(manifest["config"]["command"].pop("cwd"))
    assert recorded_cwd.parts[-3:] == Path(expected["command"].pop("cwd")).parts[-3:]
    assert manifest["config"] == expected
    stale = {"naive": 0, "check": 0}
    folders = list(episode_folders(results))
    assert len(folders) == 8
    for key, folder in folders:
        verdicts = check_history(read_episode(folder)).verdicts
        assert verdicts, key
        stale[key.split("_", 1)[0]] += sum(v.status != CURRENT for v in verdicts)
    assert stale["naive"] > 0
    assert stale["check"] == 0


def _python3_imports(module: str) -> bool:
    """Whether the `python3` the campaign's programs run imports MODULE."""
    python3 = shutil.which("python3")
    return python3 is not None and subprocess.run(
        [python3, "-c", f"import {module}"], capture_output=True, check=False).returncode == 0


def _needs(example: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0 or not os.path.exists("/dev/net/tun"):
        pytest.skip("needs root and /dev/net/tun for network namespaces")
    if example == "redis-store":
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server is not installed (docs/examples/redis-store/setup.sh)")
        if not _python3_imports("redis"):
            if importlib.util.find_spec("redis") is None:
                pytest.skip("the redis client is not installed (pip install 'planfence-testbed[examples]')")
            # the programs' python3: this interpreter's, which has the client
            monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    elif shutil.which("etcd") is None:
        pytest.skip("etcd is not installed (docs/examples/etcd-store/setup.sh)")


@pytest.mark.privileged
@pytest.mark.slow
@pytest.mark.parametrize("example", STORES)
def test_naive_agents_act_stale_and_checking_agents_never(
        example: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs(example, monkeypatch)
    folder = EXAMPLES / example
    data = tomllib.loads((folder / "campaign.toml").read_text())
    data["templates"] = 1
    data["command"]["unit_ms"] = 150  # 32 units: 5 s of schedule after the 2 s lead
    # rho 4: a relevant update lands between every plan and its action (schedule rule 5)
    data["grid"].update(network=["fixed12"], rho=[4])
    summary = api.run(api.from_dict(data, base_dir=folder), tmp_path / "out", console=None)
    assert (summary.ran, summary.aborted, summary.failures) == (2, 0, ()), summary
    rows = {str(r["policy"]): r for r in api.episodes(tmp_path / "out").to_dict("records")}
    actions = api.actions(tmp_path / "out")
    for arm in ("naive", "check"):
        row = rows[arm]
        assert not row["aborted"], row["abort_reason"]
        reported = actions[actions["policy"] == arm]
        assert len(reported) == int(row["scheduled_actions"]) > 0
        assert reported["ok"].all(), reported[~reported["ok"]]  # every action issued
    # judged by the checker from the histories, not by what the agents report
    assert int(rows["naive"]["stale_actions"]) > 0
    assert int(rows["check"]["stale_actions"]) == 0
    assert int(rows["check"]["stale_in_window_actions"]) == 0
    # checking costs at least one round trip to the store over the agent's link (40 ms)
    stalls = [float(x) for x in actions[actions["policy"] == "check"]["stall_ms"]]
    assert min(stalls) >= 40.0, stalls
