"""``[options] wire_encoding = "json"`` reaches every node: the same schedule costs more
bytes on the action path (JSON head entries) and still completes every action."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

CAMPAIGN = """
name = "enc_{encoding}"
seed = 11
templates = 1

[options]
episode_timeout_s = 120
wire_encoding = "{encoding}"

[grid]
policy = ["batched_all_key", "metadata_sync"]
network = ["loopback"]
rho = [4]
agents = [3]
keys = [6]
connection = ["reuse"]
units = [12]
"""


def _run(tmp_path: Path, encoding: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    campaign = tmp_path / f"{encoding}.toml"
    campaign.write_text(CAMPAIGN.format(encoding=encoding))
    out = tmp_path / encoding
    proc = subprocess.run([sys.executable, "-m", "testbed", "run", str(campaign),
                           "--out", str(out)], cwd=tmp_path, text=True,
                          capture_output=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pd.read_parquet(out / "actions.parquet"), pd.read_parquet(out / "episodes.parquet")


@pytest.mark.slow
def test_json_entries_cost_more_on_the_same_schedule(tmp_path: Path) -> None:
    acts = {e: _run(tmp_path, e) for e in ("msgpack", "json")}
    for actions, episodes in acts.values():
        assert not episodes["aborted"].any()
        assert actions["complete"].all()
    for policy in ("batched_all_key", "metadata_sync"):
        compact, text = (acts[e][1].set_index("policy").loc[policy] for e in ("msgpack", "json"))
        assert text["kib_per_action_payload"] > compact["kib_per_action_payload"], policy
    # batched all-key reads every key's head entry on its action path
    query = {e: acts[e][0].groupby("policy")["query_bytes"].sum()["batched_all_key"]
             for e in acts}
    assert query["json"] > query["msgpack"]
