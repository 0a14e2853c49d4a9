"""Reference runs come from a committed revision (testbed/results/reference.py).

A throw-away git repository stands for the checkout: a run into its results/ is refused
while a tracked file outside results/ has uncommitted changes, allowed with
``allow_dirty`` (and the manifest says so), and a run's own outputs under results/ do not
make the tree dirty for the next campaign.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from testbed.campaign.parse import parse_campaign
from testbed.errors import UserError
from testbed.results import provenance
from testbed.results.reference import check_reference_run
from tests.testbed.run.fake_runner import SMALL, FakeRunner, run_small


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                   check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "results" / "old").mkdir(parents=True)
    (root / "code.py").write_text("x = 1\n")
    (root / "results" / "old" / "manifest.json").write_text("{}\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "start")
    return root


def test_clean_checkout_and_own_outputs_pass(repo: Path) -> None:
    assert check_reference_run(repo / "results" / "new", allow_dirty=False,
                               repo=repo)["code_dirty"] is False
    (repo / "results" / "old" / "manifest.json").write_text('{"changed": 1}\n')
    record = check_reference_run(repo / "results" / "new", allow_dirty=False, repo=repo)
    assert record == {"code_dirty": False, "reference_output": True, "on_main": True}


def test_dirty_checkout_is_refused_unless_forced(repo: Path, tmp_path: Path) -> None:
    (repo / "code.py").write_text("x = 2\n")
    with pytest.raises(UserError, match=r"--out: .* uncommitted changes \(code.py\); "
                                        r".*--allow-dirty"):
        check_reference_run(repo / "results" / "new", allow_dirty=False, repo=repo)
    record = check_reference_run(repo / "results" / "new", allow_dirty=True, repo=repo)
    assert record["allow_dirty"] is True
    assert record["changed"] == ["code.py"]
    # elsewhere than results/ a dirty checkout is recorded, not refused
    assert check_reference_run(tmp_path / "scratch", allow_dirty=False,
                               repo=repo)["code_dirty"] is True


async def test_run_campaign_refuses_and_records(repo: Path, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    monkeypatch.setattr(provenance, "SOURCE_ROOT", repo)
    (repo / "code.py").write_text("x = 3\n")
    campaign = parse_campaign(SMALL)
    out = repo / "results" / "small"
    with pytest.raises(UserError, match="uncommitted changes"):
        await run_small(campaign, out, FakeRunner())
    assert not out.exists()  # refused before anything was written
    from testbed.run.loop import run_campaign
    from tests.testbed.run.fake_runner import quiet

    await run_campaign(campaign, out, resume=False, runner=FakeRunner(), console=quiet(),
                       allow_dirty=True)
    git = json.loads((out / "manifest.json").read_text())["git"]
    assert git["allow_dirty"] is True
    assert git["code_dirty"] is True
