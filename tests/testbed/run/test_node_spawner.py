"""The node zygote (nodes/zygote.py, testbed/run/node_spawner.py) with real processes:
forked nodes serve their control socket, their ends are reported with subprocess's
conventions, and nothing outlives the team or the zygote."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path

import pytest
import trio
import trio.testing

from nodes.control import ControlClient
from nodes.zygote import decode, encode
from testbed.host.processes import is_running
from testbed.run.node_spawner import (
    ENV_NODE_START,
    UNKNOWN_EXIT,
    ForkedProcess,
    NodeSpawner,
    SpawnError,
    node_environment,
    node_start_mode,
    one_zygote_for_all,
    open_spawner,
)
from testbed.run.team import open_team

AGENTS = ["a0", "a1", "a2"]


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _text(path: Path) -> str:
    return path.read_text()


def _argv(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


def _env() -> dict[str, str]:
    return node_environment()


async def _node(spawner: NodeSpawner, sock_dir: str, log: Path,
                parent: int | None = None) -> tuple[ForkedProcess, str]:
    control = os.path.join(sock_dir, "n.sock")
    process = await spawner.spawn(
        ["--control", control, "--parent-pid", str(parent or spawner.pid)], log, _env())
    with trio.fail_after(60):
        while True:
            try:
                client = await ControlClient.connect(control)
                break
            except OSError:
                assert process.returncode is None, _text(log)
                await trio.sleep(0.02)
    try:
        assert (await client.request("ping"))["ok"] is True
    finally:
        await client.aclose()
    return process, control


async def test_a_team_runs_on_forked_nodes_and_leaves_nothing(tmp_path: Path) -> None:
    pids: list[int] = []
    async with open_team(agents=AGENTS, central=False,
                         hosts={a: (None, "127.0.0.1") for a in AGENTS}, workdir=tmp_path,
                         campaign_seed=5, connection="reuse", policy="planfence") as team:
        assert team._spawner is not None
        zygote = team._spawner.pid
        assert _ppid(zygote) == os.getpid()
        for agent in AGENTS:
            pid = team.pid(agent)
            assert pid is not None
            assert _ppid(pid) == zygote  # forked by the team's zygote, not started here
            pids.append(pid)
        assert len(await team.each_call("ping")) == len(AGENTS)
        await team.reset_all(episode="e1")  # an episode's reset works on forked nodes
    for pid in [*pids, zygote]:
        assert not is_running(pid, None)
    assert "control socket ready" in (tmp_path / "logs" / "a0.log").read_text()


async def test_exit_codes_are_reported_as_subprocess_reports_them(tmp_path: Path) -> None:
    async with open_spawner(_env(), tmp_path / "zygote.log") as spawner:
        # bad arguments: the node's own argparse error goes to its log, exit status 2
        bad = await spawner.spawn(["--log-level", "loud"], tmp_path / "bad.log", _env())
        with trio.fail_after(60):
            assert await bad.wait() == 2
        assert "--log-level" in (tmp_path / "bad.log").read_text()
        sock_dir = tempfile.mkdtemp(prefix="tb-zy-")  # short: a socket path is < 108 bytes
        try:
            node, _ = await _node(spawner, sock_dir, tmp_path / "n.log")
            node.kill()
            with trio.fail_after(60):
                assert await node.wait() == -signal.SIGKILL
        finally:
            shutil.rmtree(sock_dir, ignore_errors=True)


@pytest.mark.slow
async def test_a_killed_zygote_takes_its_nodes_with_it(tmp_path: Path) -> None:
    sock_dir = tempfile.mkdtemp(prefix="tb-zy-")
    try:
        async with open_spawner(_env(), tmp_path / "zygote.log") as spawner:
            node, _ = await _node(spawner, sock_dir, tmp_path / "n.log")
            os.kill(spawner.pid, signal.SIGKILL)
            with trio.fail_after(60):  # the node sees its parent gone and stops
                assert await node.wait() == UNKNOWN_EXIT  # nobody left to report it
            assert not is_running(node.pid, None)
            assert "parent process" in (tmp_path / "n.log").read_text()
            with pytest.raises(SpawnError, match="zygote is gone"):
                await spawner.spawn(["--control", "x"], tmp_path / "late.log", _env())
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


async def _stdout_of(pid: int, zygote_log: Path) -> str:
    """Where PID's stdout points once the forked child has redirected it."""
    with trio.fail_after(60):
        while (target := os.readlink(f"/proc/{pid}/fd/1")) == str(zygote_log):
            await trio.sleep(0.01)
    return target


def _children_of(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if _ppid(int(entry.name)) == pid:
                    found.add(int(entry.name))
            except (OSError, IndexError):
                pass  # gone meanwhile
    return found


async def test_requests_are_pipelined_and_each_gets_the_node_of_its_own_request(
        tmp_path: Path) -> None:
    """Spawns overlap (node_spawner rule 2): every caller gets the node of its own request
    (the node's stdout is the log that request named)."""
    sock_dir = tempfile.mkdtemp(prefix="tb-zy-")
    try:
        async with open_spawner(_env(), tmp_path / "zygote.log") as spawner:
            got: dict[int, ForkedProcess] = {}

            async def one(i: int) -> None:
                got[i] = await spawner.spawn(
                    ["--control", os.path.join(sock_dir, f"n{i}.sock"),
                     "--parent-pid", str(spawner.pid)], tmp_path / f"n{i}.log", _env())

            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(one, i)
            for i, process in got.items():
                assert await _stdout_of(process.pid, tmp_path / "zygote.log") == str(
                    tmp_path / f"n{i}.log")
            last = await spawner.spawn(
                ["--control", os.path.join(sock_dir, "last.sock"),
                 "--parent-pid", str(spawner.pid)], tmp_path / "last.log", _env())
            assert await _stdout_of(last.pid, tmp_path / "zygote.log") == str(
                tmp_path / "last.log")
            expected = {last.pid, *(p.pid for p in got.values())}
            assert _children_of(spawner.pid) == expected
            for process in [last, *got.values()]:
                process.kill()
                with trio.fail_after(60):
                    assert await process.wait() == -signal.SIGKILL
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


async def test_an_answer_whose_caller_was_cancelled_is_not_given_to_the_next_and_is_killed(
        ) -> None:
    """The test plays the zygote's side of the socket, to answer in a chosen order: the
    first caller is cancelled after its request was sent; its answer (a real process)
    must be killed, not handed to the second caller."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    orphan = await trio.lowlevel.open_process([sys.executable, "-c", "import time; time.sleep(60)"])
    other = await trio.lowlevel.open_process([sys.executable, "-c", "import time; time.sleep(60)"])
    zygote = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))
    try:
        async with trio.open_nursery() as nursery:
            spawner = NodeSpawner(trio.SocketStream(trio.socket.from_stdlib_socket(ours)),
                                  nursery, _env())
            nursery.start_soon(spawner.read_replies)
            first = trio.CancelScope()
            got: list[ForkedProcess] = []

            async def ask_first() -> None:
                with first:
                    await spawner.spawn(["first"], Path("/dev/null"), {})

            async def ask_second() -> None:
                got.append(await spawner.spawn(["second"], Path("/dev/null"), {}))

            nursery.start_soon(ask_first)
            requests: list[dict[str, object]] = []
            pending = b""
            with trio.fail_after(30):
                while not requests:
                    found, pending = decode(pending + await zygote.receive_some(65536))
                    requests += found
                nursery.start_soon(ask_second)
                while len(requests) < 2:
                    found, pending = decode(pending + await zygote.receive_some(65536))
                    requests += found
            assert [r["argv"] for r in requests] == [["first"], ["second"]]
            first.cancel()
            await trio.testing.wait_all_tasks_blocked()
            await zygote.send_all(encode({"pid": orphan.pid}) + encode({"pid": other.pid}))
            with trio.fail_after(30):
                assert await orphan.wait() == -signal.SIGKILL  # nobody's: killed
                while not got:
                    await trio.sleep(0.01)
            assert got[0].pid == other.pid
            await zygote.send_all(encode({"exit": orphan.pid, "code": -signal.SIGKILL}))
            await zygote.aclose()  # the zygote is gone: a new request fails plainly
            with pytest.raises(SpawnError, match="zygote is gone"):
                await spawner.spawn(["third"], Path("/dev/null"), {})
            nursery.cancel_scope.cancel()
    finally:
        for process in (orphan, other):
            if process.returncode is None:
                process.kill()
            await process.wait()


async def _team_zygote(tmp_path: Path, name: str) -> tuple[int, list[int]]:
    """Open a team, check it answers, and return its zygote and node pids."""
    async with open_team(agents=AGENTS, central=False,
                         hosts={a: (None, "127.0.0.1") for a in AGENTS},
                         workdir=tmp_path / name, campaign_seed=5, connection="reuse",
                         policy="planfence") as team:
        assert team._spawner is not None
        assert len(await team.each_call("ping")) == len(AGENTS)
        pids = [team.pid(a) or 0 for a in AGENTS]
        assert all(_ppid(pid) == team._spawner.pid for pid in pids)
        return team._spawner.pid, pids


async def test_teams_inside_one_zygote_for_all_share_it_and_a_dead_one_is_replaced(
        tmp_path: Path) -> None:
    async with one_zygote_for_all(tmp_path / "zygote.log"):
        first, nodes_1 = await _team_zygote(tmp_path, "t1")
        results: list[tuple[int, list[int]]] = []
        async with trio.open_nursery() as lanes:  # lanes started inside see it too
            for name in ("t2", "t3"):
                lanes.start_soon(lambda n=name: _collect(results, tmp_path, n))
        assert {zygote for zygote, _ in results} == {first}
        assert is_running(first, None)  # it outlives the teams it served
        for pid in nodes_1 + [p for _, pids in results for p in pids]:
            assert not is_running(pid, None)  # each team's nodes ended with the team
        os.kill(first, signal.SIGKILL)
        with trio.fail_after(30):
            while is_running(first, None):
                await trio.sleep(0.02)
        replaced, _ = await _team_zygote(tmp_path, "t4")  # a zygote of its own
        assert replaced != first
        assert not is_running(replaced, None)
    outside, _ = await _team_zygote(tmp_path, "t5")
    assert outside not in (first, replaced)


async def _collect(results: list[tuple[int, list[int]]], tmp_path: Path, name: str) -> None:
    results.append(await _team_zygote(tmp_path, name))


def test_the_start_mode_is_fork_unless_asked_and_checked() -> None:
    assert node_start_mode({}) == "fork"
    assert node_start_mode({ENV_NODE_START: "exec"}) == "exec"
    with pytest.raises(ValueError, match=f"{ENV_NODE_START}: 'spawn'; allowed: fork, exec"):
        node_start_mode({ENV_NODE_START: "spawn"})


async def test_exec_mode_starts_each_node_as_its_own_interpreter(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_NODE_START, "exec")
    async with open_team(agents=AGENTS[:2], central=False,
                         hosts={a: (None, "127.0.0.1") for a in AGENTS[:2]},
                         workdir=tmp_path, campaign_seed=5, connection="reuse",
                         policy="planfence") as team:
        assert team._spawner is None
        for agent in AGENTS[:2]:
            pid = team.pid(agent)
            assert pid is not None
            assert _ppid(pid) == os.getpid()
            argv = _argv(pid)
            assert argv[:3] == [sys.executable.encode(), b"-m", b"nodes"]



@pytest.mark.slow
async def test_a_report_before_the_pidfd_wakes_its_watcher_and_frees_the_number() -> None:
    """The zygote's report can come before the pidfd is readable: closing the pidfd
    then must end its watcher, and the next pidfd, which reuses the number, must be
    waitable (else trio still holds the old waiter on it: BusyResourceError)."""
    sleeper = await trio.lowlevel.open_process(["sleep", "60"])
    try:
        first = ForkedProcess(sleeper.pid)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.watch)
            await trio.sleep(0.05)  # the watcher waits on the pidfd
            first._set(0)  # the report: the process is still running
            with trio.fail_after(10):
                await first.wait()
            second = ForkedProcess(sleeper.pid)  # the freed number, most likely
            nursery.start_soon(second.watch)
            await trio.sleep(0.05)
            sleeper.kill()
            with trio.fail_after(30):
                assert await second.wait() == UNKNOWN_EXIT  # no zygote reports it
    finally:
        sleeper.kill()
        await sleeper.wait()
