"""The shared emulator: one process serving several live topologies (lanes) at once."""

from __future__ import annotations

import os

import pytest
import trio

from testbed.host import processes
from testbed.links.profiles import get_profile
from testbed.links.userspace import UserspaceLinks
from testbed.net.topology import open_topology
from testbed.tools.echo_probe import open_echo_server, timed_exchanges
from tests.leftovers import watch_runs


def _privileged() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    if not os.path.exists("/dev/net/tun"):
        pytest.skip("needs /dev/net/tun")


@pytest.mark.privileged
async def test_topologies_share_one_emulator_with_their_own_links_and_counters() -> None:
    _privileged()
    delays = {"slow": 20.0, "fast": 5.0}
    pids: dict[str, int] = {}
    rtts: dict[str, list[float]] = {}
    counters: dict[str, dict[str, dict[str, int]]] = {}
    opened = trio.Event()
    gate: dict[str, int] = {"open": 0}

    async def lane(name: str) -> None:
        profile = get_profile("fixed", delay_ms=delays[name])
        async with open_topology(profile, ["a", "b"], backend="userspace",
                                 shared_emulator=True) as topo:
            assert isinstance(topo.links, UserspaceLinks)
            pids[name] = topo.links.emulator.process.pid
            gate["open"] += 1
            if gate["open"] == len(delays):
                opened.set()
            await opened.wait()  # both topologies live at once
            a, b = topo.hosts["a"], topo.hosts["b"]
            async with open_echo_server(b):
                _, rtts[name] = await timed_exchanges(a, b, 200, 200, count=5, fresh=False)
            counters[name] = await topo.link_counters()

    with watch_runs() as runs:
        async with trio.open_nursery() as nursery:
            for name in delays:
                nursery.start_soon(lane, name)
    assert pids["slow"] == pids["fast"], "each topology started an emulator of its own"
    # physics per group: four crossings of each topology's own delay
    assert min(rtts["slow"]) >= 80.0
    assert sorted(rtts["slow"])[2] < 80.0 + 25.0
    assert min(rtts["fast"]) >= 20.0
    assert sorted(rtts["fast"])[2] < 20.0 + 25.0
    # each group counts only its own hosts' packets
    for name in delays:
        assert set(counters[name]) == {"a", "b"}
        assert counters[name]["a"]["up_packets"] > 0
    # the last topology to close stopped the shared process, and nothing is left
    deadline = trio.current_time() + 5
    while processes.process_start_ticks(pids["slow"]) is not None \
            and trio.current_time() < deadline:
        await trio.sleep(0.1)
    assert processes.process_start_ticks(pids["slow"]) is None
    assert len(runs.prefixes) >= 2, "the watch did not see the topologies' ledgers"
    assert runs.leftovers() == set()


@pytest.mark.privileged
async def test_a_second_lane_after_the_first_closed_gets_a_working_emulator() -> None:
    _privileged()
    seen = []
    for _ in range(2):
        async with open_topology(get_profile("fixed", delay_ms=5.0), ["a", "b"],
                                 backend="userspace", shared_emulator=True) as topo:
            assert isinstance(topo.links, UserspaceLinks)
            seen.append(topo.links.emulator.process.pid)
            a, b = topo.hosts["a"], topo.hosts["b"]
            async with open_echo_server(b):
                _, ms = await timed_exchanges(a, b, 200, 200, count=3, fresh=False)
            assert min(ms) >= 20.0
    assert len(seen) == 2
