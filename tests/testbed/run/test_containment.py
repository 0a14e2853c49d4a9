"""Failures contained to their unit (testbed.run.failures) and a node startup limit
measured on the host (testbed.run.startup), with real processes: the faults are real
misbehaviour of the testbed's own children (tests/hooks/sitecustomize.py): a node
that never opens its control socket, an emulator that dies, a directory that cannot be
removed because something is mounted in it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import trio

from protocols.policies.planfence import PlanFence
from protocols.policies.registry import register, unregister
from testbed.campaign.parse import parse_campaign
from testbed.host import kernel
from testbed.host.processes import is_running
from testbed.run import startup
from testbed.run.attempts import AttemptPolicy
from testbed.run.episode import EpisodeRunner
from testbed.run.failures import START_ATTEMPTS, failure_reason, leaves, summary_line
from testbed.run.loop import run_campaign
from testbed.run.startup import STARTUP_CAP_S, STARTUP_FACTOR, STARTUP_FLOOR_S
from testbed.run.startup import startup_timeout_s as startup_timeout
from tests.testbed.run.fake_runner import quiet

REPO = Path(__file__).resolve().parents[3]
HOOKS = REPO / "tests" / "hooks"

#: Two groups on loopback (2 and 3 agents): a failure of the first must not stop the second.
TWO_GROUPS: dict[str, Any] = {
    "name": "contained", "seed": 5, "templates": 2,
    "options": {"rpc_timeout_s": 2, "episode_timeout_s": 60, "durability": "normal"},
    "grid": {"policy": ["planfence"], "network": ["loopback"], "agents": [2, 3],
             "keys": [4], "units": [8], "connection": ["reuse"]},
}


def _root(tun: bool = False) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (node processes mount a tmpfs, namespaces)")
    if tun and not os.path.exists(kernel.TUN_PATH):
        pytest.skip("the userspace backend needs /dev/net/tun")


@pytest.fixture
def hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``hooks(**faults)``: the testbed's child processes misbehave as told; returns the
    hooks' state directory (each fault's log of firings)."""
    state = tmp_path / "hooks"
    state.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(HOOKS), os.environ.get("PYTHONPATH")])))

    def arm(**faults: Any) -> Path:
        monkeypatch.setenv("PF_TEST_HOOKS", json.dumps({"dir": str(state), **faults}))
        return state

    yield arm
    for point in _fired(state, "pin_control_dir"):  # never leave a mount behind
        subprocess.run(["umount", point], check=False, capture_output=True)


def _fired(state: Path, fault: str) -> list[str]:
    log = state / f"{fault}.log"
    return log.read_text().splitlines() if log.exists() else []


def _episodes(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "episodes.parquet").set_index("episode").sort_index()


def _session_failures(out: Path) -> list[dict[str, Any]]:
    manifest = json.loads((out / "manifest.json").read_text())
    failures: list[dict[str, Any]] = manifest["sessions"][-1].get("failures", [])
    return failures


# ------------------------------------------------------------- the startup limit (pure)


def test_the_startup_limit_scales_with_the_measured_start_and_the_team() -> None:
    # a quiet host: 0.4 s per start, 3 members on 2 CPUs -> the floor
    assert startup_timeout(0.4, 3, 2) == STARTUP_FLOOR_S
    # the TCG guest: 8 s per start, 2 members on 2 CPUs -> 5 x 8 s
    assert startup_timeout(8.0, 2, 2) == pytest.approx(STARTUP_FACTOR * 8.0)
    # members share the CPUs: 6 members on 2 CPUs wait three times as long as 2 do
    assert startup_timeout(8.0, 6, 2) == pytest.approx(3 * startup_timeout(8.0, 2, 2))
    # more CPUs than members never shortens it below one start per member
    assert startup_timeout(8.0, 2, 16) == startup_timeout(8.0, 2, 2)
    assert startup_timeout(1000.0, 2, 2) == STARTUP_CAP_S
    for bad in ((-1.0, 2, 2), (float("nan"), 2, 2), (1.0, 0, 2), (1.0, 2, 0)):
        with pytest.raises(ValueError, match=r"probe_s|members"):
            startup_timeout(*bad)


def test_failure_reasons_unwrap_exception_groups() -> None:
    group = ExceptionGroup("outer", [ExceptionGroup("inner", [OSError(16, "busy")]),
                                     RuntimeError("second")])
    assert [type(e) for e in leaves(group)] == [OSError, RuntimeError]
    assert failure_reason(group) == "OSError: [Errno 16] busy (and 1 more)"


async def test_a_team_without_a_given_limit_uses_the_one_measured_here(tmp_path: Path) -> None:
    from testbed.run.team import open_team

    startup.forget_measurement()
    async with open_team(agents=["a0", "a1"], central=False,
                         hosts={"a0": (None, "127.0.0.1"), "a1": (None, "127.0.0.1")},
                         workdir=tmp_path, campaign_seed=1, connection="reuse",
                         policy="planfence") as team:
        probe_s = startup.last_measurement_s()
        assert probe_s is not None
        assert 0.0 < probe_s < startup.PROBE_LIMIT_S
        assert team.startup_timeout_s == startup_timeout(probe_s, 2, startup.usable_cpus())


# ------------------------------------------------------------------ a team that never starts


@pytest.mark.slow
async def test_a_node_that_never_opens_its_control_socket_aborts_its_unit_not_the_campaign(
        tmp_path: Path, hooks: Any) -> None:
    """Node a0 hangs at its first four starts: the first group gives up after its
    attempts, the second starts at its second attempt (the limit measured here)."""
    state = hooks(node_hang={"agent": "a0", "times": START_ATTEMPTS + 1})
    campaign = parse_campaign(TWO_GROUPS)
    out = tmp_path / "out"
    summary = await run_campaign(campaign, out, resume=False, console=quiet(),
                                 runner=EpisodeRunner(campaign))
    episodes = _episodes(out)
    assert len(episodes) == 4, episodes  # every episode recorded, none lost
    two, three = episodes[episodes["agents"] == 2], episodes[episodes["agents"] == 3]
    assert two["aborted"].all(), two["abort_reason"]
    assert not three["aborted"].any(), three["abort_reason"]
    for reason in two["abort_reason"]:
        assert reason.startswith("unit_failed: start: NodeDied: node a0 failed"), reason
        assert "no control socket within the startup limit of" in reason
        assert f"(attempt {START_ATTEMPTS} of {START_ATTEMPTS})" in reason
    assert len(_fired(state, "node_hang")) == START_ATTEMPTS + 1
    assert summary.aborted == 2
    assert [(f.stage, sorted(f.aborted)) for f in summary.failures] == [
        ("start", sorted(two.index))]  # the start the retry overcame is no failure
    recorded = _session_failures(out)  # the manifest has the retries too
    assert [(f["group"], f["stage"], f["attempt"], len(f["aborted"])) for f in recorded] == [
        ("loopback_o0_n2", "start", 1, 0), ("loopback_o0_n2", "start", 2, 0),
        ("loopback_o0_n2", "start", 3, 2), ("loopback_o0_n3", "start", 1, 0)]
    assert "1 unit failure(s) (1 start), 2 episode(s) aborted" in summary_line(
        summary.failures)
    hung = [int(p) for p in (state / "node_hang.count").read_text().split()]
    assert not any(is_running(pid, None) for pid in hung), "a hung node was left running"


@pytest.mark.slow
async def test_a_unit_that_never_starts_records_every_attempt_it_owed_as_aborted(
        tmp_path: Path, hooks: Any) -> None:
    """With --repeats 2 a unit that cannot start aborts each repeat of each episode under
    its own attempt number (none overwrites another); the other group runs both."""
    hooks(node_hang={"agent": "a0", "times": START_ATTEMPTS})
    campaign = parse_campaign(TWO_GROUPS)
    out = tmp_path / "out"
    summary = await run_campaign(campaign, out, resume=False, console=quiet(),
                                 runner=EpisodeRunner(campaign),
                                 attempts=AttemptPolicy(repeats=2))
    rows = pd.read_parquet(out / "episodes.parquet")
    assert len(rows) == 8, rows[["episode", "attempt", "repeat", "aborted"]]
    assert not rows.duplicated(["episode", "attempt"]).any()
    two, three = rows[rows["agents"] == 2], rows[rows["agents"] == 3]
    assert two["aborted"].all(), two["abort_reason"]
    assert not three["aborted"].any(), three["abort_reason"]
    for frame in (two, three):
        numbers = {key: (sorted(g["attempt"]), sorted(g["repeat"]))
                   for key, g in frame.groupby("episode")}
        assert list(numbers.values()) == [([1, 2], [1, 2])] * 2, numbers
    assert summary.aborted == 4
    assert [(f.stage, len(f.aborted)) for f in summary.failures] == [("start", 2)]


# ------------------------------------------------------------- an emulator that dies


class _MarksEpisodes(EpisodeRunner):
    """The real runner; its groups write MARK when an episode starts."""

    def __init__(self, campaign: Any, mark: Path, **options: Any) -> None:
        super().__init__(campaign, **options)
        self.mark = mark

    @asynccontextmanager
    async def open_group(self, key: Any, cells: Any) -> AsyncIterator[Any]:
        async with super().open_group(key, cells) as group:
            run = group.run_episode

            async def run_episode(cell: Any, schedule: Any) -> Any:
                self.mark.touch()
                return await run(cell, schedule)

            group.run_episode = run_episode  # type: ignore[method-assign]
            yield group


@pytest.mark.privileged
async def test_an_emulator_that_dies_aborts_the_episode_under_it_and_the_unit_goes_on(
        tmp_path: Path, hooks: Any) -> None:
    _root(tun=True)
    # The emulator dies once the first episode is under way. A fixed 2 s after the
    # emulator's start was not enough on a busy host: in CI 44 the team took longer to
    # start, the emulator died before any episode, and the retried start ran them all.
    state = hooks(emulator_exit={"after_file": "episode-started", "after_s": 0.05,
                                 "times": 1})
    raw = {**TWO_GROUPS, "templates": 3,
           "options": {**TWO_GROUPS["options"], "rpc_timeout_s": 1},
           "grid": {**TWO_GROUPS["grid"], "network": ["fixed"], "agents": [2]}}
    campaign = parse_campaign(raw)
    out = tmp_path / "out"
    summary = await run_campaign(campaign, out, resume=False, console=quiet(),
                                 runner=_MarksEpisodes(campaign, state / "episode-started",
                                                       backend="userspace"))
    episodes = _episodes(out)
    assert len(_fired(state, "emulator_exit")) == 1
    aborted = episodes[episodes["aborted"]]
    assert len(aborted) == 1, episodes["abort_reason"]  # the one it died under
    reason = aborted["abort_reason"].iloc[0]
    assert reason.startswith("unit_failed: run: EmulatorError: emulator process"), reason
    assert (~episodes["aborted"]).sum() == 2  # the rest ran on a fresh topology
    assert [(f.stage, f.aborted) for f in summary.failures] == [
        ("run", tuple(aborted.index))]


# ------------------------------------------------- a teardown error, through the command


@pytest.mark.slow
def test_a_teardown_error_ends_the_run_with_status_4_and_leaves_its_leftovers_to_clean(
        tmp_path: Path, hooks: Any) -> None:
    _root()
    state = hooks(pin_control_dir={"agent": "a0", "times": 1})
    toml = tmp_path / "c.toml"
    toml.write_text(_toml(TWO_GROUPS))
    out = tmp_path / "out"
    try:
        proc = subprocess.run([sys.executable, "-m", "testbed", "run", str(toml), "--out",
                               str(out)], cwd=tmp_path, text=True, capture_output=True,
                              timeout=280, check=False)
    finally:  # the mount is ours: take it away before anyone's `clean` trips on it
        pinned = _fired(state, "pin_control_dir")
        for point in pinned:
            subprocess.run(["umount", point], check=True)
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-2].startswith("testbed run: 1 unit failure(s) (1 teardown), 0 episode(s)"), \
        lines[-2:]
    assert lines[-1].startswith("testbed run: could not remove everything it made"), lines
    assert "for `testbed clean`" in lines[-1]
    assert len(pinned) == 1
    leftover = Path(pinned[0]).parent
    # the episodes had run on an intact network: they stand
    assert not _episodes(out)["aborted"].any()
    assert [f["stage"] for f in _session_failures(out)] == ["teardown"]
    assert "OSError" in _session_failures(out)[0]["reason"]
    assert leftover.exists(), "the directory that could not be removed"
    ledger = lines[-1].split(" is recorded in ")[1].split(" for ")[0]
    assert str(leftover) in Path(ledger).read_text()  # recorded for `testbed clean`
    clean = subprocess.run([sys.executable, "-m", "testbed", "clean"], cwd=tmp_path,
                           text=True, capture_output=True, timeout=60, check=False)
    assert clean.returncode == 0, clean.stderr
    assert not leftover.exists()
    assert not Path(ledger).exists()


def _toml(raw: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        return json.dumps(v)

    lines = [f"name = {value(raw['name'])}", f"seed = {raw['seed']}",
             f"templates = {raw['templates']}", "[options]"]
    lines += [f"{k} = {value(v)}" for k, v in raw["options"].items()]
    lines += ["[grid]"] + [f"{k} = {value(v)}" for k, v in raw["grid"].items()]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ on a dask cluster


class _ControllerOnly(PlanFence):
    """A policy registered in the controller's process alone (not a plugin)."""

    name = "test_controller_only"


@pytest.mark.slow
async def test_failures_on_a_cluster_worker_are_contained(tmp_path: Path, hooks: Any) -> None:
    """A unit whose teardown fails on its worker and a worker that cannot rebuild the
    campaign (it lacks the controller's plugin policy): their episodes come back with
    the reason, and every other unit runs."""
    _root()
    from testbed.run.dask_engine import open_dask_engine

    state = hooks(pin_control_dir={"agent": "a0", "times": 1})
    campaign = parse_campaign(TWO_GROUPS)
    async with open_dask_engine("local:1") as engine:
        try:
            summary = await run_campaign(campaign, tmp_path / "pinned", resume=False,
                                         console=quiet(), engine=engine)
        finally:
            for point in _fired(state, "pin_control_dir"):
                await trio.run_process(["umount", point])
        register(_ControllerOnly)  # in this process only: the worker cannot know it
        try:
            lacking = parse_campaign({**TWO_GROUPS, "name": "lacking", "templates": 1,
                                      "grid": {**TWO_GROUPS["grid"],
                                               "policy": [_ControllerOnly.name]}})
            lacked = await run_campaign(lacking, tmp_path / "lacking", resume=False,
                                        console=quiet(), engine=engine)
        finally:
            unregister(_ControllerOnly.name)
    assert len(_fired(state, "pin_control_dir")) == 1
    episodes = _episodes(tmp_path / "pinned")
    assert len(episodes) == 4
    assert not episodes["aborted"].any(), episodes["abort_reason"]  # measured before it
    # the group's teardown, then the worker's own ledger: both could not remove the dir
    assert [(f.stage, f.aborted) for f in summary.failures] == [("teardown", ())] * 2
    assert all("OSError" in f.reason and f.worker for f in summary.failures)
    assert [f["stage"] for f in _session_failures(tmp_path / "pinned")] == ["teardown"] * 2
    episodes = _episodes(tmp_path / "lacking")
    assert len(episodes) == 2  # one unit per group, each recorded
    for reason in episodes["abort_reason"]:
        assert reason.startswith("unit_failed: worker: CampaignError: "), reason
        assert _ControllerOnly.name in reason
    assert [f.stage for f in lacked.failures] == ["worker", "worker"]
