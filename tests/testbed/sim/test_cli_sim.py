"""``testbed run --backend sim`` end to end: the same campaign twice gives byte-identical
tables, rows say ``backend = "sim"`` with the calibration's id; bad inputs are one line."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from testbed.cli import main
from testbed.sim.calibration import DEFAULT_PATH_ENV, Calibration, save

CAMPAIGN = """
name = "simtest"
seed = 20260101
templates = 1

[grid]
policy = ["planfence"]
network = ["att"]
rho = [4]
keys = [8]
agents = [3]
connection = ["fresh", "reuse"]

[options]
backend = "sim"
"""


@pytest.fixture
def calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Calibration:
    cal = Calibration(exchange_ms=0.3, handshake_ms=1.5, install_ms=0.4, install_normal_ms=0.2,
                      host="test",
                      revision="test", measured_at="2026-12-06T00:00:00Z")
    path = save(cal, tmp_path / "cal.json")
    monkeypatch.setenv(DEFAULT_PATH_ENV, str(path))
    return cal


def test_a_sim_run_is_byte_identical_on_a_second_run(tmp_path: Path,
                                                      calibration: Calibration) -> None:
    campaign = tmp_path / "c.toml"
    campaign.write_text(CAMPAIGN)
    for out in ("one", "two"):
        assert main(["run", str(campaign), "--out", str(tmp_path / out)]) == 0
    for table in ("actions.parquet", "episodes.parquet"):
        assert (tmp_path / "one" / table).read_bytes() == (tmp_path / "two" / table).read_bytes()
    episodes = pq.read_table(tmp_path / "one" / "episodes.parquet").to_pylist()
    assert {e["backend"] for e in episodes} == {"sim"}
    assert {e["sim_calibration"] for e in episodes} == {calibration.id}
    assert all(e["stall_ms_per_action"] > 0 and not e["aborted"] for e in episodes)


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_missing_calibration_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(DEFAULT_PATH_ENV, str(tmp_path / "none.json"))
    campaign = tmp_path / "c.toml"
    campaign.write_text(CAMPAIGN)
    err = _one_line_error(["run", str(campaign), "--out", str(tmp_path / "out")], capsys)
    assert "testbed calibrate sim" in err
    assert not (tmp_path / "out").exists()


def test_what_the_model_does_not_run_is_one_line(tmp_path: Path, calibration: Calibration,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    pie = tmp_path / "pie.toml"
    pie.write_text(CAMPAIGN.replace('network = ["att"]', 'network = ["slow"]')
                   + '\n[networks.slow]\nrate_kbit = 1000\nqueue = { kind = "pie" }\n')
    err = _one_line_error(["run", str(pie), "--out", str(tmp_path / "out")], capsys)
    assert "queue kind pie" in err
    err = _one_line_error(["run", "replanning", "--backend", "sim", "--out",
                           str(tmp_path / "out")], capsys)
    assert "'replanning' is not simulated" in err
    assert not (tmp_path / "out").exists()


PRIMARY = Path(__file__).resolve().parents[3] / "results" / "primary"


@pytest.mark.skipif(not (PRIMARY / "manifest.json").exists(), reason="no results/primary")
def test_sim_check_compares_a_committed_cell(tmp_path: Path, calibration: Calibration,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "check.json"
    assert main(["sim-check", str(PRIMARY), "--policy", "metadata_sync", "--templates", "1",
                 "--json", str(out)]) == 0
    assert "bytes equal 100%" in " ".join(capsys.readouterr().out.split())
    import json

    (cell,) = json.loads(out.read_text())["cells"]
    assert cell["policy"] == "metadata_sync"
    assert cell["actions"] == 11
    assert cell["bytes_equal"] == 1.0
