"""Campaign files, validation, the grid, and the resumable campaign loop.

The loop is driven by :class:`FakeRunner`, an in-memory twin of the episode runner
(testbed/episode.py) that derives plausible measurements from the schedule itself; it
exercises run-directory bookkeeping, resume and sharding, not the measurements (the
end-to-end test with real nodes lives beside the episode runner).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
import trio
from rich.console import Console

from testbed.campaign import (
    ACTION_COLUMNS,
    EPISODE_COLUMNS,
    Campaign,
    CampaignError,
    Cell,
    EpisodeAborted,
    EpisodeResult,
    GroupKey,
    episode_key,
    load_campaign,
    parse_campaign,
    preset_names,
    run_campaign,
    summary_frame,
)
from testbed.results_io import ResultRowError, RunDir, RunDirError, write_table_atomic
from testbed.workload import Schedule

REPO = Path(__file__).resolve().parents[2]

SMALL: dict[str, Any] = {
    "name": "small", "seed": 11, "templates": 2,
    "grid": {"policy": ["planfence", "owner_head_freshness", "centralized_lineage"],
             "network": ["loopback", "fixed"], "rho": [1, 4], "agents": [3],
             "units": [16]},
}
UNSAFE = {"local_replica", "owner_head_freshness"}


class SimulatedCrash(Exception):
    """Stands for the controller dying mid-episode (in-process variant)."""


class FakeGroup:
    """In-memory twin of a live group: measurements derived from the schedule."""

    def __init__(self, runner: FakeRunner, key: GroupKey) -> None:
        self.runner = runner
        self.key = key
        self.templates: set[str] = set()

    @property
    def backend(self) -> str:
        return "none" if self.key.network == "loopback" else "userspace"

    @property
    def description(self) -> Mapping[str, Any]:
        return {"hosts": self.key.agents + self.key.central, "fake": True}

    async def run_episode(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        key = episode_key(cell, schedule.template)
        self.runner.calls.append(key)
        self.templates.add(schedule.template)
        await trio.sleep(0.001)
        if key in self.runner.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if key in self.runner.crash_at:
            raise SimulatedCrash(key)
        if key in self.runner.abort_at:
            raise EpisodeAborted("node a1 exited with status 1 during update")
        if key in self.runner.hang_at:
            await trio.sleep_forever()
        return self.runner.measure(cell, schedule)


class FakeRunner:
    """Implements the campaign's Runner protocol without processes or sockets."""

    def __init__(self, *, kill_at: Sequence[str] = (), crash_at: Sequence[str] = (),
                 abort_at: Sequence[str] = (), hang_at: Sequence[str] = (),
                 bad_rows: bool = False) -> None:
        self.kill_at, self.crash_at = set(kill_at), set(crash_at)
        self.abort_at, self.hang_at = set(abort_at), set(hang_at)
        self.bad_rows = bad_rows
        self.calls: list[str] = []
        self.opened: list[GroupKey] = []
        self.closed: list[GroupKey] = []
        self.open_now = 0
        self.max_open = 0
        self.loopback_open = 0
        self.max_open_with_loopback = 0
        self.templates_per_group: list[set[str]] = []

    @asynccontextmanager
    async def open_group(self, key: GroupKey, cells: Sequence[Cell]) -> AsyncIterator[FakeGroup]:
        assert all(c.group_key == key for c in cells)
        self.opened.append(key)
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        self.loopback_open += key.network == "loopback"
        if self.loopback_open:
            self.max_open_with_loopback = max(self.max_open_with_loopback, self.open_now)
        group = FakeGroup(self, key)
        self.templates_per_group.append(group.templates)
        try:
            await trio.sleep(0.01)  # building a topology takes time; lets lanes overlap
            yield group
        finally:
            self.open_now -= 1
            self.loopback_open -= key.network == "loopback"
            self.closed.append(key)

    def measure(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        plans = {p.action: p for p in schedule.plans()}
        rows = []
        for act in schedule.acts():
            changed = any(u.key in act.keys for u in schedule.updates()
                          if plans[act.action].unit < u.unit < act.unit)
            unsafe = cell.policy in UNSAFE
            row: dict[str, Any] = {
                "action": act.action, "outcome": "released", "invalid": unsafe and changed,
                "complete": not (unsafe and changed), "replans": int(changed and not unsafe),
                "stall_ms": 5.0 + 3.0 * int(changed), "bytes": 1024 * (1 + cell.deps),
                "connections": 1, "block_reason": None}
            if self.bad_rows:
                del row["stall_ms"]
            rows.append(row)
        n = len(rows)
        episode = {"stall_ms_per_action": sum(r.get("stall_ms", 0) for r in rows) / n,
                   "stall_action_ms": sum(r.get("stall_ms", 0) for r in rows),
                   "stall_barrier_ms": 0.0, "stall_commit_ms": 0.0,
                   "kib_per_action": sum(r["bytes"] for r in rows) / 1024 / n,
                   "connections": n, "link_bytes": sum(r["bytes"] for r in rows) + 40 * n,
                   "congestion_control": "cubic"}
        return EpisodeResult(rows, episode)


def _quiet() -> Console:
    return Console(file=io.StringIO(), width=160)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "campaign.toml"
    path.write_text(text)
    return path


BASE_TOML = """
name = "t"
seed = 1
templates = 3
[grid]
policy = ["planfence"]
network = ["loopback"]
"""

# --- presets and loading ----------------------------------------------------------------


def test_presets_all_load_with_the_documented_sizes() -> None:
    sizes = {name: len(load_campaign(name).episodes()) for name in preset_names()}
    assert sizes == {"demo": 60, "primary": 390, "rates": 2880, "scope": 1200,
                     "density": 270, "reuse": 900, "teams": 72, "horizon": 27}


def test_demo_preset_matches_the_issue() -> None:
    demo = load_campaign("demo")
    cells = demo.cells()
    assert {c.policy for c in cells} == {"planfence", "batched_all_key", "metadata_sync",
                                        "centralized_lineage", "owner_head_freshness"}
    assert {c.network for c in cells} == {"loopback", "att"}
    assert {c.rho for c in cells} == {1.0, 4.0}
    assert {(c.agents, c.keys, c.connection) for c in cells} == {(5, 8, "reuse")}
    assert demo.templates == ("reservation-01", "fulfillment-01", "deployment-01")


def test_load_by_path_equals_parse(tmp_path: Path) -> None:
    path = _write(tmp_path, BASE_TOML)
    loaded = load_campaign(path)
    assert loaded.cells() == parse_campaign({"name": "t", "seed": 1, "templates": 3, "grid": {
        "policy": ["planfence"], "network": ["loopback"]}}).cells()
    assert loaded.source == str(path)


@pytest.mark.parametrize(("arg", "message"), [
    ("nosuch", "campaign: 'nosuch' is neither a file nor a preset; presets: demo, density, "
               "horizon, primary, rates, reuse, scope, teams"),
    ("missing/x.toml", "campaign: 'missing/x.toml' is file not found; presets: demo,"),
])
def test_unknown_campaign_lists_presets(arg: str, message: str) -> None:
    with pytest.raises(CampaignError) as info:
        load_campaign(arg)
    assert str(info.value).startswith(message)


# --- validation: one line naming the field and the allowed values ------------------------

_BAD = [
    ("rho = [3]", "grid.rho: 3 is not allowed; allowed: 0.25, 1, 4, 16"),
    ("rho = [4, 4]", "grid.rho: 4 is listed twice; list each value once"),
    ("rho = []", "grid.rho: empty list; list at least one value"),
    ('network = ["mars"]', "grid.network: 'mars' is not allowed; allowed: loopback, fixed, "
                           "att, att2016, tmobile, verizon"),
    ('policy = ["fastest"]', "grid.policy: 'fastest' is not allowed; allowed: adaptive, "
                             "all_replica, batched_all_key, centralized_lineage, local_replica, "
                             "majority_replica, metadata_sync, owner_head_freshness, "
                             "per_key_all_key, planfence, planfence_grouped, metadata_sync/K "
                             "with K in 1, 2, 4, 8, 16"),
    ('policy = ["metadata_sync/3"]', "grid.policy: 'metadata_sync/3' is not allowed;"),
    ('policy = ["planfence/2"]', "grid.policy: 'planfence/2' is not allowed;"),
    ('connection = ["pooled"]', "grid.connection: 'pooled' is not allowed; allowed: fresh, "
                                "reuse"),
    ('tier = ["large"]', "grid.tier: 'large' is not allowed; allowed: compact, artifact"),
    ("keys = [200]", "grid.keys: 200 is not allowed; allowed: integers 1..128"),
    ("keys = [true]", "grid.keys: True is not allowed; allowed: integers 1..128"),
    ("agents = [1]", "grid.agents: 1 is not allowed; allowed: integers 2..16"),
    ("units = [2]", "grid.units: 2 is not allowed; allowed: integers 4..4096"),
    ("keys = [8]\ndeps = [9]", "grid.deps: 9 exceeds grid.keys 8; allowed: deps <= keys"),
    ("trace_offset_s = [-5]", "grid.trace_offset_s: -5 is not allowed; allowed: numbers >= 0"),
    ("rate = [1]", "grid: unknown field 'rate'; allowed: policy, network, trace_offset_s, rho,"
                   " keys, agents, deps, connection, tier, units"),
]


@pytest.mark.parametrize(("line", "message"), _BAD)
def test_bad_grid_values(tmp_path: Path, line: str, message: str) -> None:
    kept = [x for x in BASE_TOML.splitlines() if x.split(" = ")[0] not in
            {y.split(" = ")[0] for y in line.splitlines()}]
    _assert_error(tmp_path, "\n".join([*kept, line, ""]), message)


@pytest.mark.parametrize(("text", "message"), [
    (BASE_TOML.replace("templates = 3", "templates = 31"),
     "templates: 31 is not allowed; allowed: a count 1..30 or a list of template ids"),
    (BASE_TOML.replace("templates = 3", 'templates = ["cruise-01"]'),
     "templates: 'cruise-01' is not allowed; allowed: <family>-NN with family in "
     "reservation, fulfillment, deployment and NN in 01..10"),
    (BASE_TOML.replace("seed = 1", "seed = -1"),
     "seed: -1 is not allowed; allowed: an integer >= 0"),
    (BASE_TOML.replace("seed = 1\n", ""), "seed: missing; a campaign needs name, seed,"),
    (BASE_TOML.replace('name = "t"', 'name = "my run"'), "name: 'my run' is not allowed;"),
    (BASE_TOML.replace('policy = ["planfence"]\n', ""),
     "grid.policy: missing; list at least one value"),
    (BASE_TOML + "[options]\nbackend = 'kernel'\n",
     "options.backend: 'kernel' is not allowed; allowed: auto, userspace, netem"),
    (BASE_TOML + "[options]\ndurability = 'none'\n",
     "options.durability: 'none' is not allowed; allowed: full, normal"),
    (BASE_TOML + "[options]\nrpc_timeout_s = 0\n",
     "options.rpc_timeout_s: 0 is not allowed; allowed: a number > 0"),
    (BASE_TOML + "[options]\nretries = 2\n", "options: unknown field 'retries'; allowed: "
                                            "rpc_timeout_s, durability, backend, delay_ms, "
                                            "episode_timeout_s"),
    ("owner = 'me'\n" + BASE_TOML, "campaign: unknown field 'owner'; allowed: name, seed,"),
    (BASE_TOML.replace("[grid]", "[[grid]]") + "[[grid]]\npolicy = ['planfence']\n"
     "network = ['att']\nrho = [2]\n", "grid[1].rho: 2 is not allowed; allowed: 0.25, 1, 4, 16"),
    (BASE_TOML + "rho = [4\n", "campaign.toml: invalid TOML:"),
])
def test_bad_campaign_files(tmp_path: Path, text: str, message: str) -> None:
    _assert_error(tmp_path, text, message)


def _assert_error(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(CampaignError) as info:
        load_campaign(path)
    text_out = str(info.value)
    assert text_out.startswith(message.replace("campaign.toml", str(path)))
    assert "\n" not in text_out


# --- the grid ---------------------------------------------------------------------------


def test_grid_expands_to_the_product_with_defaults() -> None:
    campaign = parse_campaign(SMALL)
    cells = campaign.cells()
    assert len(cells) == 3 * 2 * 2
    assert {(c.keys, c.deps, c.connection, c.tier, c.trace_offset_s) for c in cells} == \
        {(8, 1, "fresh", "compact", 0.0)}
    assert len({c.id for c in cells}) == len(cells)
    assert cells[0].id == "planfence_loopback_o0_r1_x8_n3_d1_fresh_compact_t16"


def test_grid_slices_union_without_duplicates() -> None:
    reuse = load_campaign("reuse")
    cells = reuse.cells()
    assert len(cells) == len(set(cells)) == 3 * 4 * 2 + 2 * 2 * 2 - 2


def test_episodes_keep_topology_groups_contiguous() -> None:
    campaign = load_campaign("demo")
    episodes = campaign.episodes()
    assert len(episodes) == len(campaign.cells()) * 3
    sequence = [c.group_key for c, _ in episodes]
    runs = [k for i, k in enumerate(sequence) if i == 0 or sequence[i - 1] != k]
    assert len(runs) == len(set(runs)) == 4
    central = [c for c, _ in episodes if c.group_key.central]
    assert {c.policy for c in central} == {"centralized_lineage"}
    first_group = [t for c, t in episodes if c.group_key == sequence[0]]
    assert first_group[:4] == ["reservation-01"] * 4, "templates are the outer loop"


def test_schedules_identical_across_policies_networks_connections() -> None:
    campaign = load_campaign("reuse")
    digests: dict[tuple[Any, ...], set[str]] = {}
    for cell in campaign.cells():
        key = (cell.rho, cell.keys, cell.agents, cell.deps, cell.units, cell.tier)
        digests.setdefault(key, set()).add(campaign.schedule(cell, "deployment-04").digest)
    assert all(len(d) == 1 for d in digests.values())
    assert len({next(iter(d)) for d in digests.values()}) == len(digests)


def test_with_templates_keeps_everything_else() -> None:
    demo = load_campaign("demo")
    one = demo.with_templates(1)
    assert one.templates == ("reservation-01",)
    assert one.cells() == demo.cells()
    with pytest.raises(CampaignError, match=r"^templates: 0 is not allowed"):
        demo.with_templates(0)


# --- the campaign loop ---------------------------------------------------------------------


async def _run(campaign: Campaign, out: Path, runner: FakeRunner, *, resume: bool = False,
               console: Console | None = None) -> Any:
    return await run_campaign(campaign, out, resume=resume, runner=runner,
                              console=console or _quiet())


async def test_run_writes_manifest_shards_and_tables(tmp_path: Path) -> None:
    campaign = parse_campaign(SMALL)
    runner = FakeRunner()
    console = _quiet()
    summary = await _run(campaign, tmp_path / "out", runner, console=console)
    out = tmp_path / "out"
    episodes = pd.read_parquet(out / "episodes.parquet")
    actions = pd.read_parquet(out / "actions.parquet")
    assert tuple(episodes.columns) == EPISODE_COLUMNS
    assert tuple(actions.columns) == ACTION_COLUMNS
    expected = [episode_key(c, t) for c, t in campaign.episodes()]
    assert runner.calls == expected
    assert sorted(episodes["episode"]) == sorted(expected)
    assert len(actions) == episodes["scheduled_actions"].sum()
    assert summary.ran == len(expected) == 24
    assert runner.opened == runner.closed == [k for k, _ in campaign.groups()]
    assert set(actions.loc[actions["invalid"], "policy"]) == {"owner_head_freshness"}
    assert (episodes.groupby(["rho", "template"])["schedule_digest"].nunique() == 1).all()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["campaign"] == "small"
    assert manifest["config"] == campaign.config()
    assert manifest["status"] == "complete"
    assert manifest["versions"]["pyarrow"] == pa.__version__
    assert manifest["system"]["kernel"].startswith(os.uname().sysname)
    assert set(manifest["groups"]) == {k.id for k, _ in campaign.groups()}
    assert manifest["backend"] == "none, userspace"
    assert len(manifest["git"]["revision"]) in (40, len("unknown"))
    printed = console.file.getvalue()  # type: ignore[attr-defined]
    assert "stall ms/action" in printed
    assert "owner_head_freshness" in printed


async def test_summary_rows_follow_the_campaign_file_not_shard_names(tmp_path: Path) -> None:
    # shard file names sort "r16" before "r4"; the summary keeps the file's order
    campaign = parse_campaign({**SMALL, "grid": {**SMALL["grid"], "rho": [4, 16]}})
    await _run(campaign, tmp_path, FakeRunner())
    frame = summary_frame(tmp_path)
    assert list(frame["cell"]) == [c.id for c in campaign.cells()]


async def test_non_empty_directory_needs_resume(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(CampaignError, match="not empty; pass --resume"):
        await _run(parse_campaign(SMALL), tmp_path, FakeRunner())
    with pytest.raises(CampaignError, match="no campaign manifest"):
        await _run(parse_campaign(SMALL), tmp_path, FakeRunner(), resume=True)


async def test_resume_reruns_started_and_never_repeats_completed(tmp_path: Path) -> None:
    campaign = parse_campaign(SMALL)
    keys = [episode_key(c, t) for c, t in campaign.episodes()]
    first = FakeRunner(crash_at=[keys[5]])
    with pytest.raises(SimulatedCrash):
        await _run(campaign, tmp_path, first)
    run_dir = RunDir(tmp_path)
    run_dir.open()
    assert run_dir.completed() == set(keys[:5])
    assert run_dir.ledger()[keys[5]] == ("started", 1)
    run_dir.close()
    assert json.loads((tmp_path / "manifest.json").read_text())["status"] == "interrupted"

    second = FakeRunner()
    summary = await _run(campaign, tmp_path, second, resume=True)
    assert second.calls == keys[5:]
    assert (summary.skipped, summary.ran) == (5, len(keys) - 5)
    episodes = pd.read_parquet(tmp_path / "episodes.parquet")
    actions = pd.read_parquet(tmp_path / "actions.parquet")
    assert sorted(episodes["episode"]) == sorted(keys)
    assert not actions.duplicated(["episode", "action"]).any()
    assert len(actions) == episodes["scheduled_actions"].sum()
    run_dir.open()
    ledger = run_dir.ledger()
    run_dir.close()
    assert ledger[keys[5]] == ("complete", 2)
    assert all(ledger[k] == ("complete", 1) for k in keys[:5] + keys[6:])

    third = FakeRunner()
    await _run(campaign, tmp_path, third, resume=True)
    assert third.calls == []
    assert third.opened == [], "no topology is built when nothing is left"


async def test_resume_refuses_a_different_campaign(tmp_path: Path) -> None:
    await _run(parse_campaign(SMALL), tmp_path, FakeRunner())
    other = parse_campaign({**SMALL, "seed": 12})
    with pytest.raises(CampaignError, match=r"^--resume: .* different campaign \(field seed\)"):
        await _run(other, tmp_path, FakeRunner(), resume=True)


async def test_aborted_episode_is_recorded_without_imputation(tmp_path: Path) -> None:
    campaign = parse_campaign(SMALL)
    keys = [episode_key(c, t) for c, t in campaign.episodes()]
    runner = FakeRunner(abort_at=[keys[2]])
    summary = await _run(campaign, tmp_path, runner)
    assert summary.aborted == 1
    first = campaign.groups()[0][0]
    assert runner.opened[:2] == [first, first], "the group is rebuilt after an abort"
    assert len(runner.opened) == len(campaign.groups()) + 1
    assert runner.calls == keys
    episodes = pd.read_parquet(tmp_path / "episodes.parquet").set_index("episode")
    actions = pd.read_parquet(tmp_path / "actions.parquet")
    row = episodes.loc[keys[2]]
    assert bool(row["aborted"])
    assert row["abort_reason"] == "node a1 exited with status 1 during update"
    assert row["attempted_actions"] == 0
    assert row["scheduled_actions"] == campaign.schedule(*campaign.episodes()[2]).counts.actions
    assert pd.isna(row["stall_ms_per_action"])
    assert pd.isna(row["kib_per_action"])
    assert keys[2] not in set(actions["episode"])
    assert (~episodes.drop(index=keys[2])["aborted"]).all()


async def test_episode_timeout_aborts_and_the_campaign_goes_on(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    data = {**SMALL, "options": {"episode_timeout_s": 30}}
    campaign = parse_campaign(data)
    keys = [episode_key(c, t) for c, t in campaign.episodes()]
    runner = FakeRunner(hang_at=[keys[0]])
    summary = await _run(campaign, tmp_path, runner)
    episodes = pd.read_parquet(tmp_path / "episodes.parquet").set_index("episode")
    assert episodes.loc[keys[0], "abort_reason"] == \
        "episode exceeded options.episode_timeout_s (30 s) by 30 s; the runner did not stop it"
    assert (summary.aborted, summary.ran) == (1, len(keys))


async def test_runner_rows_breaking_the_contract_are_refused(tmp_path: Path) -> None:
    campaign = parse_campaign(SMALL)
    with pytest.raises(ResultRowError, match="missing field"):
        await _run(campaign, tmp_path, FakeRunner(bad_rows=True))
    run_dir = RunDir(tmp_path)
    run_dir.open()
    assert run_dir.completed() == set()
    run_dir.close()


def _measurements(out: Path) -> pd.DataFrame:
    episodes = pd.read_parquet(out / "episodes.parquet")
    return episodes.drop(columns=["wall_s"]).sort_values("episode").reset_index(drop=True)


async def test_lanes_run_each_episode_once_with_the_same_results(tmp_path: Path) -> None:
    campaign = parse_campaign(SMALL)
    keys = [episode_key(c, t) for c, t in campaign.episodes()]
    serial, parallel = FakeRunner(), FakeRunner()
    await _run(campaign, tmp_path / "serial", serial)
    summary = await run_campaign(campaign, tmp_path / "parallel", resume=False,
                                 runner=parallel, console=_quiet(), jobs=3)
    assert sorted(parallel.calls) == sorted(keys)
    assert summary.ran == len(keys)
    assert serial.max_open == 1
    assert parallel.max_open == 3, "three topologies were live at once"
    # loopback slices ran first and alone: never beside another topology
    loopback_calls = [k for k in parallel.calls if "_loopback_" in k]
    assert parallel.calls[:len(loopback_calls)] == loopback_calls
    assert parallel.max_open_with_loopback == 1
    # one (group, template) slice per topology: a template's policies run together
    units = {(c.group_key, t) for c, t in campaign.episodes()}
    assert len(parallel.opened) == len(units)
    assert all(len(t) == 1 for t in parallel.templates_per_group)
    pd.testing.assert_frame_equal(_measurements(tmp_path / "serial"),
                                  _measurements(tmp_path / "parallel"))
    manifest = json.loads((tmp_path / "parallel" / "manifest.json").read_text())
    assert manifest["sessions"][-1]["jobs"] == 3


async def test_a_failing_lane_stops_the_others_and_resume_finishes(tmp_path: Path) -> None:
    campaign = parse_campaign(SMALL)
    keys = [episode_key(c, t) for c, t in campaign.episodes()]
    with pytest.raises(SimulatedCrash):  # the error itself, not an exception group
        await run_campaign(campaign, tmp_path, resume=False, runner=FakeRunner(
            crash_at=[keys[7]]), console=_quiet(), jobs=2)
    second = FakeRunner()
    await run_campaign(campaign, tmp_path, resume=True, runner=second, console=_quiet(),
                       jobs=2)
    assert keys[7] in second.calls
    episodes = pd.read_parquet(tmp_path / "episodes.parquet")
    assert sorted(episodes["episode"]) == sorted(keys)


@pytest.mark.parametrize("jobs", [0, -1, 1.5])
async def test_jobs_must_be_a_positive_integer(tmp_path: Path, jobs: Any) -> None:
    with pytest.raises(CampaignError, match=r"^jobs: .* allowed: an integer >= 1"):
        await run_campaign(parse_campaign(SMALL), tmp_path, resume=False,
                           runner=FakeRunner(), console=_quiet(), jobs=jobs)


async def test_a_directory_holds_one_run_at_a_time(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    holder = RunDir(fresh)
    holder.open()  # only the lock file and empty folders: still an empty run directory
    try:
        assert RunDir(fresh).is_empty() is False  # folders were created ...
        with pytest.raises(RunDirError, match=r"in use by another `testbed run` \(pid "
                                              rf"{os.getpid()}\)"):
            RunDir(fresh).open()
    finally:
        holder.close()

    campaign = parse_campaign(SMALL)
    await _run(campaign, tmp_path / "run", FakeRunner())
    holder = RunDir(tmp_path / "run")
    holder.open()
    try:
        runner = FakeRunner()
        with pytest.raises(RunDirError, match="in use by another `testbed run`"):
            await _run(campaign, tmp_path / "run", runner, resume=True)
        assert runner.opened == []
    finally:
        holder.close()
    await _run(campaign, tmp_path / "run", FakeRunner(), resume=True)  # released on close

    only_lock = tmp_path / "only-lock"
    only_lock.mkdir()
    (only_lock / ".run.lock").write_text("123\n")
    assert RunDir(only_lock).is_empty(), "a left-over lock file alone is not a run"


async def test_extend_runs_only_the_new_cells_and_templates(tmp_path: Path) -> None:
    small = parse_campaign(SMALL)
    await _run(small, tmp_path, FakeRunner())
    grown_data = {**SMALL, "templates": 4, "description": "grown",
                  "grid": {**SMALL["grid"], "policy": [*SMALL["grid"]["policy"],
                                                       "batched_all_key"]}}
    grown = parse_campaign(grown_data)
    with pytest.raises(CampaignError, match=r"different campaign .*--extend"):
        await _run(grown, tmp_path, FakeRunner(), resume=True)
    runner = FakeRunner()
    summary = await run_campaign(grown, tmp_path, resume=False, extend=True, runner=runner,
                                 console=_quiet())
    old = {episode_key(c, t) for c, t in small.episodes()}
    every = [episode_key(c, t) for c, t in grown.episodes()]
    assert runner.calls == [k for k in every if k not in old]
    assert (summary.skipped, summary.ran) == (len(old), len(every) - len(old))
    episodes = pd.read_parquet(tmp_path / "episodes.parquet")
    assert sorted(episodes["episode"]) == sorted(every)
    # old and new episodes of a template share its schedule: they stay paired
    assert (episodes.groupby(["rho", "template"])["schedule_digest"].nunique() == 1).all()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["config"] == grown.config()
    assert manifest["sessions"][-1]["extended_from"] == {"templates": 2, "cells": 12}


async def test_a_clone_without_shards_extends_without_repeating(tmp_path: Path) -> None:
    """results/ commits the consolidated tables, not shards/ or state.sqlite: a clone
    must still resume and extend without rerunning a committed episode."""
    import shutil

    small = parse_campaign(SMALL)
    await _run(small, tmp_path, FakeRunner())
    before = pd.read_parquet(tmp_path / "episodes.parquet")
    before_actions = pd.read_parquet(tmp_path / "actions.parquet")
    shutil.rmtree(tmp_path / "shards")
    (tmp_path / "state.sqlite").unlink()

    again = FakeRunner()
    await _run(small, tmp_path, again, resume=True)
    assert again.calls == []
    grown = parse_campaign({**SMALL, "templates": 3})
    runner = FakeRunner()
    await run_campaign(grown, tmp_path, resume=False, extend=True, runner=runner,
                       console=_quiet())
    assert runner.calls == [episode_key(c, t) for c, t in grown.episodes()
                            if t not in small.templates]
    after = pd.read_parquet(tmp_path / "episodes.parquet").set_index("episode")
    kept = after.loc[before["episode"]].reset_index()
    pd.testing.assert_frame_equal(kept, before, check_like=True)
    actions = pd.read_parquet(tmp_path / "actions.parquet")
    restored = actions[actions["episode"].isin(before["episode"])].reset_index(drop=True)
    pd.testing.assert_frame_equal(
        restored.sort_values(["episode", "action"]).reset_index(drop=True),
        before_actions.sort_values(["episode", "action"]).reset_index(drop=True))


@pytest.mark.parametrize(("change", "message"), [
    ({"seed": 12}, r"another seed"),
    ({"options": {"rpc_timeout_s": 3}}, r"another options"),
    ({"templates": 1}, r"template .* missing"),
    ({"grid": {**SMALL["grid"], "rho": [4]}}, r"cell .*_r1_.* missing"),
])
async def test_extend_refuses_what_would_change_or_drop_results(
        tmp_path: Path, change: dict[str, Any], message: str) -> None:
    await _run(parse_campaign(SMALL), tmp_path, FakeRunner())
    other = parse_campaign({**SMALL, **change})
    with pytest.raises(CampaignError, match=r"^--extend: .*" + message):
        await run_campaign(other, tmp_path, resume=False, extend=True, runner=FakeRunner(),
                           console=_quiet())


# --- kills: real SIGKILLs in a child process ------------------------------------------------

_CHILD = """
import io, os, signal, sys
from pathlib import Path
import trio
from rich.console import Console
from testbed import results_io
from testbed.campaign import parse_campaign, run_campaign
from tests.testbed.test_campaign import SMALL, FakeRunner

out, kill_at, at_commit = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "commit"
if at_commit:
    real_replace = os.replace
    def replace(src, dst):
        if "shards/episodes" in str(dst) and kill_at.replace("/", "~") in str(dst):
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(src, dst)
    results_io.os.replace = replace
runner = FakeRunner(kill_at=[] if at_commit else [kill_at])
trio.run(lambda: run_campaign(parse_campaign(SMALL), out, resume=False, runner=runner,
                              console=Console(file=io.StringIO())))
"""


def _killed_child(out: Path, kill_at: str, where: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(out), kill_at, where],
                          cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


@pytest.mark.parametrize("where", ["episode", "commit"])
async def test_sigkill_then_resume_loses_and_duplicates_nothing(tmp_path: Path,
                                                                where: str) -> None:
    campaign = parse_campaign(SMALL)
    keys = [episode_key(c, t) for c, t in campaign.episodes()]
    _killed_child(tmp_path, keys[3], where)
    assert not (tmp_path / "episodes.parquet").exists()
    if where == "commit":
        assert list((tmp_path / "shards" / "episodes").glob(".*.tmp-*")), \
            "the killed write left only a temporary file"
    run_dir = RunDir(tmp_path)
    run_dir.open()
    assert run_dir.completed() == set(keys[:3])
    assert run_dir.ledger()[keys[3]] == ("started", 1)
    assert not list((tmp_path / "shards").rglob(".*.tmp-*")), "leftovers removed on open"
    run_dir.close()

    runner = FakeRunner()
    await _run(campaign, tmp_path, runner, resume=True)
    assert runner.calls == keys[3:]
    episodes = pd.read_parquet(tmp_path / "episodes.parquet")
    actions = pd.read_parquet(tmp_path / "actions.parquet")
    assert sorted(episodes["episode"]) == sorted(keys)
    assert not actions.duplicated(["episode", "action"]).any()
    assert len(actions) == episodes["scheduled_actions"].sum()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [s.get("status") for s in manifest["sessions"]] == [None, "complete"]


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
    await _run(campaign, tmp_path, FakeRunner())
    run_dir = RunDir(tmp_path)
    run_dir.open()
    before = pd.read_parquet(tmp_path / "actions.parquet")
    assert run_dir.consolidate() == (len(before), 24)
    after = pd.read_parquet(tmp_path / "actions.parquet")
    run_dir.close()
    pd.testing.assert_frame_equal(before, after)
