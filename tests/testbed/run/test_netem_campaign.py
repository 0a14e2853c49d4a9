"""A campaign over the kernel netem backend, as a user runs it (the VM lane runs it).

One AT&T episode and one loopback episode in one campaign with ``--backend netem``: the
shaped network runs on netem, the unshaped one on no backend, and the AT&T episode
completes (real node processes, real sockets, the trace replayed by tbf).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.leftovers import watch_runs
from tests.privileges import require_netem

pytestmark = [pytest.mark.privileged, pytest.mark.netem, pytest.mark.slow,
              pytest.mark.timeout(900)]


@pytest.fixture
def netem_ready() -> None:
    require_netem()


CAMPAIGN = """
name = "netem-mixed"
seed = 7
templates = 1

[options]
rpc_timeout_s = 10
episode_timeout_s = 300

[grid]
policy = ["planfence"]
network = ["loopback", "att"]
rho = [4]
agents = [2]
keys = [8]
connection = ["reuse"]
units = [8]
"""


def test_mixed_campaign_runs_att_on_netem_and_loopback_on_none(tmp_path: Path,
                                                                netem_ready: None) -> None:
    campaign = tmp_path / "mixed.toml"
    campaign.write_text(CAMPAIGN)
    out = tmp_path / "out"
    with watch_runs() as runs:
        proc = subprocess.run([sys.executable, "-m", "testbed", "run", str(campaign),
                               "--out", str(out), "--backend", "netem"], cwd=tmp_path,
                              text=True, capture_output=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    episodes = pd.read_parquet(out / "episodes.parquet").set_index("network")
    assert sorted(episodes.index) == ["att", "loopback"]
    assert not episodes["aborted"].any(), episodes["abort_reason"].tolist()
    assert episodes.loc["loopback", "backend"] == "none"
    assert episodes.loc["att", "backend"] == "netem"
    assert episodes.loc["loopback", "link_bytes"] == 0
    assert episodes.loc["att", "link_bytes"] > 0
    # physics: a remote owner query crosses four 20 ms access links (80 ms round trip);
    # with two agents about half the declared keys are remote. (No comparison with the
    # loopback episode: its stall is CPU time, 2.1 s per action in a starved guest.)
    assert episodes.loc["att", "stall_ms_per_action"] > 20
    actions = pd.read_parquet(out / "actions.parquet")
    assert (actions["outcome"] == "released").all(), actions["block_reason"].tolist()
    assert not actions["invalid"].any()
    assert runs.prefixes, "the watch saw none of the campaign's ledgers"
    assert runs.leftovers() == set(), "the campaign left something behind"
