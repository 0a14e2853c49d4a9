"""The dask engine on a real LocalCluster (worker processes): same results as a local
run, a killed worker loses and duplicates nothing, a cancel leaves nothing behind, and
the CLI against a scheduler and a `testbed worker` started by hand."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import pytest
import trio
from rich.console import Console

from testbed.campaign.model import episode_key
from testbed.campaign.parse import parse_campaign
from testbed.errors import UserError
from testbed.host import kernel
from testbed.run.dask_engine import CANCEL_WAIT_S, open_dask_engine, parse_cluster
from testbed.run.episode import EpisodeRunner
from testbed.run.loop import run_campaign
from tests.leftovers import watch_runs

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent

SMALL: dict[str, Any] = {
    "name": "small", "seed": 3, "templates": 2,
    "options": {"episode_timeout_s": 120},
    "grid": {"policy": ["planfence", "owner_head_freshness"],
             "network": ["loopback", "fixed"], "agents": [2], "keys": [2], "units": [8],
             "connection": ["reuse"]},
}
SLOW: dict[str, Any] = {
    "name": "slow", "seed": 4, "templates": 3,
    "options": {"episode_timeout_s": 120},
    "grid": {"policy": ["planfence", "batched_all_key"], "network": ["fixed"],
             "agents": [2], "keys": [2], "units": [24], "connection": ["fresh"]},
}


def _quiet() -> Console:
    return Console(file=io.StringIO(), width=160)


def _needs_root() -> None:
    if os.geteuid() != 0 or not os.path.exists(kernel.TUN_PATH):
        pytest.skip("a fixed link needs root and /dev/net/tun")


def _traffic(out: Path) -> pd.DataFrame:
    episodes = pd.read_parquet(out / "episodes.parquet").set_index("episode").sort_index()
    return episodes[["schedule_digest", "kib_per_action", "connections", "aborted"]]


def test_cluster_specs_are_checked() -> None:
    assert parse_cluster("local:3") == ("local", 3)
    assert parse_cluster("tcp://10.0.0.1:8786") == ("scheduler", "tcp://10.0.0.1:8786")
    for bad in ("local:0", "local:x", "10.0.0.1:8786", "tcp://host", ""):
        with pytest.raises(UserError, match=r"^cluster: .* is not allowed"):
            parse_cluster(bad)


@pytest.mark.slow
@pytest.mark.privileged
async def test_a_local_cluster_gives_the_results_of_a_local_run(tmp_path: Path) -> None:
    _needs_root()
    campaign = parse_campaign(SMALL)
    with watch_runs() as runs:
        await run_campaign(campaign, tmp_path / "local", resume=False, console=_quiet(),
                           runner=EpisodeRunner(campaign))
        async with open_dask_engine("local:2") as engine:
            await engine.survey(campaign)
            assert len(engine.workers) == 2
            await run_campaign(campaign, tmp_path / "dask", resume=False, console=_quiet(),
                               engine=engine)
    local, dask = _traffic(tmp_path / "local"), _traffic(tmp_path / "dask")
    assert list(local.index) == list(dask.index)  # the same episode keys
    pd.testing.assert_frame_equal(local, dask)  # same schedules, byte-identical traffic
    actions = [pd.read_parquet(tmp_path / d / "actions.parquet")
               .set_index(["episode", "action"]).sort_index()[["bytes", "outcome", "invalid"]]
               for d in ("local", "dask")]
    pd.testing.assert_frame_equal(actions[0], actions[1])
    episodes = pd.read_parquet(tmp_path / "dask" / "episodes.parquet")
    assert (episodes["worker"] == socket.gethostname()).all()
    manifest = (tmp_path / "dask" / "manifest.json").read_text()
    assert '"engine": "dask"' in manifest
    assert '"backend_auto"' in manifest
    # each worker's host speed is recorded where its nodes ran (cpu_speed.py)
    workers = json.loads(manifest)["execution"]["workers"]
    assert len(workers) == 2
    for summary in workers.values():
        assert summary["cpu_model"]
        assert summary["python_probe_ms"] > 0
    assert runs.prefixes, "the watch saw none of the runs' ledgers"
    assert runs.leftovers() == set()


async def _wait_for_processing(client: Any) -> str:
    """The address of a worker that is running a unit."""
    while True:
        busy = await trio.to_thread.run_sync(client.processing)
        for address, keys in busy.items():
            if any("testbed-unit" in str(k) for k in keys):
                return str(address)
        await trio.sleep(0.2)


@pytest.mark.slow
@pytest.mark.privileged
async def test_a_killed_worker_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    _needs_root()
    campaign = parse_campaign(SLOW)
    out = tmp_path / "out"
    lines: list[str] = []
    killed: list[str] = []
    with watch_runs() as runs:
        async with open_dask_engine("local:2", say=lines.append) as engine:
            await engine.survey(campaign)
            client = engine.client
            async with trio.open_nursery() as nursery:
                async def kill_one() -> None:
                    address = await _wait_for_processing(client)
                    await trio.sleep(1.0)  # mid-unit: its topology is up, episodes running
                    pids = await trio.to_thread.run_sync(
                        lambda: client.run(os.getpid, workers=[address]))
                    killed.append(address)
                    os.kill(int(pids[address]), signal.SIGKILL)

                nursery.start_soon(kill_one)
                await run_campaign(campaign, out, resume=False, console=_quiet(),
                                   engine=engine)
    # the loss is said in one line and recorded in the manifest (attempt, worker, reason)
    [address] = killed
    lost = [line for line in lines if f"lost with worker {address}" in line]
    assert len(lost) == 1, lines
    assert "attempt 1: the worker died or its connection broke; it runs again (attempt 2 of 2)" \
        in lost[0]
    assert any(line.startswith("cluster: 1 unit attempt(s) lost with their workers: "
                               "1 resubmitted, 0 given up") for line in lines), lines
    execution = json.loads((out / "manifest.json").read_text())["sessions"][-1]["execution"]
    assert execution["recovery"] == {"lost": 1, "resubmitted": 1, "given_up": 0}
    [record] = execution["recoveries"]
    assert record["worker"] == address
    assert record["attempt"] == 1
    assert record["then"] == "resubmitted"
    assert record["reason"] == "the worker died or its connection broke"
    assert record["episodes"]
    assert set(record["episodes"]) <= {episode_key(c, t) for c, t in campaign.episodes()}
    episodes = pd.read_parquet(out / "episodes.parquet")
    keys = sorted(episode_key(c, t) for c, t in campaign.episodes())
    assert sorted(episodes["episode"]) == keys  # none lost, none duplicated
    assert not episodes["aborted"].any(), episodes["abort_reason"].tolist()
    actions = pd.read_parquet(out / "actions.parquet")
    assert not actions.duplicated(["episode", "action"]).any()
    # the restarted worker cleans what the dead one left
    assert runs.prefixes, "the watch saw none of the runs' ledgers"
    assert await trio.to_thread.run_sync(runs.wait_clean) == set()


@pytest.mark.slow
@pytest.mark.privileged
async def test_cancelling_leaves_nothing_on_the_workers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs_root()
    campaign = parse_campaign(SLOW)
    private_tmp = tmp_path / "worker-tmp"  # the workers' TMPDIR: only their files land here
    private_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(private_tmp))
    seen: list[str] = []
    with watch_runs() as runs:
        await _cancel_mid_run(campaign, tmp_path, private_tmp, seen)
    assert runs.prefixes, "the watch saw none of the runs' ledgers"
    assert runs.leftovers() == set()
    assert seen, "the workers' temporary directories were not where the test looks"
    assert list(private_tmp.iterdir()) == []


async def _cancel_mid_run(campaign: Any, tmp_path: Path, private_tmp: Path,
                          seen: list[str]) -> None:
    async with open_dask_engine("local:2") as engine:
        client = engine.client
        worker_pids = list((await trio.to_thread.run_sync(client.run, os.getpid)).values())
        cancelled_at: list[float] = []
        async with trio.open_nursery() as nursery:
            async def cancel_soon() -> None:
                await _wait_for_processing(client)
                await trio.sleep(1.5)
                seen.extend(os.listdir(private_tmp))
                cancelled_at.append(trio.current_time())
                nursery.cancel_scope.cancel()  # what Ctrl-C does to the run

            nursery.start_soon(cancel_soon)
            await run_campaign(campaign, tmp_path / "out", resume=False,
                               console=_quiet(), engine=engine)
        assert cancelled_at, "the run ended before it was cancelled"
        # the engine waits up to CANCEL_WAIT_S for the workers' units to tear down
        stopped_s = trio.current_time() - cancelled_at[0]
        assert stopped_s < CANCEL_WAIT_S + 30, f"the cancel took {stopped_s:.0f} s"
        children = [c for pid in worker_pids
                    for c in psutil.Process(int(pid)).children(recursive=True)]
        assert children == [], [c.cmdline() for c in children]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def scheduler_and_worker(tmp_path: Path) -> Iterator[str]:
    """`dask scheduler` and `testbed worker --lanes 2`, as a user starts them by hand."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    commands = [[str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                 "--no-dashboard"],
                [str(BIN / "testbed"), "worker", address, "--lanes", "2"]]
    procs: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as stack:
        try:
            for name, command in zip(("scheduler", "worker"), commands, strict=True):
                log = stack.enter_context(open(tmp_path / f"{name}.log", "wb"))
                procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                              cwd=tmp_path))
            yield address
        finally:
            for proc in reversed(procs):
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.mark.slow
@pytest.mark.privileged
def test_the_cli_against_a_scheduler_started_by_hand(tmp_path: Path,
                                                     scheduler_and_worker: str) -> None:
    _needs_root()
    campaign = tmp_path / "small.toml"
    campaign.write_text(
        'name = "small"\nseed = 3\ntemplates = 2\n[options]\nepisode_timeout_s = 120\n'
        '[grid]\npolicy = ["planfence", "owner_head_freshness"]\n'
        'network = ["loopback", "fixed"]\nagents = [2]\nkeys = [2]\nunits = [8]\n'
        'connection = ["reuse"]\n')
    proc = subprocess.run([str(BIN / "testbed"), "run", str(campaign), "--out", "out",
                           "--cluster", scheduler_and_worker], cwd=tmp_path, text=True,
                          capture_output=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    episodes = pd.read_parquet(tmp_path / "out" / "episodes.parquet")
    assert len(episodes) == 8
    assert not episodes["aborted"].any()


def test_a_unit_only_queued_on_a_lost_worker_is_not_a_lost_attempt() -> None:
    from testbed.run.recovery import RecoveryLog

    lines: list[str] = []
    log = RecoveryLog("abcd", lines.append)
    log.on_started((0.0, {"key": "testbed-unit-abcd-0", "attempt": 1, "worker": "tcp://w1"}))
    log.on_started((0.0, {"key": "testbed-unit-abcd-1", "attempt": 1, "worker": "tcp://w2"}))
    removed = {"action": "remove-worker", "worker": "tcp://w1", "expected": False,
               "processing-tasks": ["testbed-unit-abcd-0", "testbed-unit-abcd-2",
                                    "testbed-unit-other-0"]}
    log.on_event((1.0, removed))
    log.catch_up([], [(1.0, removed)])  # the same event again: recorded once
    assert [(r["unit"], r["attempt"], r["then"]) for r in log.records] == [(0, 1, "resubmitted")]
    assert len(lines) == 1
    log.on_started((2.0, {"key": "testbed-unit-abcd-0", "attempt": 2, "worker": "tcp://w2"}))
    log.on_event((3.0, {**removed, "worker": "tcp://w2", "expected": True,
                        "processing-tasks": ["testbed-unit-abcd-0", "testbed-unit-abcd-1"]}))
    assert [(r["unit"], r["attempt"], r["then"]) for r in log.records] == [
        (0, 1, "resubmitted"), (0, 2, "given up"), (1, 1, "resubmitted")]
    assert log.summary() == {"lost": 3, "resubmitted": 2, "given_up": 1}
    assert "given up after 2 attempts" in lines[1]
