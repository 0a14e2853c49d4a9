"""``testbed reproduce``: a recorded loopback run reruns and its claims reproduce; the same
run recorded with another policy parameter does not; bad inputs are one line each.

The recorded runs are tiny loopback campaigns (3 agents, rho 4, 3 templates, 16 work
units: seconds each) made once per module with ``testbed run``. The "changed" run is
the same campaign recorded with ``metadata_sync/16`` and relabelled
``metadata_sync/2``: its schedules are the same (a schedule never depends on the
policy), its data are another K's, as if the code had changed under the claims. The
claims asserted are the deterministic ones (traffic, counts); loopback stall is CPU time
and moves with the machine's load, so the stall claim's verdict is only required to
be one of the verdicts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from testbed.cli import main
from testbed.report.reproduce import compare_rerun
from testbed.report.reproduce_claims import (
    NOT_REPRODUCED,
    REGIONS,
    REPRODUCED,
    SKIPPED,
    UNRESOLVED,
    needed,
    plain_check,
    region_check,
)
from testbed.report.reproduce_scope import Stat, frame_names
from testbed.run.reproduce import parse_cell_filter, plan, read_reference, select_cells

CAMPAIGN = """name = "tiny"
seed = 11
templates = 3

[options]
episode_timeout_s = 120

[grid]
policy = ["planfence", "{other}"]
network = ["loopback"]
rho = [4]
agents = [3]
keys = [6]
units = [16]
"""

CLAIMS = """
[[claim]]
run = "tiny"
text = "PlanFence's traffic against metadata sync K = 2: [-21.6]%"
expr = "change('planfence', 'metadata_sync/2', metric='kib_per_action')[0]"

[[claim]]
run = "tiny"
text = "metadata sync K = 2 sends [8.8] KiB/action"
expr = "kib(policy='metadata_sync/2')"

[[claim]]
run = "tiny"
text = "PlanFence issues [0] invalid actions of [9]"
expr = "[E(policy='planfence').invalid_n.sum(), E(policy='planfence').scheduled.sum()]"

[[claim]]
run = "tiny"
text = "PlanFence stalls [5.8] ms/action"
expr = "stall(policy='planfence')"

[[claim]]
run = "tiny"
text = "the run took [1] minutes"
expr = "sessions()[0]['minutes']"
"""
DETERMINISTIC = ("traffic", "sends", "invalid")


def _testbed(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=300, check=False)


def _record(folder: Path, other: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "tiny.toml").write_text(CAMPAIGN.format(other=other))
    (folder / "claims.toml").write_text(CLAIMS)
    proc = _testbed("run", "tiny.toml", "--out", "tiny", cwd=folder)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder / "tiny"


def _relabel(run: Path, old: str, new: str) -> None:
    """Make the recorded run say ``new`` where it ran ``old`` (cells, episode keys and
    the manifest's grid)."""
    for name in ("episodes.parquet", "actions.parquet"):
        frame = pd.read_parquet(run / name)
        for column in ("cell", "policy", "episode"):
            frame[column] = frame[column].str.replace(old, new, regex=False).str.replace(
                old.replace("/", "-") + "_", new.replace("/", "-") + "_", regex=False)
        frame.to_parquet(run / name)
    manifest = json.loads((run / "manifest.json").read_text())
    for grid in manifest["config"]["grid"]:
        grid["policy"] = [new if p == old else p for p in grid["policy"]]
    (run / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(tmp_path_factory.mktemp("reproduce") / "runs", "metadata_sync/2")


@pytest.fixture(scope="module")
def changed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = _record(tmp_path_factory.mktemp("reproduce-changed") / "runs", "metadata_sync/16")
    _relabel(run, "metadata_sync/16", "metadata_sync/2")
    return run


def _verdicts(run: Path, out: Path) -> dict[str, str]:
    result = compare_rerun(run, out, claims_file=run.parent / "claims.toml")
    return {r.claim.plain: r.verdict for r in result.claims}


def _pick(verdicts: dict[str, str], word: str) -> str:
    (verdict,) = [v for text, v in verdicts.items() if word in text]
    return verdict


@pytest.mark.slow
def test_a_rerun_of_a_recorded_run_reproduces(recorded: Path, tmp_path: Path) -> None:
    out = tmp_path / "again"
    proc = _testbed("reproduce", str(recorded), "--out", str(out), "--claims",
                    str(recorded.parent / "claims.toml"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reproduced" in proc.stdout
    assert (out / "reproduce.md").is_file()
    assert (out / "reproduce.html").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    source = json.loads((recorded / "manifest.json").read_text())
    reproduces = manifest["reproduces"]
    assert reproduces["run"] == str(recorded)
    assert reproduces["revision"] == source["git"]["revision"]
    assert reproduces["config_digest"].startswith("sha256:")
    assert reproduces["templates"] == source["config"]["templates"]
    assert len(reproduces["cells"]) == reproduces["of_cells"] == 2
    verdicts = _verdicts(recorded, out)
    for word in DETERMINISTIC:
        assert _pick(verdicts, word) == REPRODUCED, verdicts
    assert _pick(verdicts, "stalls") in (REPRODUCED, NOT_REPRODUCED, UNRESOLVED)
    assert _pick(verdicts, "minutes") == SKIPPED  # how the run was made, not a measurement
    report = (out / "reproduce.md").read_text()
    assert "metadata_sync-2_loopback" in report
    assert "byte-identical" in report
    # resuming it at another size is refused before anything runs
    assert main(["reproduce", str(recorded), "--out", str(out), "--resume",
                 "--templates", "2"]) == 2


@pytest.mark.slow
def test_a_run_recorded_with_another_parameter_does_not_reproduce(
        changed: Path, tmp_path: Path) -> None:
    out = tmp_path / "again"
    proc = _testbed("reproduce", str(changed), "--out", str(out), "--templates", "2",
                    "--claims", str(changed.parent / "claims.toml"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "not reproduced" in proc.stdout
    assert len(json.loads((out / "manifest.json").read_text())["reproduces"]["templates"]) == 2
    verdicts = _verdicts(changed, out)
    assert _pick(verdicts, "traffic") == NOT_REPRODUCED, verdicts
    assert _pick(verdicts, "sends") == NOT_REPRODUCED, verdicts
    assert _pick(verdicts, "invalid") == REPRODUCED, verdicts  # PlanFence did not change


def _one_error(capsys: pytest.CaptureFixture[str], argv: list[str], field: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert field in err, err


@pytest.mark.slow
def test_bad_inputs_are_one_line_each(recorded: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    run = str(recorded)
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "manifest.json").write_text("{}")
    cases = [
        (["reproduce", str(tmp_path / "none")], "RUN"),
        (["reproduce", str(tmp_path / "file")], "RUN"),
        (["reproduce", str(tmp_path / "empty")], "manifest.json"),
        (["reproduce", str(tmp_path / "broken")], "manifest.json"),
        (["reproduce", run, "--templates", "0"], "--templates"),
        (["reproduce", run, "--templates", "4"], "--templates"),
        (["reproduce", run, "--cells", "policy=nope"], "--cells"),
        (["reproduce", run, "--cells", "colour=red"], "--cells"),
        (["reproduce", run, "--cells", "policy"], "--cells"),
        (["reproduce", run, "--cells", "policy=planfence;network=att"], "--cells"),
        (["reproduce", run, "--out", str(tmp_path / "busy")], "--out"),
        (["reproduce", run, "--out", run], "--out"),
        (["reproduce", run, "--claims", str(tmp_path / "none.toml")], "--claims"),
    ]
    for argv, field in cases:
        _one_error(capsys, argv, field)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "busy", "empty", "file"]
    manifest = json.loads((recorded.parent / "tiny" / "manifest.json").read_text())
    assert "reproduces" not in manifest  # the recorded run is never written


@pytest.mark.slow
def test_cells_and_templates_cut_the_recorded_campaign(recorded: Path) -> None:
    reference = read_reference(recorded)
    rerun = plan(reference, templates=2, cells="policy=metadata_sync/2; rho=4")
    assert rerun.campaign.templates == reference.campaign.templates[:2]
    assert [c.policy for c in rerun.campaign.cells()] == ["metadata_sync/2"]
    ids = {c.id for c in reference.campaign.cells()}
    assert {c.id for c in rerun.campaign.cells()} <= ids
    assert parse_cell_filter("policy=a,b;network=att", ["policy", "network"]) == {
        "policy": ("a", "b"), "network": ("att",)}
    assert select_cells(reference.campaign, {"rho": ("4.0",)}, "x").cells() == \
        reference.campaign.cells()


def _stat(value: float, low: float, high: float, n: int = 10, kind: str = "change") -> Stat:
    return Stat(kind, "s", value, low, high, n)


def test_the_verdict_rules() -> None:
    committed = _stat(-0.5, -0.7, -0.3)  # lower
    assert region_check(committed, _stat(-0.4, -0.6, -0.2), "lower").verdict == REPRODUCED
    assert region_check(committed, _stat(0.0, -0.05, 0.05), "lower").verdict == NOT_REPRODUCED
    straddling = region_check(committed, _stat(-0.2, -0.4, 0.0), "lower")
    assert straddling.verdict == UNRESOLVED
    # centre -0.2, half-width 0.2, 0.1 from the edge -0.1: four times the templates
    assert straddling.needed == 40 == needed(-0.4, 0.0, 10, REGIONS["lower"])
    at_size = _stat(10.0, 8.0, 12.0, kind="median")
    assert plain_check(at_size, _stat(13.0, 12.0, 14.0, kind="median")).verdict == REPRODUCED
    assert plain_check(at_size, _stat(15.0, 14.0, 16.0, kind="median")).verdict == \
        NOT_REPRODUCED
    assert plain_check(at_size, _stat(10.0, 10.0, 10.0, n=1, kind="median")).verdict == \
        UNRESOLVED
    assert frame_names("(lambda a, b: a + b)(E(), A())") == set()
    assert frame_names("len(a) + sum(x for e in [1] for x in [e])") == {"a"}
