"""The run directory: atomic shards, typed rows, consolidation (testbed.results)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from testbed.campaign.parse import parse_campaign
from testbed.results.atomic import write_table_atomic
from testbed.results.rundir import RunDir
from testbed.results.schema import ResultRowError
from tests.testbed.run.fake_runner import SMALL, FakeRunner, run_small

# --- shards ----------------------------------------------------------------------------------


def test_atomic_write_cleans_up_after_a_failed_rename(tmp_path: Path) -> None:
    final = tmp_path / "x.parquet"
    write_table_atomic(pa.table({"a": [1, 2]}), final)
    blocked = tmp_path / "y.parquet"
    blocked.mkdir()
    (blocked / "keep").write_text("k")
    with pytest.raises(IsADirectoryError):
        write_table_atomic(pa.table({"a": [3]}), blocked)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.parquet", "y.parquet"]
    assert (blocked / "keep").read_text() == "k"
    write_table_atomic(pa.table({"a": [3]}), final)
    assert pd.read_parquet(final)["a"].tolist() == [3]


def test_rows_of_the_wrong_type_commit_nothing(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    run_dir.open()
    run_dir.mark_started("c/reservation-01")
    row = {"campaign": "t", "episode": "c/reservation-01", "aborted": "maybe"}
    with pytest.raises(ResultRowError, match="episode row: a value does not fit"):
        run_dir.record_episode("c/reservation-01", [], row)
    assert run_dir.completed() == set()
    assert run_dir.ledger()["c/reservation-01"] == ("started", 1)
    assert not list(tmp_path.rglob(".*.tmp-*"))
    run_dir.close()


async def test_consolidate_is_idempotent_and_deduplicated(tmp_path: Path) -> None:
    campaign = parse_campaign(SMALL)
    await run_small(campaign, tmp_path, FakeRunner())
    run_dir = RunDir(tmp_path)
    run_dir.open()
    before = pd.read_parquet(tmp_path / "actions.parquet")
    assert run_dir.consolidate() == (len(before), 24)
    after = pd.read_parquet(tmp_path / "actions.parquet")
    run_dir.close()
    pd.testing.assert_frame_equal(before, after)
