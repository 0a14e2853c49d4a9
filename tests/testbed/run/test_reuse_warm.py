"""``reuse_warm``: every agent's pool is open before the measured window.

A real campaign on loopback (node processes, sockets): with ``reuse`` the first action
that queries a remote owner opens a connection; with ``reuse_warm`` no action opens one,
the first included, and the connections were opened during setup instead.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

CAMPAIGN = """
name = "warm"
seed = 11
templates = 2

[options]
episode_timeout_s = 120

[grid]
policy = ["planfence", "batched_all_key"]
network = ["loopback"]
rho = [4]
agents = [3]
keys = [6]
connection = ["reuse", "reuse_warm"]
units = [12]
"""


@pytest.mark.slow
def test_reuse_warm_opens_every_connection_before_the_first_action(tmp_path: Path) -> None:
    campaign = tmp_path / "warm.toml"
    campaign.write_text(CAMPAIGN)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "testbed", "run", str(campaign),
                           "--out", str(out)], cwd=tmp_path, text=True,
                          capture_output=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    actions = pd.read_parquet(out / "actions.parquet")
    episodes = pd.read_parquet(out / "episodes.parquet")
    assert not episodes["aborted"].any(), episodes["abort_reason"].tolist()
    keys = ["policy", "template"]
    for connection, opens in (("reuse", True), ("reuse_warm", False)):
        mine = actions[actions["connection"] == connection]
        assert len(mine) > 0
        firsts = mine.groupby(keys, sort=True).head(1)
        per_episode = mine.groupby(keys)["connections"].sum()
        if opens:  # the pool fills on the action path (what warming removes)
            assert (per_episode > 0).all(), per_episode.to_dict()
        else:
            assert (firsts["connections"] == 0).all(), firsts.to_dict("records")
            assert (mine["connections"] == 0).all()
            assert (mine["complete"]).all()
    warm = episodes[episodes["connection"] == "reuse_warm"]
    # 3 agents, each to the 2 others: opened at setup and counted in the episode.
    assert (warm["connections"] >= 6).all(), warm["connections"].tolist()
