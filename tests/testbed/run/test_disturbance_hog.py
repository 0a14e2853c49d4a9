"""A CPU hog beside a team marks its episodes disturbed; without it they are not.

Real node processes on loopback, the real measurement (each node's schedstat run-queue
wait and timer oversleep) and the real verdict (testbed/run/disturbance.py). The host
is shared, so the test controls the contention it compares instead of hoping for a
quiet machine: the team's node processes (every thread) run at a round-robin real-time
priority in both arms, which keeps other users' normal work from delaying them; the hog
arm pins them to one CPU and adds a busy process of that same priority on it, which the
kernel must share the CPU with. The controller (this process) is kept off that CPU and
at a lower real-time priority during the hog arm: otherwise every other task on the host
crowds onto the remaining CPUs with it, and on a busy host its own pings to the nodes
went unanswered for 4.5 s (a hog-arm failure in CI beside a campaign). The margins are
wide: the verdict's threshold is 5% of stall (at least 0.5 ms per action); the hog arm
waits for the CPU several times longer than it runs. The quiet arm is a reference, not
a claim that the host is quiet: it may itself be flagged (steal, other load). Needs root and two CPUs; the hog
runs for a few seconds and is stopped by pid.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from testbed.campaign.model import Campaign, Cell
from testbed.campaign.parse import parse_campaign
from testbed.run.contract import EpisodeResult
from testbed.run.episode import EpisodeRunner
from testbed.run.team import Team

HOGS = 1
EPISODES_PER_ARM = 2
RT_PRIORITY = 10
CAMPAIGN = {
    "name": "hog", "seed": 9, "templates": 1,
    "options": {"episode_timeout_s": 300},
    "grid": {"policy": ["planfence"], "network": ["loopback"], "agents": [3], "keys": [6],
             "units": [16], "rho": [4]},
}

CONTROLLER_RT_PRIORITY = 5
#: A busy loop that dies with the test process (PR_SET_PDEATHSIG = 1), so a test run
#: killed mid-arm leaves no real-time hog on the host (one did, 2026-12-02).
HOG_CODE = ("import ctypes, signal; ctypes.CDLL(None).prctl(1, signal.SIGKILL)\n"
            "while True: pass")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not hasattr(os, "sched_setaffinity")
    or len(os.sched_getaffinity(0)) < 2,
    reason="needs root (real-time priority), CPU affinity and two CPUs")


def _threads(pid: int) -> list[int]:
    return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]


def _pin(pid: int, cpus: set[int], priority: int = RT_PRIORITY) -> None:
    """Every thread of ``pid`` on ``cpus`` with round-robin real-time priority."""
    for tid in _threads(pid):
        os.sched_setaffinity(tid, cpus)
        os.sched_setscheduler(tid, os.SCHED_RR, os.sched_param(priority))


@contextmanager
def _controller_off(cpu: int) -> Iterator[None]:
    """This process (the controller) off ``cpu``, at a real-time priority below the
    nodes'; as it was afterwards."""
    me = os.getpid()
    before = {tid: (os.sched_getaffinity(tid), os.sched_getscheduler(tid),
                    os.sched_getparam(tid)) for tid in _threads(me)}
    try:
        _pin(me, set(os.sched_getaffinity(0)) - {cpu}, CONTROLLER_RT_PRIORITY)
        yield
    finally:
        for tid in _threads(me):
            cpus, policy, param = before.get(tid, (
                set().union(*(b[0] for b in before.values())), os.SCHED_OTHER,
                os.sched_param(0)))
            os.sched_setscheduler(tid, policy, param)
            os.sched_setaffinity(tid, cpus)


def _team(group: Any) -> Team:
    team: Team = group.team
    return team


@contextmanager
def _hogs(cpu: int) -> Iterator[list[int]]:
    procs = [subprocess.Popen([sys.executable, "-c", HOG_CODE],
                              stdin=subprocess.DEVNULL) for _ in range(HOGS)]
    try:
        for proc in procs:
            _pin(proc.pid, {cpu})
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@pytest.mark.slow
async def test_a_cpu_hog_on_the_nodes_cpu_marks_episodes_disturbed(tmp_path: Path) -> None:
    campaign = parse_campaign(CAMPAIGN)
    cell, template = campaign.episodes()[0]
    cpus = set(os.sched_getaffinity(0))
    cpu = max(cpus)
    # The stores live in memory: a node's loop waits on its store's fsyncs, and with the
    # hog holding the CPU the kernel's block workers need, one fsync outlasted the 4.5 s
    # heartbeat on a busy host (nodes seen in submit_bio_wait). The subject is run-queue
    # wait, not the host's disk.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path)  # noqa: ASYNC240
    with tempfile.TemporaryDirectory(prefix="hog-", dir=shm) as stores:
        await _compare(campaign, cell, template, cpus, cpu, Path(stores))


async def _compare(campaign: Campaign, cell: Cell, template: str, cpus: set[int], cpu: int,
                   stores: Path) -> None:
    runner = EpisodeRunner(campaign, workdir_root=stores)
    quiet: list[EpisodeResult] = []
    hogged: list[EpisodeResult] = []
    async with runner.open_group(cell.group_key, [cell]) as group:
        team = _team(group)
        pids = [team.pid(agent) for agent in team.members]
        for pid in pids:
            assert pid is not None
            _pin(pid, cpus)
        schedule = campaign.schedule(cell, template)
        await group.run_episode(cell, schedule)  # warm-up: imports, first connections
        for _ in range(EPISODES_PER_ARM):
            quiet.append(await group.run_episode(cell, schedule))
        for pid in pids:
            assert pid is not None
            _pin(pid, {cpu})  # the hog arm: the nodes and the hogs share one CPU
        with _controller_off(cpu), _hogs(cpu):
            for _ in range(EPISODES_PER_ARM):
                hogged.append(await group.run_episode(cell, schedule))

    def runq_per_action(result: EpisodeResult) -> float:
        return float(result.episode["node_runq_wait_ms"]) / len(result.actions)

    def wait_share(result: EpisodeResult) -> float:
        wait = float(result.episode["node_runq_wait_ms"])
        return wait / (wait + float(result.episode["node_cpu_ms"]))

    report = [(r.episode["disturbed"], round(runq_per_action(r), 2), round(wait_share(r), 3),
               round(r.episode["stall_ms_per_action"], 2), r.episode["disturbed_reason"])
              for r in quiet + hogged]
    print("disturbed, runq ms/action, wait share, stall ms/action, reason:", *report, sep="\n")
    assert all(r.episode["disturbed"] for r in hogged), report
    assert all("runq_wait" in r.episode["disturbed_reason"] for r in hogged), report
    # The quiet arm is compared, not required to be clean: it may be disturbed by what no
    # test controls, and the verdict rightly says so. This machine is itself a guest; in
    # CI 41 its hypervisor stole 37-39% of the CPU during the quiet arm, and the quiet
    # episodes waited 6.5 ms per action in the run queue (12% of runnable time), over the
    # verdict's threshold, against 2,500 ms (98%) with the hog. What the hog must cause is
    # a wait that dominates the nodes' runnable time and dwarfs the quiet arm's.
    assert all(wait_share(r) > 0.5 for r in hogged), report
    assert min(runq_per_action(r) for r in hogged) > 10 * max(
        runq_per_action(r) for r in quiet), report
