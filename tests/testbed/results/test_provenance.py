"""A run traces back to its code: code digests, sessions, the main-line rule and
``testbed verify`` (testbed/results/provenance.py, sessions.py, verify.py).

A throw-away git repository with the product folders stands for the checkout; the
campaign loop runs with the FakeRunner twin (its bookkeeping is what is checked here).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from testbed.campaign.parse import parse_campaign
from testbed.cli import main as cli_main
from testbed.errors import UserError
from testbed.results import provenance
from testbed.results.reference import check_reference_run
from testbed.results.verify import relocate, verify_run
from testbed.run.loop import run_campaign
from tests.testbed.run.fake_runner import SMALL, FakeRunner, quiet

pytestmark = pytest.mark.slow

LOOPBACK = {**SMALL, "grid": {**SMALL["grid"], "network": ["loopback", "att"]}}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "repo"
    for folder in provenance.CODE_PATHS:
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text(f"# {folder}\n")
    (root / "testbed" / "core.py").write_text("x = 1\n")
    (root / "README.md").write_text("docs\n")
    (root / provenance.LOCK_NAME).write_text("trio==1\n")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "start")
    monkeypatch.setattr(provenance, "SOURCE_ROOT", root)
    return root


def _commit(repo: Path, name: str, text: str) -> str:
    (repo / name).write_text(text)
    _git(repo, "add", name)
    _git(repo, "commit", "-q", "-m", f"change {name}")
    return _git(repo, "rev-parse", "HEAD")


# --- the code digest ------------------------------------------------------------------------


def test_digest_of_a_clean_tree_is_its_revisions(repo: Path) -> None:
    digest = provenance.code_digest()
    assert digest is not None
    assert digest.startswith("sha256:")
    assert digest == provenance.code_digest_at("HEAD")


def test_digest_follows_product_code_only(repo: Path) -> None:
    clean = provenance.code_digest()
    (repo / "README.md").write_text("other docs\n")  # not product code
    assert provenance.code_digest() == clean
    (repo / "testbed" / "core.py").write_text("x = 2\n")
    changed = provenance.code_digest()
    assert changed != clean
    (repo / "testbed" / "core.py").write_text("x = 1\n")
    (repo / "nodes" / "new.py").write_text("y = 1\n")  # untracked code counts
    assert provenance.code_digest() not in (clean, changed)
    revision = _commit(repo, "nodes/new.py", "y = 1\n")
    assert provenance.code_digest() == provenance.code_digest_at(revision) != clean
    assert provenance.code_digest_at("0" * 40) is None


def test_digest_outside_a_checkout_is_none(tmp_path: Path) -> None:
    assert provenance.code_digest(tmp_path) is None
    assert provenance.is_ancestor("HEAD", repo=tmp_path) is None


# --- reference runs come from the main line ---------------------------------------------------


def test_side_branch_is_refused_for_reference_runs(repo: Path) -> None:
    out = repo / "results" / "new"
    assert check_reference_run(out, allow_dirty=False)["on_main"] is True
    _git(repo, "checkout", "-q", "-b", "side")
    _commit(repo, "testbed/core.py", "x = 5\n")
    with pytest.raises(UserError, match=r"--out: .*HEAD is not on main.*--allow-side-branch"):
        check_reference_run(out, allow_dirty=False)
    record = check_reference_run(out, allow_dirty=False, allow_side_branch=True)
    assert record["allow_side_branch"] is True
    assert record["on_main"] is False
    # outside results/ the branch does not matter
    assert "allow_side_branch" not in check_reference_run(repo / "scratch", allow_dirty=False)


# --- sessions record their code --------------------------------------------------------------


async def _run(out: Path, templates: int, *, extend: bool = False,
               allow_code_change: bool = False) -> None:
    campaign = parse_campaign({**LOOPBACK, "templates": templates})
    await run_campaign(campaign, out, resume=False, extend=extend, runner=FakeRunner(),
                       console=quiet(), allow_code_change=allow_code_change)


async def test_sessions_record_code_lock_and_episodes(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    await _run(out, 2)
    manifest = json.loads((out / "manifest.json").read_text())
    session = manifest["sessions"][0]
    assert session["git"]["code_sha256"] == provenance.code_digest_at("HEAD")
    assert session["git"]["revision"] == _git(repo, "rev-parse", "HEAD")
    assert session["lock_sha256"] == provenance.lock_file()["sha256"]
    assert session["episodes"] == 24
    assert manifest["schema_version"] == 2
    sessions = pq.read_table(out / "episodes.parquet", columns=["session"]).column("session")
    assert sessions.to_pylist() == [1] * 24
    result = verify_run(out)
    assert result.ok, result.problems


async def test_extend_with_other_code_is_refused_unless_allowed(repo: Path,
                                                                tmp_path: Path) -> None:
    out = tmp_path / "run"
    await _run(out, 2)
    first = provenance.code_digest()
    _commit(repo, "testbed/core.py", "x = 7\n")
    with pytest.raises(UserError, match=r"--extend: this checkout's code .* is not the code "
                                        r"of the run's last session.*--allow-code-change"):
        await _run(out, 3, extend=True)
    await _run(out, 3, extend=True, allow_code_change=True)
    manifest = json.loads((out / "manifest.json").read_text())
    first_session, second = manifest["sessions"]
    assert first_session["git"]["code_sha256"] == first
    assert second["git"]["code_sha256"] == provenance.code_digest() != first
    assert second["allow_code_change"] is True
    assert second["episodes"] == 12
    table = pq.read_table(out / "episodes.parquet", columns=["template", "session"])
    by_session = {s: set(table.filter(pc.equal(table["session"], s))["template"].to_pylist())
                  for s in (1, 2)}
    assert len(by_session[1]) == 2
    assert len(by_session[2]) == 1
    result = verify_run(out)
    assert result.ok, result.problems
    assert any("ran different code (allowed" in fact for fact in result.facts)


async def test_resume_with_the_same_code_needs_nothing(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    await _run(out, 2)
    _commit(repo, "README.md", "docs only\n")  # not product code: same digest
    await _run(out, 3, extend=True)
    assert verify_run(out).ok


# --- testbed verify ---------------------------------------------------------------------------


def _edit_manifest(out: Path, change: dict[str, object]) -> None:
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    for dotted, value in change.items():
        target = manifest
        *parents, last = dotted.split(".")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[last] = value
    path.write_text(json.dumps(manifest))


async def test_verify_finds_each_kind_of_problem(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    await _run(out, 2)
    assert verify_run(out).ok
    # a revision that never landed
    _git(repo, "checkout", "-q", "-b", "side")
    side = _commit(repo, "testbed/core.py", "x = 9\n")
    _git(repo, "checkout", "-q", "main")
    _edit_manifest(out, {"sessions.0.git.revision": side,
                         "sessions.0.git.code_sha256": provenance.code_digest_at(side)})
    assert any("not reachable from HEAD" in p for p in verify_run(out).problems)
    _edit_manifest(out, {"sessions.0.git.revision": "f" * 40})
    assert any("is not in this repository" in p for p in verify_run(out).problems)
    # uncommitted code
    head = _git(repo, "rev-parse", "HEAD")
    _edit_manifest(out, {"sessions.0.git.revision": head,
                         "sessions.0.git.code_sha256": "sha256:" + "0" * 64})
    assert any("ran uncommitted code" in p for p in verify_run(out).problems)
    _edit_manifest(out, {"sessions.0.git.code_sha256": provenance.code_digest_at(head)})
    assert verify_run(out).ok
    # a trace that changed since
    manifest = json.loads((out / "manifest.json").read_text())
    recorded = manifest["networks"]["att"]["files"][0]["sha256"]
    manifest["networks"]["att"]["files"][0]["sha256"] = "0" * 64
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert any("networks.att.up_trace" in p and "not the file the run replayed" in p
               for p in verify_run(out).problems)
    manifest["networks"]["att"]["files"][0]["sha256"] = recorded
    (out / "manifest.json").write_text(json.dumps(manifest))
    # a missing episode, and a session count that no longer matches
    table = pq.read_table(out / "episodes.parquet")
    pq.write_table(table.slice(1), out / "episodes.parquet")
    problems = verify_run(out).problems
    assert any(p.startswith("1 of 24 planned episodes missing") for p in problems)
    assert any("session 1: recorded 24 episodes, the tables hold 23" in p for p in problems)
    pq.write_table(table, out / "episodes.parquet")
    # an unfinished run and an unknown schema
    _edit_manifest(out, {"status": "interrupted", "schema_version": 99})
    problems = verify_run(out).problems
    assert any("status 'interrupted'" in p for p in problems)
    assert any("schema_version 99" in p for p in problems)


async def test_verify_command_lines_and_exit_status(repo: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    await _run(out, 2)
    assert cli_main(["verify", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"{out}: verified (")
    _edit_manifest(out, {"sessions.0.git.revision": "f" * 40})
    assert cli_main(["verify", str(out)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    assert "not in this repository" in lines[0]
    assert cli_main(["verify", str(tmp_path / "nothing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli_main(["verify", str(tmp_path / "empty")]) == 2
    assert "has no manifest.json" in capsys.readouterr().err


async def test_anchor_records_a_clean_revisions_digest(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    await _run(out, 2)
    head = _git(repo, "rev-parse", "HEAD")
    # a run made before sessions recorded their code: only the top-level revision
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["sessions"][0]["git"]
    manifest["git"] = {"revision": head, "code_dirty": False, "dirty": False}
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert verify_run(out).ok  # derived from the clean revision
    result = verify_run(out, anchor=True)
    assert result.anchored == [1]
    git = json.loads((out / "manifest.json").read_text())["sessions"][0]["git"]
    assert git["code_sha256"] == provenance.code_digest_at(head)
    assert "testbed verify --anchor" in git["anchored"]
    # a checkout that was not recorded clean cannot be anchored
    manifest["git"]["code_dirty"] = None
    (out / "manifest.json").write_text(json.dumps(manifest))
    result = verify_run(out, anchor=True)
    assert not result.anchored
    assert any("the code it ran is unknown" in p for p in result.problems)


def test_relocate_finds_a_moved_file_by_its_tail(tmp_path: Path) -> None:
    (tmp_path / "results" / "configs").mkdir(parents=True)
    (tmp_path / "results" / "configs" / "rates.toml").write_text("x")
    found = relocate("/elsewhere/checkout/results/configs/rates.toml", tmp_path)
    assert found == tmp_path / "results" / "configs" / "rates.toml"
    assert relocate("/elsewhere/none.toml", tmp_path) is None
    assert relocate("results/configs/rates.toml", tmp_path) == found


def test_a_command_workloads_directory_is_compared_relative_to_its_campaign() -> None:
    """A command campaign run from another checkout records that checkout's directory;
    the campaign is the same wherever it ran, but not if the directory moved within it."""
    from testbed.results.verify import _portable

    def config(cwd: str) -> dict[str, object]:
        return {"name": "x", "command": {"cwd": cwd, "run": []}}

    here = Path("/work/main/docs/examples/redis-store")
    recorded = config("/elsewhere/clone/docs/examples/redis-store")
    relative = Path("docs/examples/redis-store")
    assert _portable(recorded, relative) == _portable(config(str(here)), here)
    assert _portable(config("/elsewhere/clone/docs/examples/redis-store/sub"), relative) \
        != _portable(config(str(here)), here)
    assert _portable({"name": "x"}, here) == {"name": "x"}
