"""The host's lane budget, its rules one by one (testbed/host/lanes.py).

Two ``HostLanes`` in one process stand for two runs (they differ by id; liveness is
their shared pid); the state is a real directory with its flock. The concurrent
``testbed run`` processes are in tests/testbed/run/test_host_lanes.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import trio

from testbed.errors import UserError
from testbed.host import lanes as lanes_mod
from testbed.host.lanes import HostLanes, holders, host_summary


def _run(directory: Path, ident: str, budget: int = 4) -> HostLanes:
    host = HostLanes(ident, budget=budget, directory=directory, campaign=ident)
    host.open()
    return host


async def _hold(host: HostLanes, kind: str, got: list[str], release: trio.Event,
                name: str) -> None:
    async with host.exclusive() if kind == "loopback" else host.lane():
        got.append(name)
        await release.wait()
    got.append(f"-{name}")


async def _settle() -> None:
    await trio.sleep(lanes_mod.POLL_S * 3)


@pytest.mark.slow
async def test_budget_is_shared_fairly_between_two_runs(tmp_path: Path) -> None:
    a, b = _run(tmp_path, "tb0000a1"), _run(tmp_path, "tb0000b1")
    got: list[str] = []
    release = {n: trio.Event() for n in ("a1", "a2", "a3", "a4", "b1", "b2")}
    async with trio.open_nursery() as nursery:
        for n in ("a1", "a2", "a3", "a4"):
            nursery.start_soon(_hold, a, "lane", got, release[n], n)
        await _settle()
        assert sorted(got) == ["a1", "a2", "a3", "a4"]  # the whole budget, nobody else
        for n in ("b1", "b2"):
            nursery.start_soon(_hold, b, "lane", got, release[n], n)
        await _settle()
        assert "b1" not in got
        assert "b2" not in got
        assert b.me.waiting == 2
        # a's lane ends its unit and wants the next: above its share (2) with b
        # waiting, it must not take the lane back
        release["a1"].set()
        nursery.start_soon(_hold, a, "lane", got, release.setdefault("a5", trio.Event()),
                           "a5")
        await _settle()
        assert sum(x in got for x in ("b1", "b2")) == 1
        assert "a5" not in got
        release["a2"].set()
        await _settle()
        assert "b1" in got
        assert "b2" in got
        assert "a5" not in got
        assert a.me.held == 2
        assert b.me.held == 2
        for event in release.values():
            event.set()
    assert a.me.held == b.me.held == 0
    a.close()
    b.close()


@pytest.mark.slow
async def test_loopback_never_runs_beside_another_runs_lanes(tmp_path: Path) -> None:
    a, b = _run(tmp_path, "tb0000a2"), _run(tmp_path, "tb0000b2")
    got: list[str] = []
    release = {n: trio.Event() for n in ("a1", "a2", "loop", "a3")}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_hold, a, "lane", got, release["a1"], "a1")
        await _settle()
        nursery.start_soon(_hold, b, "loopback", got, release["loop"], "loop")
        await _settle()
        assert "loop" not in got  # a lane of another run is busy
        nursery.start_soon(_hold, a, "lane", got, release["a2"], "a2")
        await _settle()
        assert "a2" not in got  # no new lane while a run waits for the exclusivity
        release["a1"].set()
        await _settle()
        assert "loop" in got
        assert "a2" not in got
        assert [h.loopback for h in holders(tmp_path) if h.id == b.me.id] == [True]
        summary = host_summary(tmp_path, budget=4)
        assert "run tb0000b2 (campaign tb0000b2" in summary
        assert "loopback (exclusive)" in summary
        release["loop"].set()
        await _settle()
        assert "a2" in got
        release["a2"].set()
    assert got.index("-a1") < got.index("loop") < got.index("-loop") < got.index("a2")
    a.close()
    b.close()


def _dead_holders(directory: Path) -> None:
    """Lines of two killed runs: one whose process is gone, one whose pid was reused
    (same pid, another start time)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = lanes_mod.Holder(id="tb0dead0", pid=gone.pid, start_ticks=1, campaign="killed",
                            held=0, loopback=True, budget=4)
    (directory / "tb0dead0.json").write_text(json.dumps(dead.__dict__))
    reused_pid = lanes_mod.Holder(id="tb0dead1", pid=1, start_ticks=-5, held=4, budget=4)
    (directory / "tb0dead1.json").write_text(json.dumps(reused_pid.__dict__))


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("tb*.json"))


async def test_a_dead_holder_releases_the_host(tmp_path: Path) -> None:
    """A run killed while it held the exclusivity: its file names a process that is
    gone, so the next run that looks removes it and goes on (no `clean` needed)."""
    _dead_holders(tmp_path)
    c = _run(tmp_path, "tb0000c3")
    with trio.fail_after(5):
        async with c.lane():
            assert c.me.held == 1
    assert _files(tmp_path) == ["tb0000c3.json"]
    c.close()
    assert _files(tmp_path) == []


async def test_cancelled_waiter_stops_blocking_others(tmp_path: Path) -> None:
    a, b = _run(tmp_path, "tb0000a4", budget=2), _run(tmp_path, "tb0000b4", budget=2)
    async with a.lane():
        with trio.move_on_after(lanes_mod.POLL_S * 2):
            async with b.exclusive():
                raise AssertionError("granted beside a held lane")
        # the cancelled wait is withdrawn: a may take a second lane again
        assert [h.waiting_loopback for h in holders(tmp_path) if h.id == b.me.id] == [False]
        with trio.fail_after(5):
            async with a.lane():
                assert a.me.held == 2
    with trio.fail_after(5):
        async with b.exclusive():
            assert b.me.loopback
    a.close()
    b.close()


def test_budget_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(lanes_mod.BUDGET_ENV, raising=False)
    import os

    assert lanes_mod.default_budget() == lanes_mod.LANES_PER_CPU * (os.cpu_count() or 1)
    monkeypatch.setenv(lanes_mod.BUDGET_ENV, "3")
    assert lanes_mod.default_budget() == 3
    monkeypatch.setenv(lanes_mod.BUDGET_ENV, "zero")
    with pytest.raises(UserError, match="TESTBED_HOST_LANES: 'zero' is not allowed"):
        lanes_mod.default_budget()
