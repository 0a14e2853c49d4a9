"""End to end through the command line: real node processes, real sockets, real links.

These run small campaigns exactly as a user would (``python -m testbed run FILE``)
and check the result files, their schema and that each policy's invalid counts and
stall are physically plausible. The resume test kills a campaign with SIGKILL mid-way
and finishes it with ``--resume``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from testbed.results.schema import ACTION_COLUMNS, EPISODE_COLUMNS
from tests.leftovers import watch_runs

REQUIRED_ACTION_COLUMNS = (
    "campaign", "cell", "episode", "policy", "network", "backend", "trace_offset_s",
    "connection", "agents", "keys", "deps", "rho", "tier", "family", "template", "action",
    "outcome", "invalid", "complete", "replans", "stall_ms", "bytes", "connections")
REQUIRED_EPISODE_COLUMNS = (
    "episode", "family", "template", "attempted_actions", "updates", "aborted",
    "abort_reason", "stall_ms_per_action", "kib_per_action", "connections", "link_bytes",
    "wall_s")


def _testbed(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=timeout, check=False)


def _write_campaign(path: Path, name: str, networks: list[str], templates: int,
                    policies: list[str], units: int = 16) -> Path:
    nets = ", ".join(f'"{n}"' for n in networks)
    pols = ", ".join(f'"{p}"' for p in policies)
    path.write_text(f"""
name = "{name}"
seed = 11
templates = {templates}

[options]
delay_ms = 20
episode_timeout_s = 120

[grid]
policy = [{pols}]
network = [{nets}]
rho = [4]
agents = [3]
keys = [6]
connection = ["fresh"]
units = [{units}]
""")
    return path


def _is_root() -> bool:
    return os.geteuid() == 0


@pytest.mark.slow
def test_tiny_campaign_loopback_and_fixed(tmp_path: Path) -> None:
    networks = ["loopback", "fixed"] if _is_root() and Path("/dev/net/tun").exists() \
        else ["loopback"]
    campaign = _write_campaign(tmp_path / "tiny.toml", "tiny", networks, 2,
                               ["owner_head_freshness", "planfence"])
    out = tmp_path / "out"
    proc = _testbed("run", str(campaign), "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]

    actions = pd.read_parquet(out / "actions.parquet")
    episodes = pd.read_parquet(out / "episodes.parquet")
    assert set(REQUIRED_ACTION_COLUMNS) <= set(actions.columns)
    assert set(REQUIRED_EPISODE_COLUMNS) <= set(episodes.columns)
    assert list(actions.columns) == list(ACTION_COLUMNS)
    assert list(episodes.columns) == list(EPISODE_COLUMNS)
    assert len(episodes) == 2 * len(networks) * 2
    assert not episodes["aborted"].any(), episodes["abort_reason"].tolist()
    assert (out / "manifest.json").exists()

    for network in networks:
        mine = actions[actions["network"] == network]
        fresh = mine[mine["policy"] == "owner_head_freshness"]
        fence = mine[mine["policy"] == "planfence"]
        # rho = 4: a relevant update lands between planning and every action, so the
        # freshness control acts on a stale plan every time and PlanFence never does.
        assert (fresh["outcome"] == "released").all()
        assert fresh["invalid"].all()
        assert (fence["outcome"] == "released").all(), fence["block_reason"].tolist()
        assert not fence["invalid"].any()
        assert (fence["replans"] == 1).all()
        assert fence["complete"].all()

    ep = episodes.set_index(["network", "policy", "template"]).sort_index()
    if "fixed" in networks:
        # Each remote owner query crosses four 20 ms access-link crossings (80 ms round
        # trip). Some executors own the declared key themselves (no network), so the
        # per-action mean must exceed a conservative fraction of one round trip and
        # loopback must be far cheaper than the emulated link.
        fixed_stall = ep.loc[("fixed", "planfence")]["stall_ms_per_action"]
        loop_stall = ep.loc[("loopback", "planfence")]["stall_ms_per_action"]
        assert (fixed_stall > 20).all(), fixed_stall.tolist()
        assert fixed_stall.median() > 3 * loop_stall.median()
        assert (ep.loc[("fixed", "planfence")]["link_bytes"] > 0).all()
    # Traffic: the frames counted by the nodes are non-zero for a policy that queries.
    assert (ep.xs("planfence", level="policy")["kib_per_action"] > 0).all()

    report = _testbed("report", str(out), "--draws", "200", cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-3000:]
    assert (out / "report.md").stat().st_size > 0


@pytest.mark.slow
def test_killed_campaign_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    campaign = _write_campaign(tmp_path / "resume.toml", "resume", ["loopback"], 3,
                               ["local_replica", "planfence"], units=16)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", str(campaign), "--out",
                             str(out)], cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        shards = out / "shards" / "episodes"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if shards.exists() and len(list(shards.glob("*.parquet"))) >= 2:
                break
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "campaign finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)  # the controller and its node processes
    finally:
        proc.wait(timeout=30)
    done_before = len(list((out / "shards" / "episodes").glob("*.parquet")))
    assert 2 <= done_before < 6

    again = _testbed("run", str(campaign), "--out", str(out), cwd=tmp_path)
    assert again.returncode != 0
    assert "--resume" in again.stderr

    resumed = _testbed("run", str(campaign), "--out", str(out), "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    episodes = pd.read_parquet(out / "episodes.parquet")
    actions = pd.read_parquet(out / "actions.parquet")
    assert len(episodes) == 6
    assert episodes["episode"].is_unique
    assert not actions.duplicated(["episode", "action"]).any()
    assert set(actions["episode"]) == set(episodes["episode"])


@pytest.mark.slow
def test_parallel_lanes_then_extend_on_real_topologies(tmp_path: Path) -> None:
    """Two topologies live at once (own prefixes, emulators and nodes), then the campaign
    grows by a template with --extend: every episode once, none aborted, physics intact,
    and nothing left behind in the kernel."""
    network = "fixed" if _is_root() and Path("/dev/net/tun").exists() else "loopback"
    campaign = _write_campaign(tmp_path / "lanes.toml", "lanes", [network], 2,
                               ["owner_head_freshness", "planfence"])
    out = tmp_path / "out"
    with watch_runs() as runs:
        proc = _testbed("run", str(campaign), "--out", str(out), "--jobs", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert runs.prefixes, "the watch saw none of the run's ledgers"
    assert runs.leftovers() == set(), "a lane left something behind"
    first = pd.read_parquet(out / "episodes.parquet")
    assert len(first) == 4

    grown = _write_campaign(tmp_path / "lanes.toml", "lanes", [network], 3,
                            ["owner_head_freshness", "planfence"])
    refused = _testbed("run", str(grown), "--out", str(out), "--resume", cwd=tmp_path)
    assert refused.returncode != 0
    assert "--extend" in refused.stderr
    with watch_runs() as runs:
        proc = _testbed("run", str(grown), "--out", str(out), "--extend", "--jobs", "2",
                        cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    episodes = pd.read_parquet(out / "episodes.parquet")
    actions = pd.read_parquet(out / "actions.parquet")
    assert len(episodes) == 6
    assert episodes["episode"].is_unique
    assert not episodes["aborted"].any(), episodes["abort_reason"].tolist()
    assert set(first["episode"]) < set(episodes["episode"])
    kept = episodes.set_index("episode").loc[first["episode"], "wall_s"]
    assert (kept.to_numpy() == first["wall_s"].to_numpy()).all(), "old episodes not rerun"
    fence = actions[actions["policy"] == "planfence"]
    assert not fence["invalid"].any()
    assert (fence["outcome"] == "released").all()
    assert actions[actions["policy"] == "owner_head_freshness"]["invalid"].all()
    if network == "fixed":
        stall = episodes[episodes["policy"] == "planfence"]["stall_ms_per_action"]
        assert (stall > 20).all(), stall.tolist()
    assert runs.prefixes, "the watch saw none of the run's ledgers"
    assert runs.leftovers() == set(), "a lane left something behind"


@pytest.mark.slow
def test_bad_campaign_file_gives_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\nseed = 1\ntemplates = 1\n[grid]\npolicy = ["planfence"]\n'
                   'network = ["loopback"]\nrho = [3]\n')
    proc = _testbed("run", str(bad), "--out", str(tmp_path / "o"), cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "rho" in lines[0]
    assert "0.25" in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_unknown_preset_lists_presets(tmp_path: Path) -> None:
    proc = _testbed("run", "no-such-preset", cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert "demo" in proc.stderr
    assert "Traceback" not in proc.stderr
