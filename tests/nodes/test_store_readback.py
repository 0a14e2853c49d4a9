"""A node reads its store back from disk: files overwritten under it end the node with the
reason (it never goes on serving from memory); and where a store lives."""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from nodes.store import SqliteStore
from nodes.store_check import describe_location, read_back
from protocols.identity import CENTRAL_ID, Identity, Member, Roster
from protocols.records import make_record
from testbed.campaign.parse import parse_campaign
from testbed.run.engines import LocalEngine
from testbed.run.episode import EpisodeRunner
from testbed.run.team import Team, key_owners, open_team

AGENTS = ["a0", "a1"]
OWNERS = key_owners(AGENTS, 2)
TARGET = "a0"


def _store(tmp_path: Path) -> SqliteStore:
    who = Identity.derive("a", 7)
    roster = Roster.build([Member("a", who.public_key, "127.0.0.1", 1)], {"k0": "a"}, ["a"])
    store = SqliteStore(tmp_path / "a.sqlite", agent_id="a", roster=roster,
                        durability="normal")
    store.install(make_record(who, key="k0", owner="a", seq=1, parents=[],
                              rtype="requirement", content=b"v1"))
    return store


def _scribble(path: Path, size: int | None, seed: int) -> None:
    """Overwrite ``path`` in place with random bytes (all of it: ``size`` None)."""
    data = random.Random(seed).randbytes(path.stat().st_size if size is None else size)
    with open(path, "r+b") as f:
        f.write(data)


def test_read_back_passes_for_the_files_written_and_names_an_overwritten_one(
        tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert store.read_back() is None
    assert Path(f"{store.path}-wal").stat().st_size > 0  # the record went to the WAL
    _scribble(Path(f"{store.path}-wal"), 64, 1)
    assert "WAL file" in (store.read_back() or "")
    store.close()


def test_an_overwritten_database_file_is_named(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _scribble(store.path, 4096, 2)
    assert "no longer starts with the SQLite header" in (store.read_back() or "")
    os.unlink(store.path)
    assert read_back(store.path, expected_page_size=store.page_size) \
        == f"database file {store.path} is gone"
    store.close()


def test_the_file_system_of_a_store_directory_is_the_longest_mount_containing_it() -> None:
    mounts = ("overlay / overlay rw 0 0\n"
              "tmpfs /tmp tmpfs rw 0 0\n"
              "/dev/sda1 /tmp/disk\\040a ext4 rw 0 0\n")
    assert describe_location(Path("/tmp/x/stores"), mounts) == {
        "dir": "/tmp/x/stores", "fs_type": "tmpfs", "mount": "/tmp"}
    assert describe_location(Path("/tmp/disk a/s"), mounts)["fs_type"] == "ext4"
    assert describe_location(Path("/srv"), mounts)["fs_type"] == "overlay"
    here = describe_location(Path.cwd())
    assert here["fs_type"] != "unknown"


@pytest.fixture
async def team(tmp_path: Path) -> AsyncIterator[Team]:
    hosts = {a: (None, "127.0.0.1") for a in [*AGENTS, CENTRAL_ID]}
    async with open_team(agents=AGENTS, central=True, hosts=hosts, workdir=tmp_path,
                         campaign_seed=5, connection="reuse", policy="test_probe",
                         owners=OWNERS, probes=["probe"],
                         plugins=["tests.nodes.probe_policy"]) as t:
        await t.call(TARGET, "seed", key="k000", content=b"v1", rtype="requirement")
        yield t


@pytest.mark.parametrize("which", ["", "-wal"])
async def test_a_store_overwritten_under_a_running_node_ends_it_with_the_reason(
        team: Team, which: str) -> None:
    node = team._nodes[TARGET]
    process = node.process
    assert process is not None
    await trio.sleep(1.0)  # a few read-backs pass on the files the node wrote
    assert process.returncode is None
    _scribble(Path(f"{node.store_path}{which}"), None, 3)
    with trio.fail_after(10):
        while process.returncode is None:
            await trio.sleep(0.05)
    assert process.returncode == 3
    log = team.log_tail(TARGET, 50)
    assert "store read back failed" in log
    assert ("WAL file" if which else "database file") in log


def test_the_manifest_says_where_stores_live_and_their_durability(tmp_path: Path) -> None:
    campaign = parse_campaign(
        {"name": "stores", "seed": 1, "templates": 1,
         "options": {"durability": "normal"},
         "grid": {"policy": ["planfence"], "network": ["loopback"], "rho": [4],
                  "keys": [4], "agents": [2], "connection": ["reuse"], "units": [4]}},
        source="test")
    described = LocalEngine(EpisodeRunner(campaign, workdir_root=tmp_path)).describe()
    stores = described["stores"]
    assert stores["dir"] == str(tmp_path.resolve())
    assert stores["durability"] == "normal"
    assert stores["fs_type"] == describe_location(tmp_path)["fs_type"] != "unknown"
