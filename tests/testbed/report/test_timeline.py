"""The timeline of one episode: its layout (pure) and its figure files.

The layout is checked on a hand-written history (the rules one by one) and on a real
loopback campaign of owner-head freshness and PlanFence, whose episodes have stale
actions (owner-head freshness) and recorded calls (every node's ``rpc_log``): the stale
actions highlighted are exactly the checker's, each with the write that superseded its
input, and every recorded call is a request and a reply arrow between the right lanes.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import trio
from rich.console import Console

from protocols.history import parse_history
from protocols.history_check import CURRENT, check_history
from testbed.campaign.parse import parse_campaign
from testbed.report.timeline import timeline_for
from testbed.report.timeline_layout import Timeline, timeline_layout
from testbed.results.history import episode_folders, read_episode
from testbed.run.episode import EpisodeRunner
from testbed.run.history import rpc_events
from testbed.run.loop import run_campaign

A1 = """{"history": 1, "host": "a1", "t0_ns": 1000000}
{"type": "write", "t_ns": 1000000, "key": "k", "version": "v1", "owner": "a1"}
{"type": "write", "t_ns": 5000000, "key": "k", "version": "v2", "owner": "a1"}
"""
A2 = """{"history": 1, "host": "a2", "t0_ns": 1000000}
{"type": "derive", "t_ns": 2000000, "plan": "p1", "inputs": {"k": "v1"}}
{"type": "check", "t_ns": 3000000, "start_t_ns": 2500000, "action": "go"}
{"type": "act", "t_ns": 6000000, "action": "go", "plan": "p1"}
"""
RPC = """{"history": 1, "host": "a2"}
{"type": "rpc", "t_ns": 3000000, "start_t_ns": 2500000, "peer": "a1", "method": "heads", "served_t_ns": 2700000}
{"type": "rpc", "t_ns": 4000000, "start_t_ns": 3500000, "peer": "a3", "method": "fetch"}
"""


def _layout(a2: str, *more: str) -> Timeline:
    histories = [parse_history(A1, "a1.jsonl"), parse_history(a2, "a2.jsonl"),
                 *(parse_history(text, f"more{i}.jsonl") for i, text in enumerate(more))]
    return timeline_layout(histories, check_history(histories))


def test_layout_marks_the_stale_action_and_the_write_that_superseded_it() -> None:
    timeline = _layout(A2)
    assert timeline.lanes == ("a1", "a2")
    assert [(m.kind, m.host, m.t_ms) for m in timeline.marks] == [
        ("write", "a1", 0.0), ("derive", "a2", 1.0), ("check", "a2", 1.5),
        ("write", "a1", 4.0), ("act", "a2", 5.0)]
    assert timeline.marks[2].end_ms == 2.0
    (light,) = timeline.highlights
    assert light.action == "go"
    assert light.act.t_ms == 5.0
    assert [(w.host, w.t_ms, w.label) for w in light.superseding] == [("a1", 4.0, "k@v2")]
    assert not timeline.has_messages
    assert timeline.arrows == ()


def test_layout_draws_only_calls_with_the_peers_instant() -> None:
    timeline = _layout(A2, RPC)  # a second file of a2's
    assert timeline.lanes == ("a1", "a2", "a3")  # a peer only an rpc names gets a lane
    assert timeline.rpc_events == 2
    assert timeline.undrawn_rpcs == 1
    assert [(a.kind, a.src, a.src_ms, a.dst, a.dst_ms) for a in timeline.arrows] == [
        ("request", "a2", 1.5, "a1", 1.7), ("reply", "a1", 1.7, "a2", 2.0)]


def test_a_current_action_is_not_highlighted() -> None:
    timeline = _layout(A2.replace('"t_ns": 6000000', '"t_ns": 4500000'))
    assert timeline.highlights == ()


def test_rpc_events_pair_each_call_with_the_request_its_peer_answered_inside_it() -> None:
    logs = {"a1": {"calls": [["a2", "heads", 10, 20], ["a2", "heads", 30, 40]],
                   "served": []},
            "a2": {"calls": [["a1", "fetch", 5, 8]], "served": [["a1", "heads", 35],
                                                                ["a1", "heads", 15]]}}
    out = rpc_events(logs)
    assert [e.get("served_t_ns") for e in out["a1"]] == [15, 35]
    assert out["a2"] == [{"type": "rpc", "t_ns": 8, "start_t_ns": 5, "peer": "a1",
                          "method": "fetch"}]  # a1 recorded no answer: no peer instant


# --- on a real loopback campaign -------------------------------------------------------

@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("timeline") / "out"
    campaign = parse_campaign({
        "name": "timeline", "seed": 7, "templates": 2,
        "options": {"episode_timeout_s": 120},
        "grid": {"policy": ["owner_head_freshness", "planfence"], "network": ["loopback"],
                 "rho": [4], "agents": [3], "keys": [6], "deps": [3], "units": [24],
                 "connection": ["reuse"]}})

    async def main() -> None:
        await run_campaign(campaign, out, resume=False, runner=EpisodeRunner(campaign),
                           console=Console(file=io.StringIO(), width=200))

    trio.run(main)
    return out


def _stale_episode(run: Path) -> str:
    episodes = pd.read_parquet(run / "episodes.parquet")
    stale = episodes[episodes["stale_actions"] > 0]["episode"]
    assert len(stale), "no episode with a stale action"
    return str(stale.iloc[0])


@pytest.mark.slow
def test_the_layout_of_a_real_episode_with_a_stale_action(run: Path) -> None:
    key = _stale_episode(run)
    folder = dict(episode_folders(run))[key]
    histories = read_episode(folder)
    result = check_history(histories)
    _, timeline = timeline_for(run, key.replace("/", "~"))
    assert set(timeline.lanes) == {h.host for h in histories}
    stale = {v.action: v for v in result.verdicts if v.status != CURRENT}
    assert {h.action for h in timeline.highlights} == set(stale) != set()
    t0 = min(min(e.start_t_ns if e.type in ("check", "rpc") else e.t_ns for e in h.events)
             for h in histories if h.events)
    writes = {(e.key, e.version): e for h in histories for e in h.events if e.type == "write"}
    for light in timeline.highlights:
        verdict = stale[light.action]
        assert light.act.host == verdict.host
        expected = {(writes[(s.key, s.newer)].host, (s.newer_t_ns - t0) / 1e6)
                    for s in verdict.stale if s.newer_t_ns is not None}
        assert {(w.host, w.t_ms) for w in light.superseding} == expected != set()
        assert all(w.t_ms < light.act.t_ms for w in light.superseding)
    assert timeline.has_messages
    assert timeline.undrawn_rpcs == 0
    assert len(timeline.arrows) == 2 * timeline.rpc_events
    for request, reply in zip(timeline.arrows[::2], timeline.arrows[1::2], strict=True):
        assert (request.kind, reply.kind) == ("request", "reply")
        assert (request.src, request.dst) == (reply.dst, reply.src) != (reply.src, reply.src)
        assert request.src_ms <= request.dst_ms == reply.src_ms <= reply.dst_ms


async def _testbed(*args: str) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process([sys.executable, "-m", "testbed", *args],
                                  capture_stdout=True, capture_stderr=True, check=False)


@pytest.mark.slow
async def test_report_timeline_writes_the_figures_and_puts_them_in_the_report(
        run: Path, tmp_path: Path) -> None:
    key = _stale_episode(run)
    only = await _testbed("report", str(run), "--episode", key, "--timeline",
                          "--only-timeline", "--out", str(tmp_path / "only"))
    assert only.returncode == 0, only.stderr
    stems = [p.name for p in (tmp_path / "only" / "figures").iterdir()]
    assert sorted(p.rsplit(".", 1)[1] for p in stems) == ["png", "svg"]
    assert all(p.startswith("timeline_") for p in stems)
    assert all((tmp_path / "only" / "figures" / p).stat().st_size > 1000 for p in stems)

    full = await _testbed("report", str(run), "--episode", key, "--timeline", "--draws", "10",
                          "--out", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    assert "timeline_" in (tmp_path / "full" / "report.html").read_text()
    assert list((tmp_path / "full" / "figures").glob("timeline_*.png"))


@pytest.mark.slow
async def test_an_unknown_episode_is_a_one_line_error_saying_how_to_find_keys(
        run: Path) -> None:
    proc = await _testbed("report", str(run), "--episode", "no-such", "--timeline",
                          "--only-timeline")
    assert proc.returncode == 2
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1
    assert "--episode" in lines[0]
    assert "history check" in lines[0]
